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
      if (!tessera::cpu_avx512::usable(&why)) {
        throw tessera::Error("not usable on this CPU: " + why);
      }
      // Options (plugins.toml [backend.cpu_avx512] options): `repack` "false"/"0"/"no"
      // turns off the interleaved copy of quantized weights (and the huge-page copy of
      // the other matrices); `decode_tiles` "1", "2" or
      // "4" sets how many repacked Q4_0/Q8_0 tiles a one-token product walks side by side;
      // `decode_prefetch` "true"/"false" turns software prefetch of the weight stream in
      // one-token products on or off (defaults: make_backend's choice for this CPU).
      bool repack = true;
      int decode_tiles = 0, decode_prefetch = -1;
      if (args && args->struct_size >= offsetof(TesseraCreateArgs, option_count) + sizeof(args->option_count))
        for (size_t i = 0; i < args->option_count; ++i) {
          const TesseraOption& o = args->options[i];
          if (!o.key || !o.value) continue;
          const std::string k = o.key, v = o.value;
          if (k == "repack") repack = !(v == "false" || v == "0" || v == "no" || v == "off");
          if (k == "decode_tiles") {
            if (v != "1" && v != "2" && v != "4")
              throw tessera::Error("option decode_tiles must be 1, 2 or 4, not '" + v + "'");
            decode_tiles = std::stoi(v);
          }
          if (k == "decode_prefetch") {
            if (v == "true" || v == "1" || v == "yes" || v == "on") decode_prefetch = 1;
            else if (v == "false" || v == "0" || v == "no" || v == "off") decode_prefetch = 0;
            else throw tessera::Error("option decode_prefetch must be true or false, not '" + v + "'");
          }
        }
      return tessera::cpu_avx512::make_backend(pool, repack, decode_tiles, decode_prefetch);
  });
}

void destroy(void* instance) { tessera::glue::destroy_backend(instance); }

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION,
    sizeof(TesseraPluginDescriptor),
    "cpu_avx512",
    TESSERA_PLUGIN_BACKEND,
    "AVX-512 VNNI/BF16 kernels: in-register dequantization, integer dot products",
    &probe,
    &create,
    &destroy,
    &tessera::glue::kBackendApi,
    nullptr,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
