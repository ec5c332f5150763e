// AVX-512 matrix products (compiled with -mavx512f/bw/vl/dq/vnni/bf16 -mfma -mf16c).
//
// Every weight dtype is dequantized inside registers; the activation column is
// converted ONCE to the reference's vec_dot type (quant::quantize_row, bit-exact) and
// then laid out for the kernels ("prepared"): int8 values reordered to match the
// lanes the weight nibbles land in, per-block float scales, and the sums that turn an
// unsigned x signed VNNI product (vpdpbusd) into the signed one:
//  - Q8_0: weights w (int8) are fed as w + 128 (unsigned); the accumulator starts at
//    -128 * (sum of the 4 activations of the lane), so each lane is exact.
//  - Q4_0: nibbles q (0..15) fed unsigned, accumulator starts at -8 * (lane sum).
//  - Q4_K / Q5_K: q is unsigned already; the integer sub-block sums are scaled by the
//    6-bit scales in int32 (exact); the mins use the activation's 32-element sums.
//  - Q6_K: q (0..63) unsigned, scaled by the int8 sub-block scales in int32; the -32
//    offset uses the activation's 16-element sums.
// Integer partial sums are exact; only the float scaling/accumulation order differs
// from cpu_scalar (float rounding). F16/BF16 weights: activations rounded to F16/BF16
// (exact products), F32 accumulation.
//
// Prefill: kernels take NC (1..4) activation columns per pass over a weight row, so a
// weight block is loaded and unpacked once per NC columns; rows are walked in small
// blocks so that the rows stay in L1/L2 while all column groups pass over them.
//
// No static initializer in this file executes AVX-512 code (constants are built
// inside the functions).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "tessera/quant.h"

