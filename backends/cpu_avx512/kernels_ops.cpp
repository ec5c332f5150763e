// AVX-512 kernels of the small ops (compiled with AVX-512 flags). Same arithmetic as
// cpu_scalar up to float rounding: RMS sums in double, softmax sum in double, exp
// equal to libm's expf like the reference's (exp16, kernels_exp.h; so the next
// activation quantization sees identical values), attention with F16-rounded q, F16
// K/V converted in registers, an online softmax in F32 and the V weighted sum kept
// in F16 between steps (llama.cpp's CPU flash attention; see cpu_scalar).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "kernels_exp.h"
#include "kernels_simd.h"

namespace tessera::cpu_avx512::kern {

void rms_norm_row(const float* x, const float* w, float* y, int64_t K, float eps) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    const __m512 sq = _mm512_mul_ps(v, v);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
  }
  const double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const float mean = float(sum / double(K));
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(mean + eps));
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), scale);
    if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + k));
    _mm512_mask_storeu_ps(y + k, m, v);
  }
}

void softmax_row(const float* x, float* y, int64_t K) {
  // Vector max and exp (libm's, exp16); the double sum per element in order, as the
  // reference adds.
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t k = 0; k < K; k += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(K - k), x + k));
  const float vmax = _mm512_reduce_max_ps(mx);
  const __m512 vm = _mm512_set1_ps(vmax);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + k), vm)));
  }
  double sum = 0.0;
  for (int64_t k = 0; k < K; ++k) sum += double(y[k]);
  const __m512 inv = _mm512_set1_ps(float(1.0 / sum));
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + k), inv));
  }
}

// Silu/SwiGlu: the reference's float operations per element with its exp (exp16 is
// libm's expf bit for bit): a polynomial exp off by an ulp would move values across
// the rounding boundaries of the next MatMul's activation quantization, which shows
// up as ~1e-6 NMSE in model logits.
// v / (1 + exp(-v)), the reference's operations.
inline __m512 silu16(__m512 v) {
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)))));
}

void silu_row(const float* x, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, silu16(_mm512_maskz_loadu_ps(m, x + k)));
  }
}

void swiglu_row(const float* g, const float* u, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(m, g + k)), _mm512_maskz_loadu_ps(m, u + k)));
  }
}

void exp_row(const float* x, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, exp16(_mm512_maskz_loadu_ps(m, x + k)));
  }
}

void add_row(const float* a, const float* b, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k)));
  }
}

void mul_row(const float* a, const float* b, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k)));
  }
}

void moe_combine_row(const float* const* e, const float* w, int64_t k, float* y, int64_t N) {
  for (int64_t i = 0; i < N; i += 16) {
    const __mmask16 m = tail_mask(N - i);
    __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, e[0] + i), _mm512_set1_ps(w[0]));
    for (int64_t j = 1; j < k; ++j)  // product rounded, then the sum: the reference's order
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, e[j] + i), _mm512_set1_ps(w[j])));
    _mm512_mask_storeu_ps(y + i, m, acc);
  }
}

int64_t argmax_row(const float* x, int64_t K) {
  // First maximum, like the reference (NaNs never compare greater).
  int64_t best = 0;
  float bv = x[0];
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, _mm512_set1_ps(bv), _CMP_GT_OQ);
    if (gt) {
      for (int l = 0; l < 16; ++l)
        if (x[k + l] > bv) bv = x[k + l], best = k + l;
    }
  }
  for (; k < K; ++k)
    if (x[k] > bv) bv = x[k], best = k;
  return best;
}

// Round to nearest even like quant::fp32_to_fp16, which also maps every NaN to the
// quiet NaN 0x7E00 with its sign (the hardware would keep the payload).
void f32_to_f16_row(const float* x, uint16_t* y, int64_t K) {
  const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), inf);
    if (nan) {
      const __m256i qn = _mm512_cvtepi32_epi16(
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7E00)));
      h = _mm256_mask_mov_epi16(h, nan, qn);
    }
    _mm256_mask_storeu_epi16(y + k, m, h);
  }
}

