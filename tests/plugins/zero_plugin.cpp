// Test-only plugin whose probe finds this machine unsuitable.
#include <cstdio>

#include "test_plugin_util.h"

namespace {
int32_t probe(char* reason, size_t size) {
  std::snprintf(reason, size, "no frobnicator here");
  return 0;
}
void* create(const TesseraCreateArgs*, char* error, size_t size) {
  std::snprintf(error, size, "must not be called");
  return nullptr;
}
void destroy(void*) {}
const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, sizeof(TesseraPluginDescriptor), "test_zero", TESSERA_PLUGIN_BACKEND,
    "test-only: never usable", probe, create, destroy, &test_plugin::kStubBackendApi, nullptr,
};
}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