namespace tessera::cpu_avx512::kern {
namespace {

using quant::BlockQ4_0;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;
using quant::BlockQ8_K;
using quant::QK_K;

constexpr size_t A64(size_t n) { return (n + 63) & ~size_t(63); }
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

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

// ---------------------------------------------------------------- preparation

void prep_q8_0_for(DType wt, const float* x, int64_t K, uint8_t* dst) {
  const int64_t nb = K / 32;
  // Quantized back into dst: blocks of 34 bytes fit below 2*A64(K) bytes... but they
  // overlap the layout, so quantize in stack chunks of 16 blocks instead.
  BlockQ8_0 blkbuf[16];
  int8_t* qs = reinterpret_cast<int8_t*>(dst);
  int32_t* corr = reinterpret_cast<int32_t*>(dst + q8_off_corr(K));
  float* d = reinterpret_cast<float*>(dst + q8_off_d(K));
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t n = std::min<int64_t>(16, nb - b0);
    quant::quantize_row(DType::Q8_0, x + b0 * 32, blkbuf, n * 32);
    for (int64_t b = 0; b < n; ++b) {
      d[b0 + b] = h2f(blkbuf[b].d);
      std::memcpy(qs + (b0 + b) * 32, blkbuf[b].qs, 32);
    }
  }
  if (wt == DType::Q8_0) {
    for (int64_t i = 0; i < K / 4; ++i)
      corr[i] = -128 * (qs[4 * i] + qs[4 * i + 1] + qs[4 * i + 2] + qs[4 * i + 3]);
    return;
  }
  // Q4_0: groups of 4 blocks as [lo halves of the 4 blocks][hi halves]; tail natural.
  const int64_t nb4 = nb / 4 * 4;
  for (int64_t g = 0; g < nb4; g += 4) {
    int8_t* lo = qs + g * 32;
    int8_t* hi = lo + 64;
    int32_t* c = corr + g * 8;
    int8_t nat[128];
    std::memcpy(nat, lo, 128);
    for (int j = 0; j < 4; ++j) {
      std::memcpy(lo + 16 * j, nat + 32 * j, 16);
      std::memcpy(hi + 16 * j, nat + 32 * j + 16, 16);
    }
    for (int l = 0; l < 16; ++l) {
      int s = 0;
      for (int u = 0; u < 4; ++u) s += lo[4 * l + u] + hi[4 * l + u];
      c[l] = -8 * s;
    }
  }
}

void prep_q8_k_for(DType wt, const float* x, int64_t K, uint8_t* dst) {
  const int64_t nb = K / QK_K;
  BlockQ8_K blk[1];
  for (int64_t b = 0; b < nb; ++b) {
    quant::quantize_row(DType::Q8_K, x + b * QK_K, blk, QK_K);
    uint8_t* o = dst + size_t(b) * kQ8KBlockBytes;
    const int8_t* y = blk[0].qs;
    std::memset(o + 256, 0, 64);
    std::memcpy(o + 256, &blk[0].d, 4);
    int16_t* sums = reinterpret_cast<int16_t*>(o + 272);
    if (wt == DType::Q6_K) {
      std::memcpy(o, y, 256);
      for (int j = 0; j < 16; ++j) sums[j] = blk[0].bsums[j];
    } else {
      for (int h = 0; h < 2; ++h) {
        const int8_t* yh = y + 128 * h;
        uint8_t* oh = o + 128 * h;
        std::memcpy(oh, yh, 32);
        std::memcpy(oh + 32, yh + 64, 32);
        std::memcpy(oh + 64, yh + 32, 32);
        std::memcpy(oh + 96, yh + 96, 32);
      }
      for (int j = 0; j < 8; ++j) sums[j] = int16_t(blk[0].bsums[2 * j] + blk[0].bsums[2 * j + 1]);
    }
  }
}

// ---------------------------------------------------------------- Q8_0

template <int NC>
void dot_q8_0(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / 32;
  constexpr int64_t BS = sizeof(BlockQ8_0);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int(BS)));
  const __m512i off = _mm512_set1_epi8(char(0x80));
  const __m512i pidx0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i two = _mm512_set1_epi32(2);
  int64_t b = 0;
  while (nb - b >= 2) {
    const int64_t cb = std::min<int64_t>(16, nb - b);
    const __mmask16 m = __mmask16((1u << cb) - 1);
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, vidx, w + b * BS, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    __m512 s[NC];
    for (int c = 0; c < NC; ++c)
      s[c] = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c] + q8_off_d(K)) + b));
    const int64_t pairs = cb / 2;
    __m512i pidx = pidx0;
    for (int64_t p = 0; p < pairs; ++p, pidx = _mm512_add_epi32(pidx, two)) {
      const uint8_t* bp = w + (b + 2 * p) * BS + 2;
      const __m512i wv = _mm512_xor_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp))),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + BS)), 1),
          off);
      const int64_t e = (b + 2 * p) * 32;
      for (int c = 0; c < NC; ++c) {
        const __m512i y = _mm512_load_si512(act[c] + e);
        const __m512i cr = _mm512_load_si512(act[c] + q8_off_corr(K) + e);
        const __m512i i = _mm512_dpbusd_epi32(cr, wv, y);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(pidx, s[c]), acc[c]);
      }
    }
    b += pairs * 2;
    if (cb & 1) break;
  }
  for (int c = 0; c < NC; ++c) res[c] = _mm512_reduce_add_ps(acc[c]);
  for (; b < nb; ++b) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(w + b * BS);
    const float dw = h2f(blk->d);
    for (int c = 0; c < NC; ++c) {
      const int8_t* y = reinterpret_cast<const int8_t*>(act[c]) + b * 32;
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += blk->qs[j] * y[j];
      res[c] += float(s) * (dw * reinterpret_cast<const float*>(act[c] + q8_off_d(K))[b]);
    }
  }
}

// ---------------------------------------------------------------- Q4_0

