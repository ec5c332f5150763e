// Element types. The numeric values are GGUF's (ggml_type) so a tensor's dtype can be
// read from a file without translation; block layouts are bit-exact with GGUF's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,  // activation-only format (dot-product partner of Q4_1 and Q5_1)
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activation-only format (dot-product partner of the K-quants)
  IQ4_NL = 20,
  IQ4_XS = 23,
  I32 = 26,
  BF16 = 30,
  MXFP4 = 39,
};

struct DTypeTraits {
  DType type;
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for plain types)
  size_t block_bytes;   // bytes per block
  bool quantized;
};

// Traits of a supported dtype; nullptr for an id this build does not support.
const DTypeTraits* dtype_traits(uint32_t raw_id);
const DTypeTraits& dtype_traits(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "q4_0", "F16", ...
// Name of any ggml type id, supported or not (for error messages); "type N" if unknown.
std::string_view ggml_type_name(uint32_t raw_id);

// Bytes used by a row of n elements (n must be a multiple of the block size).
size_t row_bytes(DType t, int64_t n);

}  // namespace tessera
