// AVX-512 matrix products (compiled with -mavx512f/bw/vl/dq/vnni/bf16 -mfma -mf16c).
//
// Every weight dtype is dequantized inside registers; the activation column is
// converted ONCE to the reference's vec_dot type (quant::quantize_row, bit-exact) and
// then laid out for the kernels ("prepared"): int8 values reordered to match the
// lanes the weight nibbles land in, per-block float scales, and the sums that turn an
// unsigned x signed VNNI product (vpdpbusd) into the signed one:
//  - Q8_0: weights w (int8) are fed as w + 128 (unsigned); the accumulator starts at
//    -128 * (sum of the 4 activations of the lane), so each lane is exact.
//  - Q4_K / Q5_K: q is unsigned already; the integer sub-block sums are scaled by the
//    6-bit scales in int32 (exact); the mins use the activation's 32-element sums.
//  - Q6_K: q (0..63) unsigned, scaled by the int8 sub-block scales in int32; the -32
//    offset uses the activation's 16-element sums.
// Q4_0 and the formats without a repacked kernel (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4,
// Q2_K, Q3_K, IQ4_XS) have their row kernels and layouts in kernels_matmul_formats.cpp
// (format_dot and friends).
// Integer sums are exact. A row adds its blocks in order with the float rounding of
// the repacked tiles (kernels_matmul_repacked.cpp), so a weight computes the same bits
// whether it is repacked or not (a streamed expert never is): Q8_0 as cpu_scalar,
// s * (dx * dy); a block of 256 as one fused multiply-add of its integer sum by
// d * dy (Q4_K / Q5_K: and one of its mins' sum by -dmin * dy). F16/BF16 weights:
// activations rounded to F16/BF16 (exact products), F32 accumulation.
//
// Prefill: kernels take NC (1..4) activation columns per pass over a weight row, so a
// weight block is loaded and unpacked once per NC columns; rows are walked in small
// blocks so that the rows stay in L1/L2 while all column groups pass over them.
//
// No static initializer in this file executes AVX-512 code (constants are built
// inside the functions).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "kernels_matmul_common.h"
#include "kernels_simd.h"
#include "tessera/quant_blocks.h"

namespace tessera::cpu_avx512::kern {

// Q8_0 activations exactly as quant::quantize_row (d = amax/127 stored as F16,
// q = roundf(x / d) with the float d), laid out for the Q8_0 row kernel.
void prep_q8_0(const float* x, int64_t K, uint8_t* dst) {
  const int64_t nb = K / 32;
  int8_t* qs = reinterpret_cast<int8_t*>(dst);
  int32_t* corr = reinterpret_cast<int32_t*>(dst + q8_off_corr(K));
  float* dd = reinterpret_cast<float*>(dst + q8_off_d(K));
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    float id;
    const float d = q8_0_scale(x0, x1, id);
    dd[b] = round_to_f16(d);
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x0, vid)));
    const __m512i q1 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x1, vid)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
  }
  const __m512i z = _mm512_setzero_si512();
  {
    // corr lane = -128 * (sum of its 4 activations): -(dpbusd of 0x80 bytes with y).
    const __m512i c80 = _mm512_set1_epi8(char(0x80));
    int64_t e = 0;
    for (; e + 64 <= K; e += 64)
      _mm512_store_si512(corr + e / 4, _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, c80, _mm512_load_si512(qs + e))));
    for (; e < K; e += 4) corr[e / 4] = -128 * (qs[e] + qs[e + 1] + qs[e + 2] + qs[e + 3]);
  }
}

