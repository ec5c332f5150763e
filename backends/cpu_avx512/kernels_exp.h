// exp over 16 floats at once, equal bit for bit to the C library's expf on this
// platform (glibc >= 2.27 on an FMA-capable x86-64: the algorithm of ARM's optimized
// routines, selected as __expf_fma). The reference backend calls std::exp per
// element, and a polynomial that is off by one ulp moves values across the rounding
// boundaries of the next MatMul's activation quantization (~1e-6 NMSE in model
// logits), so the vector kernels must reproduce it exactly rather than approximate it.
//
// The algorithm, in double precision: k + r = x * 32 / ln 2 with integer k and
// |r| <= 1/2, exp(x) = 2^(k/32) * 2^(r/32), the first factor from a 32-entry table
// (its exponent adjusted by k / 32), the second a degree-3 polynomial in r; the double
// result is rounded to float once. The operation order and the fused multiply-adds
// are those of the library's FMA build (read off its disassembly); the constants
// are 2^(i/32) rounded to double and the library's polynomial coefficients. Lanes
// with |x| >= 88 or NaN (overflow, underflow, errno) are handed to std::exp itself.
// test_cpu_avx512's ExpMatchesLibm checks this against std::exp (and, run by hand,
// over every float: docs/performance.md).
//
// Include only from files compiled with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace tessera::cpu_avx512::kern {

namespace exp_detail {

// 2^(i/32), i = 0..31, rounded to double.
alignas(64) inline constexpr double kExp2Table[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};
inline constexpr double kInvLn2N = 0x1.71547652b82fep+5;  // 32 / ln 2
inline constexpr double kShift = 0x1.8p+52;               // rounds to an integer in the low bits
inline constexpr double kC0 = 0x1.c6af84b912394p-20;      // r^3
inline constexpr double kC1 = 0x1.ebfce50fac4f3p-13;      // r^2
inline constexpr double kC2 = 0x1.62e42ff0c52d6p-6;       // r

// Eight lanes in double; the table index and exponent come from the low bits of kd.
inline __m256 exp8(__m256 x) {
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d kd_shifted = _mm512_fmadd_pd(_mm512_set1_pd(kInvLn2N), xd, _mm512_set1_pd(kShift));
  const __m512i ki = _mm512_castpd_si512(kd_shifted);
  const __m512d kd = _mm512_sub_pd(kd_shifted, _mm512_set1_pd(kShift));
  const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(kInvLn2N), xd, kd);
  // Table entry ki % 32: two 16-entry permutes, bit 4 picks between them.
  const __m512d* tab = reinterpret_cast<const __m512d*>(kExp2Table);
  const __m512d lo = _mm512_permutex2var_pd(tab[0], ki, tab[1]);
  const __m512d hi = _mm512_permutex2var_pd(tab[2], ki, tab[3]);
  const __mmask8 upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
  const __m512i t = _mm512_castpd_si512(_mm512_mask_blend_pd(upper, lo, hi));
  // Scale by 2^(k / 32): add k >> 5 to the exponent field (the low 5 bits of ki shift
  // out of the 64-bit word, as in the library's ki << 47 added to the entry's bits
  // minus i << 47).
  const __m512i k_exp = _mm512_slli_epi64(_mm512_srai_epi64(_mm512_slli_epi64(ki, 32), 37), 52);
  const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, k_exp));
  const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(kC0), r, _mm512_set1_pd(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(kC2), r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

}  // namespace exp_detail

// expf of 16 lanes (lanes outside m are not read by callers; they are computed anyway).
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_castps256_ps512(exp_detail::exp8(_mm512_castps512_ps256(x)));
  __m512 y = _mm512_insertf32x8(lo, exp_detail::exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), 1);
  // |x| >= 88 or NaN: the library's special paths (overflow, underflow, inf, NaN).
  const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7FF));
  const __mmask16 special = _mm512_cmpge_epu32_mask(top, _mm512_set1_epi32(0x42B));
  if (special) [[unlikely]] {
    alignas(64) float xs[16], ys[16];
    _mm512_store_ps(xs, x);
    _mm512_store_ps(ys, y);
    for (int i = 0; i < 16; ++i)
      if (special & (1u << i)) ys[i] = std::exp(xs[i]);
    y = _mm512_load_ps(ys);
  }
  return y;
}

}  // namespace tessera::cpu_avx512::kern