template <int NC>
void dot_q4_0(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / 32;
  constexpr int64_t BS = sizeof(BlockQ4_0);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int(BS)));
  const __m512i lowmask = _mm512_set1_epi8(0x0F);
  const __m512i pidx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i four = _mm512_set1_epi32(4);
  int64_t b = 0;
  while (nb - b >= 4) {
    const int64_t cb = std::min<int64_t>(16, nb - b);
    const __mmask16 m = __mmask16((1u << cb) - 1);
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, vidx, w + b * BS, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    __m512 s[NC];
    for (int c = 0; c < NC; ++c)
      s[c] = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c] + q8_off_d(K)) + b));
    const int64_t groups = cb / 4;
    __m512i pidx = pidx0;
    for (int64_t gi = 0; gi < groups; ++gi, pidx = _mm512_add_epi32(pidx, four)) {
      const uint8_t* bp = w + (b + 4 * gi) * BS + 2;
      __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bp)));
      q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + BS)), 1);
      q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 2 * BS)), 2);
      q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 3 * BS)), 3);
      const __m512i lo = _mm512_and_si512(q, lowmask);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), lowmask);
      const int64_t e = (b + 4 * gi) * 32;
      for (int c = 0; c < NC; ++c) {
        const __m512i ylo = _mm512_load_si512(act[c] + e);
        const __m512i yhi = _mm512_load_si512(act[c] + e + 64);
        const __m512i cr = _mm512_load_si512(act[c] + q8_off_corr(K) + e);
        const __m512i i = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cr, lo, ylo), hi, yhi);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(pidx, s[c]), acc[c]);
      }
    }
    b += groups * 4;
    if (cb & 3) break;
  }
  for (int c = 0; c < NC; ++c) res[c] = _mm512_reduce_add_ps(acc[c]);
  for (; b < nb; ++b) {  // tail blocks: activation in natural order
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(w + b * BS);
    const float dw = h2f(blk->d);
    for (int c = 0; c < NC; ++c) {
      const int8_t* y = reinterpret_cast<const int8_t*>(act[c]) + b * 32;
      int32_t s = 0;
      for (int j = 0; j < 16; ++j) s += ((blk->qs[j] & 0xF) - 8) * y[j] + ((blk->qs[j] >> 4) - 8) * y[j + 16];
      res[c] += float(s) * (dw * reinterpret_cast<const float*>(act[c] + q8_off_d(K))[b]);
    }
  }
}

// ---------------------------------------------------------------- Q4_K / Q5_K

inline void unpack_scales_k4(const uint8_t* scales, uint32_t u[4]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t uaux = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = uaux;
  u[0] &= kmask1;
}

template <int NC, bool Q5>
void dot_q45_k(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / QK_K;
  constexpr int64_t BS = Q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  __m512 acc[NC];
  __m128 accm[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps(), accm[c] = _mm_setzero_ps();
  const __m512i lowmask = _mm512_set1_epi8(0x0F);
  const __m512i i02 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i one = _mm512_set1_epi32(1), four = _mm512_set1_epi32(4);
  const __m512i i13 = _mm512_add_epi32(i02, one), i46 = _mm512_add_epi32(i02, four),
                i57 = _mm512_add_epi32(i13, four);
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
    uint16_t dh, dmh;
    std::memcpy(&dh, bp, 2);
    std::memcpy(&dmh, bp + 2, 2);
    const float d = h2f(dh), dmin = h2f(dmh);
    uint32_t u[4];
    unpack_scales_k4(bp + 4, u);
    const __m512i scv = _mm512_cvtepu8_epi32(_mm_setr_epi32(int(u[0]), int(u[1]), 0, 0));
    const __m512i s02 = _mm512_permutexvar_epi32(i02, scv), s13 = _mm512_permutexvar_epi32(i13, scv),
                  s46 = _mm512_permutexvar_epi32(i46, scv), s57 = _mm512_permutexvar_epi32(i57, scv);
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
      const __m512i z = _mm512_setzero_si512();
      __m512i i = _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, l1, _mm512_load_si512(a)), s02);
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, h1, _mm512_load_si512(a + 64)), s13));
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, l2, _mm512_load_si512(a + 128)), s46));
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, h2, _mm512_load_si512(a + 192)), s57));
      const float dy = PrepQ8K::d(a);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(d * dy), acc[c]);
      const __m128i mm = _mm_madd_epi16(mins, _mm_load_si128(reinterpret_cast<const __m128i*>(a + 272)));
      accm[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(mm), _mm_set1_ps(dmin * dy), accm[c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    __m128 m = accm[c];
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    res[c] = _mm512_reduce_add_ps(acc[c]) - _mm_cvtss_f32(m);
  }
}

