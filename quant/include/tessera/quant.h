// Scalar reference arithmetic for every dtype: dequantization, quantization (weights
// and activations) and the dot products that follow the reference's conventions (see
// the shared fixtures README): the activation row is first converted to
// vec_dot_type(weight) and the dot is computed on integers per block, then scaled.
// cpu_scalar, quantization at load, the conformance suite and tessera-gen compute
// with it; the block layouts are the core's (quant_blocks.h).
#pragma once
#include <cstdint>

#include "tessera/dtype.h"
#include "tessera/quant_blocks.h"

namespace tessera::quant {

// Dequantize n elements (a multiple of the block size) of type t to float.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantize n floats into type t (weights and Q8_0/Q8_1/Q8_K activations alike).
// Used for activations and by the model generator. Q2_K, Q3_K and IQ4_XS have no
// quantizer yet (they are read from files only) and throw.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// dot(weight_row, act_row) over n elements, act_row already in vec_dot_type(wt).
float vec_dot(DType wt, int64_t n, const void* weight_row, const void* act_row);

}  // namespace tessera::quant