// Q8_K activations exactly as quant::quantize_row: the signed value of largest
// magnitude (first one) maps to -127, q = min(127, nearest_int(-127/max * x)).
void prep_q8_k_for(DType wt, const float* x, int64_t K, uint8_t* dst) {
  const int64_t nb = K / QK_K;
  const bool q6 = wt == DType::Q6_K;
  static constexpr int kPos[4] = {0, 64, 32, 96};  // Q4_K/Q5_K order of the 32-element chunks
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * QK_K;
    uint8_t* o = dst + size_t(b) * kQ8KBlockBytes;
    std::memset(o + 256, 0, 64);
    int16_t* sums = reinterpret_cast<int16_t*>(o + 272);
    alignas(64) int8_t q[256];
    int16_t s16[16];
    float d;
    quant_q8_k_block(xb, q, s16, d);
    std::memcpy(o + 256, &d, 4);
    for (int g = 0; g < 16; ++g) {
      const int e = 16 * g;
      const int at = q6 ? e : 128 * (e / 128) + kPos[(e % 128) / 32] + e % 32;
      std::memcpy(o + at, q + e, 16);
    }
    if (q6)
      for (int j = 0; j < 16; ++j) sums[j] = s16[j];
    else
      for (int j = 0; j < 8; ++j) sums[j] = int16_t(s16[2 * j] + s16[2 * j + 1]);
  }
}

namespace {


template <bool PF = true>
inline void prefetch_w(const void* p) {
  if constexpr (PF) _mm_prefetch(static_cast<const char*>(p) + PF_DIST, _MM_HINT_T0);
}
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }



// ---------------------------------------------------------------- preparation




// BF16 rounding as quant::fp32_to_bf16 (nearest even; NaN kept, quieted).
void prep_bf16(const float* x, int64_t K, uint16_t* y) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + k));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(y + k, m, _mm512_cvtepi32_epi16(r));
  }
}

// The F16 scales of up to 16 consecutive blocks (stride BS bytes), as floats. Plain
// 16-bit loads through a small buffer: cheaper than a vpgatherdd.
template <int64_t BS>
inline __m512 block_scales(const uint8_t* w, int64_t cb) {
  alignas(32) uint16_t h[16];
  if (cb == 16) {
    for (int j = 0; j < 16; ++j) std::memcpy(&h[j], w + j * BS, 2);
  } else {
    for (int j = 0; j < 16; ++j) {
      h[j] = 0;
      if (j < cb) std::memcpy(&h[j], w + j * BS, 2);
    }
  }
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}

// ---------------------------------------------------------------- Q8_0

// Two blocks per register (one per 256-bit half); each block's int32 lanes are
// reduced to its sum, and the blocks are added in order as s * (dx * dy).
template <int NC>
void dot_q8_0(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / 32;
  constexpr int64_t BS = sizeof(BlockQ8_0);
  float sum[NC];
  for (int c = 0; c < NC; ++c) sum[c] = 0.0f;
  const __m512i off = _mm512_set1_epi8(char(0x80));
  for (int64_t b = 0; b < nb; b += 16) {
    const int64_t cb = std::min<int64_t>(16, nb - b);
    const __mmask16 m = __mmask16((1u << cb) - 1);
    const __m512 dw = block_scales<BS>(w + b * BS, cb);
    alignas(64) float sc[NC][16];
    alignas(64) int32_t is[NC][16];
    for (int c = 0; c < NC; ++c)
      _mm512_store_ps(sc[c], _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c] + q8_off_d(K)) + b)));
    for (int64_t p = 0; p < cb; p += 2) {
      const uint8_t* bp = w + (b + p) * BS + 2;
      prefetch_w(bp);
      const __m256i w1 = p + 1 < cb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + BS)) : _mm256_setzero_si256();
      const __m512i wv = _mm512_xor_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp))), w1, 1), off);
      const int64_t e = (b + p) * 32;
      const __mmask16 lanes = p + 1 < cb ? __mmask16(0xFFFF) : __mmask16(0x00FF);
      for (int c = 0; c < NC; ++c) {
        const __m512i y = _mm512_maskz_loadu_epi32(lanes, act[c] + e);
        const __m512i cr = _mm512_maskz_loadu_epi32(lanes, act[c] + q8_off_corr(K) + e);
        __m512i i = _mm512_dpbusd_epi32(cr, wv, y);
        // Sum of each 256-bit half: the two blocks' sums in lanes 0 and 8.
        i = _mm512_add_epi32(i, _mm512_shuffle_epi32(i, _MM_PERM_CDAB));
        i = _mm512_add_epi32(i, _mm512_shuffle_epi32(i, _MM_PERM_BADC));
        i = _mm512_add_epi32(i, _mm512_shuffle_i32x4(i, i, _MM_SHUFFLE(2, 3, 0, 1)));
        is[c][p] = _mm_cvtsi128_si32(_mm512_castsi512_si128(i));
        is[c][p + 1] = _mm_cvtsi128_si32(_mm512_extracti32x4_epi32(i, 2));
      }
    }
    for (int c = 0; c < NC; ++c)
      for (int64_t k = 0; k < cb; ++k) sum[c] += float(is[c][k]) * sc[c][k];
  }
  for (int c = 0; c < NC; ++c) res[c] = sum[c];
}

