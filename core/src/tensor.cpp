#include "tessera/tensor.h"

#include "tessera/error.h"

namespace tessera {

Tensor Tensor::contiguous(DType type, std::initializer_list<int64_t> shape, void* data) {
  if (shape.size() == 0 || shape.size() > size_t(kMaxDims))
    throw Error("tensor must have 1 to 4 dimensions");
  Tensor t;
  t.type = type;
  t.data = data;
  int d = 0;
  for (int64_t n : shape) {
    if (n <= 0) throw Error("tensor dimension must be positive");
    t.ne[d++] = n;
  }
  t.nb[0] = dtype_traits(type).block_bytes;
  t.nb[1] = row_bytes(type, t.ne[0]);
  for (int i = 2; i < kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * size_t(t.ne[i - 1]);
  return t;
}

size_t Tensor::row_size() const { return row_bytes(type, ne[0]); }

size_t Tensor::nbytes() const { return row_size() * size_t(nrows()); }

bool Tensor::is_contiguous() const {
  if (nb[1] != row_size()) return false;
  for (int i = 2; i < kMaxDims; ++i)
    if (nb[i] != nb[i - 1] * size_t(ne[i - 1])) return false;
  return true;
}

}  // namespace tessera
