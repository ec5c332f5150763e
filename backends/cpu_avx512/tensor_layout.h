// Tensor layout checks the cpu_avx512 kernels and planner share: evenly spaced rows,
// equal shapes, flat F32 rows, and whether two tensors' bytes overlap.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/tensor.h"

namespace tessera::cpu_avx512 {

// Rows of t are evenly spaced (row r at data + r * nb[1]).
inline bool uniform_rows(const Tensor& t) {
  return t.nb[2] == t.nb[1] * size_t(t.ne[1]) && t.nb[3] == t.nb[2] * size_t(t.ne[2]);
}

inline bool same_shape(const Tensor& a, const Tensor& b) {
  for (int d = 0; d < Tensor::kMaxDims; ++d)
    if (a.ne[d] != b.ne[d]) return false;
  return true;
}

// Contiguous rows (the tensor is one flat array of ne[0] * nrows floats).
inline bool flat(const Tensor& t) { return uniform_rows(t) && t.nb[1] == size_t(t.ne[0]) * sizeof(float); }

// One past the last byte of an F32 tensor's last row.
inline const char* end_of(const Tensor& t) { return t.flat_row<char>(t.nrows() - 1) + t.ne[0] * int64_t(sizeof(float)); }

// F32 tensors a and b share bytes.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char *a0 = static_cast<const char*>(a.data), *b0 = static_cast<const char*>(b.data);
  return a0 < end_of(b) && b0 < end_of(a);
}

// F32 tensor a shares bytes with weight w (w's nbytes() from its data).
inline bool overlaps_bytes(const Tensor& a, const Tensor& w) {
  const char *a0 = static_cast<const char*>(a.data), *w0 = static_cast<const char*>(w.data);
  return a0 < w0 + w.nbytes() && w0 < end_of(a);
}

}  // namespace tessera::cpu_avx512