// ---------------------------------------------------------------- Q4_K / Q5_K

inline int32_t hsum_epi32(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(v);
}


// Index vectors for vpshufb: in 128-bit lane k, int16 element `lo` of the source
// lane repeated 8 times for k < 2 and element `hi` for k >= 2 (zero-extended bytes
// when `zext`, i.e. the source holds bytes; else the source holds int16s).
inline __m512i scale_index(int lo, int hi, bool zext) {
  alignas(64) int8_t idx[64];
  for (int k = 0; k < 4; ++k) {
    const int e = k < 2 ? lo : hi;
    for (int i = 0; i < 8; ++i) {
      idx[16 * k + 2 * i] = int8_t(zext ? e : 2 * e);
      idx[16 * k + 2 * i + 1] = int8_t(zext ? -128 : 2 * e + 1);
    }
  }
  return _mm512_load_si512(idx);
}

// Q4_K / Q5_K: per 64 weights, vpmaddubsw (q unsigned x activation, int16 pairs, no
// saturation: 2*31*127 < 32767) then vpdpwssd with the sub-block scale (int16), so the
// scaled integer sum of the whole block is exact in int32.
template <int NC, bool Q5>
void dot_q45_k(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / QK_K;
  constexpr int64_t BS = Q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  float sum[NC];
  for (int c = 0; c < NC; ++c) sum[c] = 0.0f;
  const __m512i lowmask = _mm512_set1_epi8(0x0F);
  const __m512i x02 = scale_index(0, 2, true), x13 = scale_index(1, 3, true), x46 = scale_index(4, 6, true),
                x57 = scale_index(5, 7, true);
  __m512i hb[4];
  if constexpr (Q5) {
    const __m256i a = _mm256_set1_epi8(1), bb = _mm256_set1_epi8(4);
    hb[0] = _mm512_inserti64x4(_mm512_castsi256_si512(a), bb, 1);  // bits 0 | 2
    hb[1] = _mm512_add_epi8(hb[0], hb[0]);                          // bits 1 | 3
    hb[2] = _mm512_slli_epi16(hb[0], 4);                            // bits 4 | 6
    hb[3] = _mm512_slli_epi16(hb[0], 5);                            // bits 5 | 7
  }
  const __m512i sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* bp = w + b * BS;
    prefetch_w(bp);
    prefetch_w(bp + 64);
    prefetch_w(bp + 128);
    uint16_t dh, dmh;
    std::memcpy(&dh, bp, 2);
    std::memcpy(&dmh, bp + 2, 2);
    const float d = h2f(dh), dmin = h2f(dmh);
    uint32_t u[4];
    unpack_scales_k4(bp + 4, u);
    const __m512i bsc = _mm512_set1_epi64(int64_t(uint64_t(u[0]) | (uint64_t(u[1]) << 32)));
    const __m512i s02 = _mm512_shuffle_epi8(bsc, x02), s13 = _mm512_shuffle_epi8(bsc, x13),
                  s46 = _mm512_shuffle_epi8(bsc, x46), s57 = _mm512_shuffle_epi8(bsc, x57);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_setr_epi32(int(u[2]), int(u[3]), 0, 0));
    const uint8_t* qs = bp + (Q5 ? 48 : 16);
    const __m512i z1 = _mm512_loadu_si512(qs), z2 = _mm512_loadu_si512(qs + 64);
    __m512i l1 = _mm512_and_si512(z1, lowmask), h1 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), lowmask);
    __m512i l2 = _mm512_and_si512(z2, lowmask), h2 = _mm512_and_si512(_mm512_srli_epi16(z2, 4), lowmask);
    if constexpr (Q5) {
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 16)));
      l1 = _mm512_mask_add_epi8(l1, _mm512_test_epi8_mask(qh, hb[0]), l1, sixteen);
      h1 = _mm512_mask_add_epi8(h1, _mm512_test_epi8_mask(qh, hb[1]), h1, sixteen);
      l2 = _mm512_mask_add_epi8(l2, _mm512_test_epi8_mask(qh, hb[2]), l2, sixteen);
      h2 = _mm512_mask_add_epi8(h2, _mm512_test_epi8_mask(qh, hb[3]), h2, sixteen);
    }
    for (int c = 0; c < NC; ++c) {
      const uint8_t* a = act[c] + size_t(b) * kQ8KBlockBytes;
      __m512i i = _mm512_madd_epi16(_mm512_maddubs_epi16(l1, _mm512_load_si512(a)), s02);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(h1, _mm512_load_si512(a + 64)), s13);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(l2, _mm512_load_si512(a + 128)), s46);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(h2, _mm512_load_si512(a + 192)), s57);
      const float dy = PrepQ8K::d(a);
      const __m128i mm = _mm_madd_epi16(mins, _mm_load_si128(reinterpret_cast<const __m128i*>(a + 272)));
      // The block's exact sums, added as the repacked tile adds them.
      sum[c] = std::fma(float(_mm512_reduce_add_epi32(i)), d * dy, sum[c]);
      sum[c] = std::fma(-float(hsum_epi32(mm)), dmin * dy, sum[c]);
    }
  }
  for (int c = 0; c < NC; ++c) res[c] = sum[c];
}

