// The numbers every dtype is made of: F16/BF16 conversion, the GGUF block layouts,
// the grids of the non-linear formats, and which format an activation row takes for a
// product with a weight of each type (the reference's convention, see the shared
// fixtures README). The arithmetic over them (dequantization, quantization, the dot
// products) is libtessera_quant's (tessera/quant.h).
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
// Q8_1: Q8_0 plus s = fp16(d * sum(qs)), the activation partner of Q4_1 / Q5_1.
struct BlockQ8_1 { uint16_t d, s; int8_t qs[QK8_0]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
// Q4_1: value = d * q + m, q in [0, 15]; byte j: element j (low), j+16 (high nibble).
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK4_0 / 2]; };
// Q5_0: value = d * (q - 16); the fifth bit of element j is bit j of qh (little endian).
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; };
// Q5_1: value = d * q + m, q in [0, 31]; bits as Q5_0.
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; };
// IQ4_NL: value = d * kIQ4NLValues[nibble]; nibbles as Q4_0.
struct BlockIQ4_NL { uint16_t d; uint8_t qs[QK4_0 / 2]; };
// MXFP4: value = 2^(e-127) * E2M1(nibble) = 2^(e-128) * kMXFP4Values[nibble]; nibbles as Q4_0.
struct BlockMXFP4 { uint8_t e; uint8_t qs[QK4_0 / 2]; };
// Q2_K: 16 sub-blocks of 16; scales[j]: low nibble scale, high nibble min;
// value = d * sc * q - dmin * m, q 2-bit.
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
// Q3_K: 16 sub-blocks of 16 with 6-bit scales (biased by 32, packed in 12 bytes);
// q = 2 low bits from qs, minus 4 where the hmask bit is clear; value = d * (sc - 32) * q.
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (biased by 32: low 4 bits in
// scales_l, high 2 bits in scales_h); value = d * (ls - 32) * kIQ4NLValues[nibble].
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// The non-linear 4-bit grid of IQ4_NL and IQ4_XS, and MXFP4's E2M1 values doubled
// (so they are integers; the block scale is halved to compensate).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e-128): half the E8M0 scale e (ggml's GGML_E8M0_TO_FP32_HALF), exact for every e.
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The format an activation row is converted to before a dot with a weight row of
// type `weight`: F32->F32, F16->F16, BF16->BF16, Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4->Q8_0,
// Q4_1/Q5_1->Q8_1, K-quants (Q2_K..Q6_K) and IQ4_XS->Q8_K.
DType vec_dot_type(DType weight);

}  // namespace tessera::quant
