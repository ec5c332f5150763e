// A Tensor is a typed, strided view of memory owned by a backend Buffer (or by a
// memory-mapped model file). Dimensions follow GGUF/ggml order: ne[0] is the
// contiguous (fastest) dimension, a "row" is ne[0] elements. Copying a Tensor copies
// the view, never the data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tessera/dtype.h"

namespace tessera {

class Buffer;

struct Tensor {
  static constexpr int kMaxDims = 4;

  DType type = DType::F32;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // elements per dimension
  size_t nb[kMaxDims] = {0, 0, 0, 0};   // bytes between consecutive elements/rows/...
  void* data = nullptr;
  Buffer* buffer = nullptr;  // owner; null for views of mapped files or graph scratch
  std::string name;

  // A contiguous tensor of the given shape over `data` (may be null until placed).
  static Tensor contiguous(DType type, std::initializer_list<int64_t> shape, void* data = nullptr);

  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_size() const;  // bytes of one row of ne[0] elements
  size_t nbytes() const;    // bytes spanned by a contiguous tensor
  bool is_contiguous() const;

  template <typename T>
  T* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]);
  }
  // Row r counted over dimensions 1..3 together (r in [0, nrows())).
  template <typename T>
  T* flat_row(int64_t r) const {
    return row<T>(r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
  }
};

}  // namespace tessera