// ---------------------------------------------------------------- Q6_K

// q (0..63) unsigned: vpmaddubsw (2*63*127 < 32767) then vpdpwssd with the signed
// 16-element sub-block scale; the -32 offset is applied with the activation's
// 16-element sums times the scales.
template <int NC>
void dot_q6_k(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / QK_K;
  constexpr int64_t BS = sizeof(BlockQ6_K);
  float sum[NC];
  for (int c = 0; c < NC; ++c) sum[c] = 0.0f;
  const __m512i lowmask = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  // lane k of the low 64 values: int16 scale k; of the high 64: scale 4 + k.
  alignas(64) int8_t ia[64], ib[64];
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 8; ++i) {
      ia[16 * k + 2 * i] = int8_t(2 * k), ia[16 * k + 2 * i + 1] = int8_t(2 * k + 1);
      ib[16 * k + 2 * i] = int8_t(2 * (k + 4)), ib[16 * k + 2 * i + 1] = int8_t(2 * (k + 4) + 1);
    }
  const __m512i xa = _mm512_load_si512(ia), xb = _mm512_load_si512(ib);
  for (int64_t b = 0; b < nb; ++b) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(w + b * BS);
    for (int l = 0; l < 4; ++l) prefetch_w(w + b * BS + 64 * l);
    const float d = h2f(blk->d);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)));
    __m512i q[4], sv[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i zl = _mm512_loadu_si512(blk->ql + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      const __m512i t1 = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)), _mm256_slli_epi16(qh, 2), 1), m30);
      const __m512i t2 =
          _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1), m30);
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(zl, lowmask), t1);
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(zl, 4), lowmask), t2);
      const __m512i B = _mm512_broadcast_i32x4(h == 0 ? _mm256_castsi256_si128(sc16) : _mm256_extracti128_si256(sc16, 1));
      sv[2 * h] = _mm512_shuffle_epi8(B, xa);
      sv[2 * h + 1] = _mm512_shuffle_epi8(B, xb);
    }
    for (int c = 0; c < NC; ++c) {
      const uint8_t* a = act[c] + size_t(b) * kQ8KBlockBytes;
      __m512i i = _mm512_madd_epi16(_mm512_maddubs_epi16(q[0], _mm512_load_si512(a)), sv[0]);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(q[1], _mm512_load_si512(a + 64)), sv[1]);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(q[2], _mm512_load_si512(a + 128)), sv[2]);
      i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(q[3], _mm512_load_si512(a + 192)), sv[3]);
      const __m256i mm = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 272)));  // 16-byte aligned only
      // The block's exact signed sum (the -32 offset in integers), added as the
      // repacked tile adds it.
      const __m128i m4 = _mm_add_epi32(_mm256_castsi256_si128(mm), _mm256_extracti128_si256(mm, 1));
      const int32_t tot = _mm512_reduce_add_epi32(i) - 32 * hsum_epi32(m4);
      sum[c] = std::fma(float(tot), d * PrepQ8K::d(a), sum[c]);
    }
  }
  for (int c = 0; c < NC; ++c) res[c] = sum[c];
}

