// NaN and infinity in a model file's tensors: the engine checks the small vectors at
// every load, `--check-tensors` every tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/model_file.h"

namespace tessera {

// A tensor holding NaN or infinite values.
struct NonFiniteTensor {
  std::string name;
  DType type = DType::F32;
  int64_t count = 0;        // non-finite values
  int64_t first = 0;        // index of the first one (elements in file order)
  float first_value = 0.f;  // NaN, +inf or -inf
};
// Every floating-point or quantized tensor of the file, read value by value (F32, F16
// and BF16 as stored, quantized types dequantized block by block; integer tensors are
// skipped), in file order. Reads the whole file: `tessera info/run/serve
// --check-tensors`.
std::vector<NonFiniteTensor> find_non_finite_tensors(const ModelFile& file);
// The same for the tensors with at most one extent above 1 (norms, biases, scale
// vectors: a few KB each), which the engine checks at every load.
std::vector<NonFiniteTensor> find_non_finite_vectors(const ModelFile& file);
// "tensor 'x' (q8_0) holds 3 non-finite values (first: nan at element 17)"
std::string describe(const NonFiniteTensor& t);

}  // namespace tessera
