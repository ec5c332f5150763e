// Scalar reference arithmetic for every dtype: F16/BF16 conversion, GGUF block
// layouts, dequantization, quantization (weights and activations) and the dot
// products that follow the reference's conventions (see shared fixtures README):
// the activation row is first converted to vec_dot_type(weight) and the dot is
// computed on integers per block, then scaled.
#pragma once
#include <cstdint>
#include <cstring>

#include "tessera/dtype.h"

namespace tessera::quant {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even, NaN stays NaN

#pragma pack(push, 1)
struct BlockQ8_0 { uint16_t d; int8_t qs[QK8_0]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// Dequantize n elements (a multiple of the block size) of type t to float.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantize n floats into type t (any supported type, weights and Q8_0/Q8_K
// activations alike). Used for activations and by the model generator.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// The format an activation row is converted to before a dot with a weight row of
// type `weight`: F32->F32, F16->F16, BF16->BF16, Q4_0/Q8_0->Q8_0, K-quants->Q8_K.
DType vec_dot_type(DType weight);

// dot(weight_row, act_row) over n elements, act_row already in vec_dot_type(wt).
float vec_dot(DType wt, int64_t n, const void* weight_row, const void* act_row);

}  // namespace tessera::quant
