// Test-only plugin claiming ABI version 99: the registry must refuse it before
// calling anything else.
#include "tessera/plugin_abi.h"

namespace {
int32_t probe(char*, size_t) { return 100; }
void* create(const TesseraCreateArgs*, char*, size_t) { return nullptr; }
void destroy(void*) {}
const TesseraPluginDescriptor kDescriptor = {
    99u, sizeof(TesseraPluginDescriptor), "test_badabi", TESSERA_PLUGIN_BACKEND,
    "test-only: built for another ABI", probe, create, destroy,
};
}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
