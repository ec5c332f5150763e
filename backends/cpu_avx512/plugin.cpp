// Plugin entry of the cpu_avx512 backend. Compiled WITHOUT ISA flags: probe() and
// create() run on any x86-64 CPU; the AVX-512 kernels are only reached through a
// backend that create() made after checking the CPU and OS features.
#include <cstdio>
#include <exception>
#include <string>

#include "cpu_avx512_backend.h"
#include "tessera/error.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"

namespace {

int32_t probe(char* reason, size_t reason_size) {
  std::string why;
  const bool ok = tessera::cpu_avx512::usable(&why);
  if (reason && reason_size)
    std::snprintf(reason, reason_size, "%s",
                  ok ? "AVX-512 F/BW/VL/DQ/VNNI/BF16 usable (CPUID and XCR0)" : why.c_str());
  return ok ? TESSERA_SCORE_CPU_VECTOR : 0;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_backend("cpu_avx512", args, error, error_size,
                                        [&](tessera::PoolRef pool, const TesseraCreateArgs* args)
                                            -> std::unique_ptr<tessera::Backend> {
      std::string why;
      if (!tessera::cpu_avx512::usable(&why)) throw tessera::Error("not usable on this CPU: " + why);
      tessera::cpu_avx512::Options o;
      tessera::glue::for_each_option(args, [&](std::string_view k, std::string_view v) {
        tessera::cpu_avx512::take_option(o, k, v);
      });
      return tessera::cpu_avx512::make_backend(pool, o);
  });
}

const TesseraPluginDescriptor kDescriptor = tessera::glue::backend_descriptor(
    "cpu_avx512", "AVX-512 VNNI/BF16 kernels: in-register dequantization, integer dot products", &probe, &create);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
