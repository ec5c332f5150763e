// Test-only plugins that misbehave, one way each (HOSTILE_MODE): the probe throws (1),
// crashes (2) or never returns (3), or loading the file aborts in a static
// initializer (4). The registry must refuse each with its reason and go on. Mode 1
// breaks the ABI's rule on purpose: an exception leaves probe().
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "test_plugin_util.h"

namespace {
#if HOSTILE_MODE == 4
struct AbortOnLoad {
  AbortOnLoad() { std::abort(); }
} abort_on_load;
#endif

[[maybe_unused]] volatile int* volatile g_null = nullptr;  // read by the crashing mode only

int32_t probe(char*, size_t) {
#if HOSTILE_MODE == 1
  throw std::runtime_error("boom");
#elif HOSTILE_MODE == 2
  return *g_null;
#elif HOSTILE_MODE == 3
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
#endif
  return 1;
}
void* create(const TesseraCreateArgs*, char* error, size_t size) {
  std::snprintf(error, size, "must not be called");
  return nullptr;
}
void destroy(void*) {}
const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, sizeof(TesseraPluginDescriptor), HOSTILE_NAME, TESSERA_PLUGIN_BACKEND,
    "test-only: misbehaves", probe, create, destroy, &test_plugin::kStubBackendApi, nullptr,
};
}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
