// Pieces shared by the AVX-512 matrix-product files (kernels_matmul*.cpp, compiled
// with the kernel flags): the prepared-activation layouts and their quantizers.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tessera/dtype.h"
#include "tessera/quant_blocks.h"

namespace tessera::cpu_avx512::kern {

using quant::BlockQ4_0;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;
using quant::BlockQ8_K;
using quant::QK_K;

// Software prefetch distance (bytes ahead in the weight stream). The row kernels'
// decode needs it where the hardware prefetchers fall short; the repacked kernels make
// it optional in decode (MatMulJob::decode_prefetch, decision 35: on other cores it
// holds the L1 miss buffers and slows the stream).
#ifndef PF_DIST
#define PF_DIST 2048
#endif

constexpr size_t A64(size_t n) { return (n + 63) & ~size_t(63); }

// Per-block layout of a prepared Q8_K column (K-quant weights).
constexpr size_t kQ8KBlockBytes = 320;  // 256 qs, then float d at 256, int16 sums at 272
struct PrepQ8K {
  static const int8_t* qs(const uint8_t* b) { return reinterpret_cast<const int8_t*>(b); }
  static float d(const uint8_t* b) { float f; std::memcpy(&f, b + 256, 4); return f; }
  static const int16_t* sums(const uint8_t* b) { return reinterpret_cast<const int16_t*>(b + 272); }
};

// Q8_0-family prepared column: qs [A64(K)], corr int32 [K/4] at A64(K), d float [nb]
// at 2*A64(K).
inline size_t q8_off_corr(int64_t K) { return A64(size_t(K)); }
inline size_t q8_off_d(int64_t K) { return 2 * A64(size_t(K)); }

// roundf (halves away from zero) of every lane, exactly.
inline __m512 round_half_away(__m512 t) {
  const __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(t, r));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32(int(0x80000000u))),
      _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  return _mm512_mask_add_ps(r, up, r, one);
}

// The 6-bit scales and mins of a Q4_K / Q5_K block as 4 dwords of bytes (s0..s7, m0..m7).
inline void unpack_scales_k4(const uint8_t* scales, uint32_t u[4]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t uaux = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = uaux;
  u[0] &= kmask1;
}

// Lanes of x that are NaN or infinite (|x| not below infinity, unordered included).
inline __mmask16 non_finite_lanes(__m512 x) {
  return _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(std::numeric_limits<float>::infinity()), _CMP_NLT_UQ);
}

// The Q8_0 scale of the 32-block (x0, x1) exactly as quant::quantize_row: d = amax /
// 127, id = 1 / d (0 for an all-zero block). As there, a block holding a NaN or an
// infinity gets d = NaN and all-zero levels (x0, x1 are zeroed), so the non-finite
// value reaches every product (decision 90).
inline float q8_0_scale(__m512& x0, __m512& x1, float& id) {
  if (non_finite_lanes(x0) | non_finite_lanes(x1)) {
    x0 = x1 = _mm512_setzero_ps();
    id = 0.f;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float d = amax / 127.f;
  id = d != 0.f ? 1.f / d : 0.f;
  return d;
}

// Q8_K quantization of one 256-block exactly as quant::quantize_row: the signed value
// of largest magnitude (first one) maps to -127, q = min(127, nearest_int(-127/max * x)).
// q in natural order, the 16-element sums and d (all zero for an all-zero block; q and
// sums zero and d = NaN for a block holding a NaN or an infinity).
inline void quant_q8_k_block(const float* xb, int8_t q[256], int16_t sums[16], float& d) {
  __m512 am = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int g = 0; g < 16; ++g) {
    const __m512 x = _mm512_loadu_ps(xb + 16 * g);
    am = _mm512_max_ps(am, _mm512_abs_ps(x));
    bad |= non_finite_lanes(x);
  }
  const float amax = _mm512_reduce_max_ps(am);
  if (amax == 0.f || bad) {
    std::memset(q, 0, 256);
    std::memset(sums, 0, 32);
    d = bad ? std::numeric_limits<float>::quiet_NaN() : 0.f;
    return;
  }
  float mx = 0.f;
  for (int g = 0; g < 16; ++g) {
    const __mmask16 k =
        _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * g)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (k) {
      mx = xb[16 * g + __builtin_ctz(unsigned(k))];
      break;
    }
  }
  const float iscale = -127.f / mx;
  d = 1.f / iscale;
  const __m512 vs = _mm512_set1_ps(iscale);
  for (int g = 0; g < 16; ++g) {
    // max(-128): an overflowing product (the infinite iscale of a block of tiny subnormals)
    // converts to INT_MIN, whose sums would overflow (a no-op otherwise)
    const __m512i v = _mm512_max_epi32(
        _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), vs)), _mm512_set1_epi32(127)),
        _mm512_set1_epi32(-128));
    sums[g] = int16_t(_mm512_reduce_add_epi32(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * g), _mm512_cvtepi32_epi8(v));
  }
}

// Q8_0 activations exactly as quant::quantize_row, laid out for the Q8_0 row kernel.
void prep_q8_0(const float* x, int64_t K, uint8_t* dst);
// Q8_K activations exactly as quant::quantize_row, laid out for weight type wt
// (Q6_K: natural order and 16-element sums; Q4_K / Q5_K: their chunk order, 32-element sums).
void prep_q8_k_for(DType wt, const float* x, int64_t K, uint8_t* dst);

// ---- Row kernels of the format-kernel types (kernels_matmul_formats.cpp) ---------
// Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K and IQ4_XS weights in their GGUF layout
// against activations quantized exactly as quant::quantize_row of vec_dot_type(wt)
// (Q8_1, Q8_0 or Q8_K) and laid out for the kernel (see the file's comment).
// res[c] = dot(weight row, prepared column c) for NC columns.
using RowDotFn = void (*)(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res);
bool format_supported(DType wt);
size_t format_act_bytes(DType wt, int64_t K);  // a multiple of 64
void format_prep_act(DType wt, const float* x, int64_t K, uint8_t* dst);
RowDotFn format_dot(DType wt, int nc);  // nc = 1..4; null for other dtypes
// Two rows (w, w + wstride) x one column (decode), res[0] and res[4], each row bit for
// bit as format_dot(wt, 1) computes it alone; null where there is none.
using RowDot2Fn = void (*)(const uint8_t* w, int64_t wstride, int64_t K, const uint8_t* const* act, float* res);
RowDot2Fn format_dot2(DType wt);

}  // namespace tessera::cpu_avx512::kern
