// Test-only plugin claiming ABI version 99 (a future generation): the registry must
// refuse it before reading anything else of the descriptor.
#include "tessera/plugin_abi.h"

namespace {
int32_t probe(char*, size_t) { return 100; }
void* create(const TesseraCreateArgs*, char*, size_t) { return nullptr; }
void destroy(void*) {}
const TesseraPluginDescriptor kDescriptor = {
    99u, sizeof(TesseraPluginDescriptor), "test_badabi", TESSERA_PLUGIN_BACKEND,
    "test-only: built for another ABI", probe, create, destroy, nullptr, nullptr,
};
}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
