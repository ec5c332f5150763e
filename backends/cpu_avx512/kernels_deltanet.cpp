#include "kernels_deltanet.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels_simd.h"

namespace tessera::cpu_avx512::kern {
namespace {

// y = x / max(|x|, eps)
void l2_normalize(const float* x, float* y, int64_t S, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < S; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(tail_mask(S - i), x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::max(std::sqrt(_mm512_reduce_add_ps(acc)), eps);
  const __m512 s = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < S; i += 16) {
    const __mmask16 m = tail_mask(S - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s));
  }
}

}  // namespace

void gated_delta_net_head(const DeltaNetHead& h) {
  const int64_t S = h.S;
  const float scale = 1.0f / std::sqrt(float(S));
  float* qn = h.scratch;
  float* kn = h.scratch + S;
  for (int64_t t = 0; t < h.T; ++t) {
    l2_normalize(h.q + t * h.qkv_stride, qn, S, h.eps);
    l2_normalize(h.k + t * h.qkv_stride, kn, S, h.eps);
    const float* v = h.v + t * h.qkv_stride;
    const __m512 decay = _mm512_set1_ps(std::exp(h.g[t * h.gb_stride]));
    const float beta = h.beta[t * h.gb_stride];
    float* out = h.out + t * h.out_stride;
    for (int64_t j = 0; j < S; ++j) {
      float* row = h.state + j * S;
      __m512 sk = _mm512_setzero_ps();
      for (int64_t i = 0; i < S; i += 16) {  // decay, and the row's prediction of v_j
        const __mmask16 m = tail_mask(S - i);
        const __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + i), decay);
        _mm512_mask_storeu_ps(row + i, m, r);
        sk = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(m, kn + i), sk);
      }
      const __m512 d = _mm512_set1_ps((v[j] - _mm512_reduce_add_ps(sk)) * beta);
      __m512 o = _mm512_setzero_ps();
      for (int64_t i = 0; i < S; i += 16) {  // delta-rule update, then the output dot
        const __mmask16 m = tail_mask(S - i);
        const __m512 r = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, kn + i), d, _mm512_maskz_loadu_ps(m, row + i));
        _mm512_mask_storeu_ps(row + i, m, r);
        o = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(m, qn + i), o);
      }
      out[j] = _mm512_reduce_add_ps(o) * scale;
    }
  }
}

}  // namespace tessera::cpu_avx512::kern
