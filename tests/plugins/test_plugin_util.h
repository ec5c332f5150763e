// Shared by the test-only plugins: they speak the C ABI (tessera/plugin_abi.h) alone,
// like an outside plugin, and link no tessera library.
#pragma once
#include <cstdio>
#include <initializer_list>

#include "tessera/plugin_abi.h"

namespace test_plugin {

inline void put(char* buf, size_t size, const char* text) {
  if (buf && size) std::snprintf(buf, size, "%s", text);
}

// Dense F32: nb[] are the strides of a contiguous tensor.
inline bool dense_f32(const TesseraTensor& t) {
  if (t.type != TESSERA_DTYPE_F32 || t.nb[0] != sizeof(float)) return false;
  for (int d = 1; d < 4; ++d)
    if (t.nb[d] != t.nb[d - 1] * size_t(t.ne[d - 1])) return false;
  return true;
}
inline long long nelements(const TesseraTensor& t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

// Runs nodes [first, first + count) of Add or Mul over dense F32 operands of one size
// (what the test plugins' supports() accepted).
inline void run_add_mul(TesseraGraph* g, size_t first, size_t count) {
  for (size_t k = first; k < first + count; ++k) {
    const TesseraNode& n = g->nodes[k];
    const float* a = static_cast<const float*>(g->tensors[n.src[0]].data);
    const float* b = static_cast<const float*>(g->tensors[n.src[1]].data);
    float* d = static_cast<float*>(g->tensors[n.dst].data);
    const long long ne = nelements(g->tensors[n.dst]);
    for (long long i = 0; i < ne; ++i) d[i] = n.op == TESSERA_OP_ADD ? a[i] + b[i] : a[i] * b[i];
  }
}

// A complete backend table for plugins whose instances are never created (their probe
// refuses, misbehaves, or the test is about the descriptor): present, so that the
// registry gets past the table checks, and inert.
inline int32_t stub_uses_host_memory(void*) { return 1; }
inline int32_t stub_supports(void*, const TesseraGraph*, size_t, char* reason, size_t size) {
  put(reason, size, "stub");
  return 0;
}
inline int32_t stub_execute(void*, TesseraGraph*, size_t, size_t, uint32_t, char* error, size_t size) {
  put(error, size, "stub");
  return -1;
}
inline const TesseraBackendApi kStubBackendApi = {
    sizeof(TesseraBackendApi), stub_uses_host_memory, stub_supports, stub_execute, nullptr, nullptr, nullptr,
    nullptr, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace test_plugin