// ---------------------------------------------------------------- F32 / F16 / BF16
// NR weight rows x NC columns per pass (register tile); each (row, column) pair has
// two accumulators (even/odd 16- or 32-element steps) and the same K order whatever
// NR is, so a row's result does not depend on whether it was computed in a pair.

struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 w(const uint8_t* p, int64_t k) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + k); }
  static __m512 wm(const uint8_t* p, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p) + k);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 w(const uint8_t* p, int64_t k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(p) + k)));
  }
  static __m512 wm(const uint8_t* p, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(p) + k));
  }
};

// F32 and F16 weights against F32 (F16-rounded for F16) activations.
template <class L, int NR, int NC, bool PF = true>
void dot_fp(const uint8_t* w, int64_t wstride, int64_t K, const uint8_t* const* act, float* res) {
  __m512 acc[NR][NC][2];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512 w0[NR], w1[NR];
    for (int r = 0; r < NR; ++r) {
      prefetch_w<PF>(w + r * wstride + k * L::kBytes);
      w0[r] = L::w(w + r * wstride, k), w1[r] = L::w(w + r * wstride, k + 16);
    }
    for (int c = 0; c < NC; ++c) {
      const float* a = reinterpret_cast<const float*>(act[c]);
      const __m512 a0 = _mm512_load_ps(a + k), a1 = _mm512_load_ps(a + k + 16);
      for (int r = 0; r < NR; ++r) {
        acc[r][c][0] = _mm512_fmadd_ps(w0[r], a0, acc[r][c][0]);
        acc[r][c][1] = _mm512_fmadd_ps(w1[r], a1, acc[r][c][1]);
      }
    }
  }
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    __m512 w0[NR];
    for (int r = 0; r < NR; ++r) w0[r] = L::wm(w + r * wstride, k, m);
    for (int c = 0; c < NC; ++c) {
      const __m512 a0 = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c]) + k);
      for (int r = 0; r < NR; ++r) acc[r][c][0] = _mm512_fmadd_ps(w0[r], a0, acc[r][c][0]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) res[4 * r + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][c][0], acc[r][c][1]));
}