// ---------------------------------------------------------------- Q6_K

template <int NC>
void dot_q6_k(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / QK_K;
  constexpr int64_t BS = sizeof(BlockQ6_K);
  __m512 acc[NC];
  __m256 accm[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps(), accm[c] = _mm256_setzero_ps();
  const __m512i lowmask = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i p0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i four = _mm512_set1_epi32(4);
  for (int64_t b = 0; b < nb; ++b) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(w + b * BS);
    const float d = h2f(blk->d);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales));
    const __m512i scv = _mm512_cvtepi8_epi32(sc8);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    __m512i q[4], sv[4];
    __m512i pidx = p0;
    for (int h = 0; h < 2; ++h) {
      const __m512i zl = _mm512_loadu_si512(blk->ql + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      const __m512i t1 = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)), _mm256_slli_epi16(qh, 2), 1), m30);
      const __m512i t2 =
          _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1), m30);
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(zl, lowmask), t1);
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(zl, 4), lowmask), t2);
      sv[2 * h] = _mm512_permutexvar_epi32(pidx, scv);
      pidx = _mm512_add_epi32(pidx, four);
      sv[2 * h + 1] = _mm512_permutexvar_epi32(pidx, scv);
      pidx = _mm512_add_epi32(pidx, four);
    }
    for (int c = 0; c < NC; ++c) {
      const uint8_t* a = act[c] + size_t(b) * kQ8KBlockBytes;
      const __m512i z = _mm512_setzero_si512();
      __m512i i = _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, q[0], _mm512_load_si512(a)), sv[0]);
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, q[1], _mm512_load_si512(a + 64)), sv[1]));
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, q[2], _mm512_load_si512(a + 128)), sv[2]));
      i = _mm512_add_epi32(i, _mm512_mullo_epi32(_mm512_dpbusd_epi32(z, q[3], _mm512_load_si512(a + 192)), sv[3]));
      const float dd = d * PrepQ8K::d(a);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(dd), acc[c]);
      const __m256i mm = _mm256_madd_epi16(sc16, _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 272)));
      accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dd), accm[c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm[c]), _mm256_extractf128_ps(accm[c], 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    res[c] = _mm512_reduce_add_ps(acc[c]) - 32.0f * _mm_cvtss_f32(m);
  }
}

// ---------------------------------------------------------------- F32 / F16 / BF16

template <int NC>
void dot_f32(const uint8_t* w8, int64_t K, const uint8_t* const* act, float* res) {
  const float* w = reinterpret_cast<const float*>(w8);
  __m512 acc[NC][2];
  for (int c = 0; c < NC; ++c) acc[c][0] = acc[c][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
    for (int c = 0; c < NC; ++c) {
      const float* a = reinterpret_cast<const float*>(act[c]);
      acc[c][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(a + k), acc[c][0]);
      acc[c][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(a + k + 16), acc[c][1]);
    }
  }
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    const __m512 w0 = _mm512_maskz_loadu_ps(m, w + k);
    for (int c = 0; c < NC; ++c)
      acc[c][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c]) + k), acc[c][0]);
  }
  for (int c = 0; c < NC; ++c) res[c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
}

template <int NC>
void dot_f16(const uint8_t* w8, int64_t K, const uint8_t* const* act, float* res) {
  const uint16_t* w = reinterpret_cast<const uint16_t*>(w8);
  __m512 acc[NC][2];
  for (int c = 0; c < NC; ++c) acc[c][0] = acc[c][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k)));
    const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k + 16)));
    for (int c = 0; c < NC; ++c) {
      const float* a = reinterpret_cast<const float*>(act[c]);
      acc[c][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(a + k), acc[c][0]);
      acc[c][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(a + k + 16), acc[c][1]);
    }
  }
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    const __m512 w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + k));
    for (int c = 0; c < NC; ++c)
      acc[c][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(act[c]) + k), acc[c][0]);
  }
  for (int c = 0; c < NC; ++c) res[c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
}

