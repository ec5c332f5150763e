// Test-only ABI-3 backend built "before" the optional functions were appended: its
// TesseraBackendApi's struct_size ends right after `execute` (no prepare_weight, no
// weight_bytes), and its descriptor's struct_size ends right after `backend` (no
// `loader`). The host must load and use it and must call nothing its struct_size does
// not cover. To show a violation, the storage past struct_size holds traps that fail
// loudly: prepare_weight refuses with an error, weight_bytes claims one bogus byte.
//
// It runs Add and Mul on contiguous F32 tensors of one shape.
#include <cstddef>
#include <new>

#include "test_plugin_util.h"

namespace {

using test_plugin::dense_f32;
using test_plugin::nelements;
using test_plugin::put;

struct Instance {
  int unused = 0;
};

int32_t probe(char* reason, size_t size) {
  put(reason, size, "an older plugin without the optional backend functions");
  return 4;
}
void* create(const TesseraCreateArgs*, char*, size_t) { return new (std::nothrow) Instance(); }
void destroy(void* self) { delete static_cast<Instance*>(self); }

int32_t uses_host_memory(void*) { return 1; }

int32_t supports(void*, const TesseraGraph* g, size_t node, char* reason, size_t size) {
  const TesseraNode& n = g->nodes[node];
  if (n.op != TESSERA_OP_ADD && n.op != TESSERA_OP_MUL) {
    put(reason, size, "only add and mul");
    return 0;
  }
  for (int32_t t : {n.dst, n.src[0], n.src[1]})
    if (!dense_f32(g->tensors[t]) || nelements(g->tensors[t]) != nelements(g->tensors[n.dst])) {
      put(reason, size, "only contiguous f32 operands of one size");
      return 0;
    }
  return 1;
}

int32_t execute(void*, TesseraGraph* g, size_t first, size_t count, uint32_t, char*, size_t) {
  test_plugin::run_add_mul(g, first, count);
  return 0;
}

// Traps: beyond struct_size, never to be called.
int32_t trap_prepare_weight(void*, TesseraTensor*, char* error, size_t size) {
  put(error, size, "test_short_table: prepare_weight called although the table's struct_size excludes it");
  return -1;
}
int32_t trap_weight_bytes(void*, const TesseraTensor*, const void** data, size_t* bytes) {
  static const char bogus = 0;
  *data = &bogus;
  *bytes = 1;
  return 0;
}

// Those of ABI 4: a host that called them would see transfers it never made, or have
// its KV pages handed to a table that does not declare buffers.
int32_t trap_transfers(void*, uint64_t* up, uint64_t* down) {
  *up = *down = 12345;
  return 0;
}
void* trap_buffer_alloc(void*, uint32_t, size_t, void** host, char* error, size_t size) {
  *host = nullptr;
  put(error, size, "test_short_table: buffer_alloc called although the table's struct_size excludes it");
  return nullptr;
}
void trap_buffer_free(void*, void*) {}
int32_t trap_buffer_io(void*, void*, size_t, const void*, size_t, char* error, size_t size) {
  put(error, size, "test_short_table: buffer_set called although the table's struct_size excludes it");
  return -1;
}
int32_t trap_buffer_get(void*, void*, size_t, void*, size_t, char* error, size_t size) {
  put(error, size, "test_short_table: buffer_get called although the table's struct_size excludes it");
  return -1;
}
int32_t trap_buffer_copy(void*, void*, size_t, size_t, size_t, char* error, size_t size) {
  put(error, size, "test_short_table: buffer_copy called although the table's struct_size excludes it");
  return -1;
}

int32_t trap_fusion_window(void*) { return 99; }  // out of range: refused, were it read

const TesseraBackendApi kApi = {
    offsetof(TesseraBackendApi, execute) + sizeof(TesseraBackendApi::execute),
    uses_host_memory, supports, execute, trap_prepare_weight, trap_weight_bytes, trap_transfers, trap_buffer_alloc,
    trap_buffer_free, trap_buffer_io, trap_buffer_get, trap_buffer_copy, trap_fusion_window,
};

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, offsetof(TesseraPluginDescriptor, backend) + sizeof(TesseraPluginDescriptor::backend),
    "test_short_table", TESSERA_PLUGIN_BACKEND, "test-only: a table without the optional functions",
    probe, create, destroy, &kApi, nullptr,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
