// Test-only ABI-3 plugins whose descriptor or function table the registry must refuse,
// one way each (NOTABLE_MODE), with the reason naming what is missing:
//   1  a backend whose `backend` is NULL
//   2  a backend whose descriptor's struct_size ends at `destroy`: `backend` is not
//      covered (the pointer behind it is valid and must not be read)
//   3  a loader whose `loader` is NULL
//   4  a backend table whose struct_size ends after `supports` (no `execute`)
//   5  a backend table whose `supports` is NULL
//   6  a descriptor whose struct_size does not even cover `destroy`
//   7  a loader table whose struct_size ends before its last required function
// The host refuses each before it probes it (the record keeps score 0); the probe,
// if it ran in the host, would make the plugin usable.
#include <cstddef>

#include "test_plugin_util.h"

#ifndef NOTABLE_MODE
#define NOTABLE_MODE 1
#endif
#ifndef NOTABLE_NAME
#define NOTABLE_NAME "test_notable"
#endif

namespace {

using test_plugin::kStubBackendApi;
using test_plugin::put;

int32_t probe(char* reason, size_t size) {
  put(reason, size, "probed although the descriptor should have been refused");
  return 7;
}
void* create(const TesseraCreateArgs*, char* error, size_t size) {
  put(error, size, "must not be called");
  return nullptr;
}
void destroy(void*) {}

#if NOTABLE_MODE == 4
const TesseraBackendApi kTable = {
    offsetof(TesseraBackendApi, supports) + sizeof(TesseraBackendApi::supports),
    test_plugin::stub_uses_host_memory, test_plugin::stub_supports, test_plugin::stub_execute, nullptr, nullptr,
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
};
#elif NOTABLE_MODE == 5
const TesseraBackendApi kTable = {
    sizeof(TesseraBackendApi), test_plugin::stub_uses_host_memory, nullptr, test_plugin::stub_execute, nullptr, nullptr,
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
};
#elif NOTABLE_MODE == 7
// Every loader function present in storage, but struct_size stops before origin_get.
int32_t recognizes(void*, const char*) { return 0; }
TesseraModel* open_model(void*, const char*, char* error, size_t size) {
  put(error, size, "must not be called");
  return nullptr;
}
void close_model(TesseraModel*) {}
const char* text(const TesseraModel*) { return ""; }
uint64_t file_size(const TesseraModel*) { return 0; }
size_t count_view(const TesseraModel*, uint32_t) { return 0; }
int32_t meta_get(const TesseraModel*, uint32_t, size_t, const uint64_t*, size_t, const char**, TesseraMetaValue*) {
  return -1;
}
int32_t tensor_get(const TesseraModel*, uint32_t, size_t, TesseraTensorInfo*) { return -1; }
int32_t describe(TesseraModel*, char* error, size_t size) {
  put(error, size, "must not be called");
  return -1;
}
size_t origin_count(const TesseraModel*) { return 0; }
int32_t origin_get(const TesseraModel*, size_t, const char**, const char**) { return -1; }
const TesseraLoaderApi kLoaderTable = {
    offsetof(TesseraLoaderApi, origin_get),
    recognizes, open_model, close_model, text, text, file_size, count_view, meta_get, count_view, tensor_get,
    describe, text, text, origin_count, origin_get,
};
#endif

#if NOTABLE_MODE == 3 || NOTABLE_MODE == 7
constexpr uint32_t kKind = TESSERA_PLUGIN_LOADER;
#else
constexpr uint32_t kKind = TESSERA_PLUGIN_BACKEND;
#endif

#if NOTABLE_MODE == 1 || NOTABLE_MODE == 3
constexpr const TesseraBackendApi* kBackend = nullptr;
#elif NOTABLE_MODE == 4 || NOTABLE_MODE == 5
constexpr const TesseraBackendApi* kBackend = &kTable;
#elif NOTABLE_MODE == 7
constexpr const TesseraBackendApi* kBackend = nullptr;
#else
constexpr const TesseraBackendApi* kBackend = &kStubBackendApi;
#endif

#if NOTABLE_MODE == 7
constexpr const TesseraLoaderApi* kLoader = &kLoaderTable;
#else
constexpr const TesseraLoaderApi* kLoader = nullptr;
#endif

#if NOTABLE_MODE == 2
constexpr uint32_t kSize = offsetof(TesseraPluginDescriptor, destroy) + sizeof(TesseraPluginDescriptor::destroy);
#elif NOTABLE_MODE == 6
constexpr uint32_t kSize = offsetof(TesseraPluginDescriptor, destroy);
#else
constexpr uint32_t kSize = sizeof(TesseraPluginDescriptor);
#endif

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, kSize, NOTABLE_NAME, kKind, "test-only: refused for its descriptor or table",
    probe, create, destroy, kBackend, kLoader,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