// BF16 weights against BF16 activations: vdpbf16ps (pairs of exact products).
template <int NR, int NC, bool PF = true>
void dot_bf16(const uint8_t* w, int64_t wstride, int64_t K, const uint8_t* const* act, float* res) {
  __m512 acc[NR][NC][2];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512bh w0[NR], w1[NR];
    for (int r = 0; r < NR; ++r) {
      const uint16_t* wr = reinterpret_cast<const uint16_t*>(w + r * wstride);
      prefetch_w<PF>(wr + k);
      prefetch_w<PF>(wr + k + 32);
      w0[r] = (__m512bh)_mm512_loadu_si512(wr + k);
      w1[r] = (__m512bh)_mm512_loadu_si512(wr + k + 32);
    }
    for (int c = 0; c < NC; ++c) {
      const uint16_t* a = reinterpret_cast<const uint16_t*>(act[c]);
      const __m512bh a0 = (__m512bh)_mm512_load_si512(a + k), a1 = (__m512bh)_mm512_load_si512(a + k + 32);
      for (int r = 0; r < NR; ++r) {
        acc[r][c][0] = _mm512_dpbf16_ps(acc[r][c][0], w0[r], a0);
        acc[r][c][1] = _mm512_dpbf16_ps(acc[r][c][1], w1[r], a1);
      }
    }
  }
  for (; k < K; k += 32) {
    const __mmask32 m = K - k >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << (K - k)) - 1);
    __m512bh w0[NR];
    for (int r = 0; r < NR; ++r)
      w0[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(w + r * wstride) + k);
    for (int c = 0; c < NC; ++c) {
      const __m512bh a0 = (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(act[c]) + k);
      for (int r = 0; r < NR; ++r) acc[r][c][0] = _mm512_dpbf16_ps(acc[r][c][0], w0[r], a0);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) res[4 * r + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][c][0], acc[r][c][1]));
}

// One-row adapters with the signature of the quantized kernels.
template <int NC, bool PF> void dot_f32(const uint8_t* w, int64_t K, const uint8_t* const* a, float* res) { dot_fp<LoadF32, 1, NC, PF>(w, 0, K, a, res); }
template <int NC, bool PF> void dot_f16(const uint8_t* w, int64_t K, const uint8_t* const* a, float* res) { dot_fp<LoadF16, 1, NC, PF>(w, 0, K, a, res); }
template <int NC, bool PF> void dot_bf16_1(const uint8_t* w, int64_t K, const uint8_t* const* a, float* res) { dot_bf16<1, NC, PF>(w, 0, K, a, res); }

// Two-row kernels (float weights only; null for the others).
using Dot2Fn = void (*)(const uint8_t*, int64_t, int64_t, const uint8_t* const*, float*);
template <int NC>
Dot2Fn pick2(DType wt) {
  switch (wt) {
    case DType::F32: return &dot_fp<LoadF32, 2, NC>;
    case DType::F16: return &dot_fp<LoadF16, 2, NC>;
    case DType::BF16: return &dot_bf16<2, NC>;
    default: return nullptr;
  }
}

using DotFn = void (*)(const uint8_t*, int64_t, const uint8_t* const*, float*);

// PF: F32 / F16 / BF16 rows prefetched in software (decode leaves them to the hardware
// where MatMulJob::decode_prefetch is off; prefill keeps it). The quantized rows always
// prefetch, unlike the float rows and the repacked tiles (decision 35 says why).
template <int NC, bool PF = true>
DotFn pick(DType wt) {
  switch (wt) {
    case DType::F32: return &dot_f32<NC, PF>;
    case DType::F16: return &dot_f16<NC, PF>;
    case DType::BF16: return &dot_bf16_1<NC, PF>;
    case DType::Q8_0: return &dot_q8_0<NC>;
    case DType::Q4_K: return &dot_q45_k<NC, false>;
    case DType::Q5_K: return &dot_q45_k<NC, true>;
    case DType::Q6_K: return &dot_q6_k<NC>;
    default: return format_dot(wt, NC);  // the format-kernel types (kernels_matmul_formats.cpp)
  }
}

}  // namespace

bool matmul_type_supported(DType wt) {
  switch (wt) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    default: return format_supported(wt);
  }
}