template <int NC>
void dot_bf16(const uint8_t* w8, int64_t K, const uint8_t* const* act, float* res) {
  const uint16_t* w = reinterpret_cast<const uint16_t*>(w8);
  __m512 acc[NC][2];
  for (int c = 0; c < NC; ++c) acc[c][0] = acc[c][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
    for (int c = 0; c < NC; ++c) {
      const uint16_t* a = reinterpret_cast<const uint16_t*>(act[c]);
      acc[c][0] = _mm512_dpbf16_ps(acc[c][0], w0, (__m512bh)_mm512_load_si512(a + k));
      acc[c][1] = _mm512_dpbf16_ps(acc[c][1], w1, (__m512bh)_mm512_load_si512(a + k + 32));
    }
  }
  for (; k < K; k += 32) {
    const __mmask32 m = K - k >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << (K - k)) - 1);
    const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
    for (int c = 0; c < NC; ++c)
      acc[c][0] = _mm512_dpbf16_ps(acc[c][0], w0,
                                   (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(act[c]) + k));
  }
  for (int c = 0; c < NC; ++c) res[c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
}

using DotFn = void (*)(const uint8_t*, int64_t, const uint8_t* const*, float*);

template <int NC>
DotFn pick(DType wt) {
  switch (wt) {
    case DType::F32: return &dot_f32<NC>;
    case DType::F16: return &dot_f16<NC>;
    case DType::BF16: return &dot_bf16<NC>;
    case DType::Q8_0: return &dot_q8_0<NC>;
    case DType::Q4_0: return &dot_q4_0<NC>;
    case DType::Q4_K: return &dot_q45_k<NC, false>;
    case DType::Q5_K: return &dot_q45_k<NC, true>;
    case DType::Q6_K: return &dot_q6_k<NC>;
    default: return nullptr;
  }
}

}  // namespace

bool matmul_type_supported(DType wt) {
  switch (wt) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

size_t act_bytes(DType wt, int64_t K) {
  switch (wt) {
    case DType::F32: return A64(size_t(K) * 4);
    case DType::F16: return A64(size_t(K) * 4);  // F16-rounded values stored as floats
    case DType::BF16: return A64(size_t(K) * 2);
    case DType::Q8_0:
    case DType::Q4_0: return 2 * A64(size_t(K)) + A64(size_t(K / 32) * 4);
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return size_t(K / QK_K) * kQ8KBlockBytes;
    default: return 0;
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
      for (; k < K; ++k) o[k] = quant::fp16_to_fp32(quant::fp32_to_fp16(x[k]));
      return;
    }
    case DType::BF16: quant::quantize_row(DType::BF16, x, dst, K); return;
    case DType::Q8_0:
    case DType::Q4_0: prep_q8_0_for(wt, x, K, dst); return;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: prep_q8_k_for(wt, x, K, dst); return;
    default: return;
  }
}

void matmul_rows(const MatMulJob& j, int64_t r0, int64_t r1) {
  const DotFn f1 = pick<1>(j.wt), f2 = pick<2>(j.wt), f3 = pick<3>(j.wt), f4 = pick<4>(j.wt);
  // Rows per cache block: about 32 KiB of weights, at least 4.
  const int64_t RB = j.M <= 4 ? (r1 - r0) : std::max<int64_t>(4, (32 << 10) / std::max<int64_t>(1, j.wstride));
  for (int64_t rb = r0; rb < r1; rb += RB) {
    const int64_t re = std::min(r1, rb + RB);
    for (int64_t m0 = 0; m0 < j.M; m0 += 4) {
      const int nc = int(std::min<int64_t>(4, j.M - m0));
      const uint8_t* a[4];
      for (int c = 0; c < nc; ++c) a[c] = j.act + size_t(m0 + c) * j.act_stride;
      const DotFn f = nc == 4 ? f4 : nc == 3 ? f3 : nc == 2 ? f2 : f1;
      float res[4];
      for (int64_t r = rb; r < re; ++r) {
        f(j.w + r * j.wstride, j.K, a, res);
        for (int c = 0; c < nc; ++c) j.out[(m0 + c) * j.out_stride + r] = res[c];
      }
    }
  }
}

}  // namespace tessera::cpu_avx512::kern
