// Test-only plugin of a previous ABI generation: the 8-field descriptor of ABI 1 and 2
// (V2_ABI_VERSION, default 2), whose create() returned a C++ tessera::Backend* that
// the host called directly. It declares its own copy of that descriptor (no tessera
// header: the current one no longer has it). The registry must refuse it, reading
// nothing past abi_version, with a reason that says to rebuild against the current SDK.
#include <cstddef>
#include <cstdint>
#include <cstdio>

#ifndef V2_ABI_VERSION
#define V2_ABI_VERSION 2u
#endif

namespace {

struct OldDescriptor {  // ABI 1 and 2
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
  uint32_t kind;  // 1 = backend
  const char* description;
  int32_t (*probe)(char* reason, size_t reason_size);
  void* (*create)(const void* args, char* error, size_t error_size);  // returned a tessera::Backend*
  void (*destroy)(void* instance);
};

int32_t probe(char* reason, size_t size) {
  std::snprintf(reason, size, "an old plugin's probe must never run");
  return 100;
}
void* create(const void*, char* error, size_t size) {
  std::snprintf(error, size, "an old plugin's create must never run");
  return nullptr;
}
void destroy(void*) {}

const OldDescriptor kDescriptor = {
    V2_ABI_VERSION, sizeof(OldDescriptor), "test_v2", 1, "test-only: built for ABI 2 (C++ objects)",
    probe, create, destroy,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const OldDescriptor* tessera_plugin_entry(void) {
  return &kDescriptor;
}