// Round every lane to F16 and back (the accumulator's storage precision).
inline __m512 round_f16(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

void attention_item(const float* q, int64_t hd, const uint16_t* const* krows, const uint16_t* const* vrows,
                    int64_t off, int64_t L, float scale, float* out) {
  constexpr int kMaxChunks = 64;  // hd <= 1024 (checked by supports())
  const int nch = int((hd + 15) / 16);
  __m512 qf[kMaxChunks], acc[kMaxChunks];
  __mmask16 mk[kMaxChunks];
  for (int c = 0; c < nch; ++c) {
    mk[c] = tail_mask(hd - 16 * c);
    qf[c] = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_maskz_loadu_ps(mk[c], q + 16 * c), _MM_FROUND_TO_NEAREST_INT));
    acc[c] = _mm512_setzero_ps();
  }
  float M = -INFINITY, S = 0.0f;
  for (int64_t j = 0; j < L; ++j) {
    const uint16_t* kr = krows[j] + off;
    __m512 d = _mm512_setzero_ps();
    for (int c = 0; c < nch; ++c)
      d = _mm512_fmadd_ps(qf[c], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[c], kr + 16 * c)), d);
    const float s = _mm512_reduce_add_ps(d) * scale;
    float ms = 1.0f, vs = 1.0f;
    if (s > M) {
      const float Mold = M;
      M = s;
      ms = std::exp(Mold - M);
      const __m512 vms = _mm512_set1_ps(ms);
      for (int c = 0; c < nch; ++c) acc[c] = round_f16(_mm512_mul_ps(acc[c], vms));
    } else {
      vs = std::exp(s - M);
    }
    const uint16_t* vr = vrows[j] + off;
    const __m512 vvs = _mm512_set1_ps(vs);
    for (int c = 0; c < nch; ++c)
      acc[c] = round_f16(
          _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[c], vr + 16 * c)), vvs)));
    S = S * ms + vs;
  }
  const __m512 inv = _mm512_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
  for (int c = 0; c < nch; ++c) _mm512_mask_storeu_ps(out + 16 * c, mk[c], _mm512_mul_ps(acc[c], inv));
}

namespace {

// Row j of F16 K or V rows as NCH float vectors; requests row j + 8. One head's rows
// are a whole KV row apart and each page of positions lies anywhere; the request made
// BM_Attention 1.05x (head 64) to 1.6x (head 128) faster at 2048 positions.
template <int NCH>
inline void load_row_ahead(const uint16_t* const* rows, int64_t off, int64_t j, int64_t L, __m512* out) {
  constexpr int64_t kAhead = 8;
  if (j + kAhead < L)
    for (int c = 0; c < NCH; c += 2)
      _mm_prefetch(reinterpret_cast<const char*>(rows[j + kAhead] + off + 16 * c), _MM_HINT_T0);
  const uint16_t* r = rows[j] + off;
  for (int c = 0; c < NCH; ++c) out[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 16 * c)));
}

