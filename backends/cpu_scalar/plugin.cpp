// Plugin entry of the cpu_scalar backend: plain portable code, usable everywhere.
#include <cstdio>
#include <exception>

#include "cpu_scalar_backend.h"
#include "tessera/fast_pool.h"
#include "tessera/plugin_abi.h"

namespace {

int32_t probe(char* reason, size_t reason_size) {
  if (reason && reason_size) std::snprintf(reason, reason_size, "portable scalar reference, runs anywhere");
  return TESSERA_SCORE_PORTABLE;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  try {
    tessera::FastPool* pool = nullptr;
    // The pool field is only read when the host's struct is large enough to hold it.
    // Options ("threads" etc.) are handled by the pool owner; unknown ones are ignored.
    if (args && args->struct_size >= offsetof(TesseraCreateArgs, pool) + sizeof(args->pool))
      pool = static_cast<tessera::FastPool*>(args->pool);
    return static_cast<tessera::Backend*>(tessera::cpu_scalar::make_backend(pool).release());
  } catch (const std::exception& e) {
    if (error && error_size) std::snprintf(error, error_size, "cpu_scalar: %s", e.what());
  } catch (...) {
    if (error && error_size) std::snprintf(error, error_size, "cpu_scalar: unknown error");
  }
  return nullptr;
}

void destroy(void* instance) { delete static_cast<tessera::Backend*>(instance); }

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION,
    sizeof(TesseraPluginDescriptor),
    "cpu_scalar",
    TESSERA_PLUGIN_BACKEND,
    "reference backend: every op in plain C++ (the oracle)",
    &probe,
    &create,
    &destroy,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
