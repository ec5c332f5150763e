// Quantization for tessera-gen: the core's quantizers where it has one, and simple
// ones of the generator's own for Q2_K, Q3_K and IQ4_XS, which the core only reads.
// The simple quantizers pick each sub-block's scale from its largest value (no error
// search, unlike llama.cpp's): valid blocks that keep the values' size and sign, which
// is all random benchmark weights need.
#pragma once
#include <cstdint>

#include "tessera/dtype.h"

namespace tessera::gen {

// Quantize n floats (a multiple of t's block size) into type t.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// The generator's own quantizers (exposed for the tests).
void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n);

}  // namespace tessera::gen