size_t act_bytes(DType wt, int64_t K) {
  switch (wt) {
    case DType::F32: return A64(size_t(K) * 4);
    case DType::F16: return A64(size_t(K) * 4);  // F16-rounded values stored as floats
    case DType::BF16: return A64(size_t(K) * 2);
    case DType::Q8_0: return 2 * A64(size_t(K)) + A64(size_t(K / 32) * 4);
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return size_t(K / QK_K) * kQ8KBlockBytes;
    default: return format_act_bytes(wt, K);
  }
}

void prep_act(DType wt, const float* x, int64_t K, uint8_t* dst) {
  switch (wt) {
    case DType::F32: std::memcpy(dst, x, size_t(K) * 4); return;
    case DType::F16: {
      float* o = reinterpret_cast<float*>(dst);
      int64_t k = 0;
      for (; k + 16 <= K; k += 16)
        _mm512_store_ps(o + k, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + k), _MM_FROUND_TO_NEAREST_INT)));
      for (; k < K; ++k) o[k] = round_to_f16(x[k]);
      return;
    }
    case DType::BF16: prep_bf16(x, K, reinterpret_cast<uint16_t*>(dst)); return;
    case DType::Q8_0: prep_q8_0(x, K, dst); return;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: prep_q8_k_for(wt, x, K, dst); return;
    default: format_prep_act(wt, x, K, dst); return;
  }
}

void matmul_rows(const MatMulJob& j, int64_t r0, int64_t r1) {
  const DotFn f1 = j.M == 1 && !j.decode_prefetch ? pick<1, false>(j.wt) : pick<1>(j.wt);
  const DotFn f2 = pick<2>(j.wt), f3 = pick<3>(j.wt), f4 = pick<4>(j.wt);
  const Dot2Fn g1 = pick2<1>(j.wt), g2 = pick2<2>(j.wt), g3 = pick2<3>(j.wt), g4 = pick2<4>(j.wt);
  // Rows per cache block: about 32 KiB of weights, at least 4.
  const int64_t RB = j.M <= 4 ? (r1 - r0) : std::max<int64_t>(4, (32 << 10) / std::max<int64_t>(1, j.wstride));
  for (int64_t rb = r0; rb < r1; rb += RB) {
    const int64_t re = std::min(r1, rb + RB);
    for (int64_t m0 = 0; m0 < j.M; m0 += 4) {
      const int nc = int(std::min<int64_t>(4, j.M - m0));
      const uint8_t* a[4];
      float* o[4];
      for (int c = 0; c < nc; ++c) a[c] = j.col_act(m0 + c), o[c] = j.col_out(m0 + c);
      const DotFn f = nc == 4 ? f4 : nc == 3 ? f3 : nc == 2 ? f2 : f1;
      const Dot2Fn g = nc == 4 ? g4 : nc == 3 ? g3 : nc == 2 ? g2 : g1;
      float res[8];
      int64_t r = rb;
      // Decode of the format-kernel 256-blocks: 2 rows per pass (each row computed as alone).
      const RowDot2Fn d2 = j.M == 1 ? format_dot2(j.wt) : nullptr;
      if (d2)
        for (; r + 2 <= re; r += 2) {
          d2(j.w + r * j.wstride, j.wstride, j.K, a, res);
          o[0][r] = res[0];
          o[0][r + 1] = res[4];
        }
      if (g && j.M > 1)  // prefill: 2 rows x nc columns per pass
        for (; r + 2 <= re; r += 2) {
          g(j.w + r * j.wstride, j.wstride, j.K, a, res);
          for (int c = 0; c < nc; ++c) {
            o[c][r] = res[c];
            o[c][r + 1] = res[4 + c];
          }
        }
      for (; r < re; ++r) {
        f(j.w + r * j.wstride, j.K, a, res);
        for (int c = 0; c < nc; ++c) o[c][r] = res[c];
      }
    }
  }
}

}  // namespace tessera::cpu_avx512::kern