// The horizontal sums of 16 vectors as one vector, each sum paired exactly as
// _mm512_reduce_add_ps pairs it (lanes i and i + 8, then i and i + 4 of those, then k
// and k ^ 2, then 0 and 1), so every sum is bit-identical to it, in 45 instructions
// instead of 16 x 9. Lane l holds the sum of v[kTransposed[l]]: store the vector meant
// for lane l at v[kTransposed[l]] (the map is its own inverse).
constexpr int kTransposed[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
inline __m512 reduce_add16(const __m512* v) {
  auto c1 = [](__m512 a, __m512 b) {  // lanes i + (i + 8): [a_lo + a_hi | b_lo + b_hi]
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  auto c2 = [](__m512 a, __m512 b) {  // i + (i + 4) in each 8-lane half
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  auto c3 = [](__m512 a, __m512 b) {  // k + (k ^ 2) in each 4-lane group
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  auto c4 = [](__m512 a, __m512 b) {  // 0 + 1
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  __m512 l1[8], l2[4];
  for (int i = 0; i < 8; ++i) l1[i] = c1(v[2 * i], v[2 * i + 1]);
  for (int i = 0; i < 4; ++i) l2[i] = c2(l1[2 * i], l1[2 * i + 1]);
  return c4(c3(l2[0], l2[1]), c3(l2[2], l2[3]));
}

// G query heads of one KV head, head size 16 * NCH, in registers. Per position each
// head's running max, sum and F16 accumulator advance exactly as in attention_item
// (same operations in the same order), in three passes over blocks of positions:
//   1. the scores (each as attention_item computes it), for the G heads at once, so
//      each K row is loaded once for the G heads; 16 positions' dot products are
//      summed across their lanes together (reduce_add16);
//   2. the running maxima, in order, and the one exp each position needs (of the old
//      max minus a new maximum, or of the score minus the max), 16 at a time (exp16,
//      equal to libm's expf);
//   3. the F16 accumulators and sums, in order: the only pass with a dependency chain
//      per position, now G independent chains of mul/add/F16 round trips.
template <int NCH, int G>
void attention_heads_fixed(const float* const* q, const uint16_t* const* krows, const uint16_t* const* vrows,
                           int64_t off, int64_t L, float scale, float* const* out) {
  constexpr int64_t kBlock = 64;
  __m512 qf[G][NCH], acc[G][NCH];
  float M[G], S[G];
  alignas(64) float e[G][kBlock];     // pass 1: scores; pass 2: their exps
  bool newmax[G][kBlock];
  for (int g = 0; g < G; ++g) {
    M[g] = -INFINITY, S[g] = 0.0f;
    for (int c = 0; c < NCH; ++c) {
      qf[g][c] = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(q[g] + 16 * c), _MM_FROUND_TO_NEAREST_INT));
      acc[g][c] = _mm512_setzero_ps();
    }
  }
  for (int64_t j0 = 0; j0 < L; j0 += kBlock) {
    const int64_t n = std::min(kBlock, L - j0);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < n; j += 16) {
      __m512 d[G][16];  // position j + i's lane products at d[g][kTransposed[i]]
      const int m = int(std::min<int64_t>(16, n - j));
      for (int i = 0; i < m; ++i) {
        __m512 k[NCH];
        load_row_ahead<NCH>(krows, off, j0 + j + i, L, k);
        for (int g = 0; g < G; ++g) {
          __m512 s = _mm512_setzero_ps();
          for (int c = 0; c < NCH; ++c) s = _mm512_fmadd_ps(qf[g][c], k[c], s);
          d[g][kTransposed[i]] = s;
        }
      }
      for (int i = m; i < 16; ++i)
        for (int g = 0; g < G; ++g) d[g][kTransposed[i]] = _mm512_setzero_ps();
      for (int g = 0; g < G; ++g) _mm512_store_ps(e[g] + j, _mm512_mul_ps(reduce_add16(d[g]), vscale));
    }
    for (int g = 0; g < G; ++g) {
      float m = M[g];
      for (int64_t j = 0; j < n; ++j) {
        const float sc = e[g][j];
        newmax[g][j] = sc > m;
        if (sc > m) {
          e[g][j] = m - sc;  // exp of this is the factor on what was summed so far
          m = sc;
        } else {
          e[g][j] = sc - m;  // exp of this is the position's weight
        }
      }
      M[g] = m;
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 mk = tail_mask(n - j);
        _mm512_mask_storeu_ps(e[g] + j, mk, exp16(_mm512_maskz_loadu_ps(mk, e[g] + j)));
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      __m512 v[NCH];
      load_row_ahead<NCH>(vrows, off, j0 + j, L, v);
      for (int g = 0; g < G; ++g) {
        float ms = 1.0f, vs = 1.0f;
        if (newmax[g][j]) {
          ms = e[g][j];
          const __m512 vms = _mm512_set1_ps(ms);
          for (int c = 0; c < NCH; ++c) acc[g][c] = round_f16(_mm512_mul_ps(acc[g][c], vms));
        } else {
          vs = e[g][j];
        }
        const __m512 vvs = _mm512_set1_ps(vs);
        for (int c = 0; c < NCH; ++c) acc[g][c] = round_f16(_mm512_add_ps(acc[g][c], _mm512_mul_ps(v[c], vvs)));
        S[g] = S[g] * ms + vs;
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512 inv = _mm512_set1_ps(S[g] == 0.0f ? 0.0f : 1.0f / S[g]);
    for (int c = 0; c < NCH; ++c) _mm512_storeu_ps(out[g] + 16 * c, _mm512_mul_ps(acc[g][c], inv));
  }
}

template <int NCH, int G>
void attention_heads_by(const float* const* q, int n, const uint16_t* const* krows, const uint16_t* const* vrows,
                        int64_t off, int64_t L, float scale, float* const* out) {
  int g = 0;
  for (; g + G <= n; g += G) attention_heads_fixed<NCH, G>(q + g, krows, vrows, off, L, scale, out + g);
  for (; g < n; ++g) attention_heads_fixed<NCH, 1>(q + g, krows, vrows, off, L, scale, out + g);
}

}  // namespace

void attention_heads(const float* const* q, int n, int64_t hd, const uint16_t* const* krows,
                     const uint16_t* const* vrows, int64_t off, int64_t L, float scale, float* const* out) {
  switch (hd) {
    case 64: return attention_heads_by<4, 4>(q, n, krows, vrows, off, L, scale, out);
    case 128: return attention_heads_by<8, 2>(q, n, krows, vrows, off, L, scale, out);
    default:
      for (int g = 0; g < n; ++g) attention_item(q[g], hd, krows, vrows, off, L, scale, out[g]);
  }
}

}  // namespace tessera::cpu_avx512::kern
