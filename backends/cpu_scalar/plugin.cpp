// Plugin entry of the cpu_scalar backend: plain portable code, usable everywhere.
#include <cstdio>
#include <exception>

#include "cpu_scalar_backend.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"

namespace {

int32_t probe(char* reason, size_t reason_size) {
  if (reason && reason_size) std::snprintf(reason, reason_size, "portable scalar reference, runs anywhere");
  return TESSERA_SCORE_PORTABLE;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_backend("cpu_scalar", args, error, error_size,
                                        [&](tessera::PoolRef pool, const TesseraCreateArgs* args)
                                            -> std::unique_ptr<tessera::Backend> {
      return tessera::cpu_scalar::make_backend(pool);
  });
}

const TesseraPluginDescriptor kDescriptor =
    tessera::glue::backend_descriptor("cpu_scalar", "reference backend: every op in plain C++ (the oracle)", &probe,
                                      &create, TESSERA_PLUGIN_REFERENCE);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
