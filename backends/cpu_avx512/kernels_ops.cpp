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
#include <vector>

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

namespace {

// gelu of every F16 value (by its bits), rounded to F16 and widened back.
const float* gelu_f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(size_t(1) << 16);
    for (uint32_t b = 0; b < t.size(); ++b) {
      const float h = _cvtsh_ss(uint16_t(b));
      const float y = 0.5f * h * (1.0f + std::tanh(0.79788456080286535588f * h * (1.0f + 0.044715f * h * h)));
      t[b] = _cvtsh_ss(_cvtss_sh(y, _MM_FROUND_TO_NEAREST_INT));
    }
    return t;
  }();
  return table.data();
}

}  // namespace

void geglu_row(const float* g, const float* u, float* y, int64_t K) {
  const float* table = gelu_f16_table();
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + k);
    const __m512i bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, bits, table, 4);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), x);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), _mm512_setzero_ps());
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + k)));
  }
}

void swiglu_oai_row(const float* g, const float* u, float* y, int64_t K, float alpha, float limit) {
  const __m512 va = _mm512_set1_ps(alpha), vl = _mm512_set1_ps(limit), one = _mm512_set1_ps(1.0f);
  const __m512 vnl = _mm512_set1_ps(-limit);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    // std::min / std::clamp keep the first operand when neither is less (NaN included).
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + k), uv = _mm512_maskz_loadu_ps(m, u + k);
    const __m512 x = _mm512_mask_mov_ps(gv, _mm512_cmp_ps_mask(vl, gv, _CMP_LT_OQ), vl);
    __m512 v = _mm512_mask_mov_ps(uv, _mm512_cmp_ps_mask(uv, vnl, _CMP_LT_OQ), vnl);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(vl, v, _CMP_LT_OQ), vl);
    const __m512 e = exp16(_mm512_mul_ps(va, _mm512_xor_ps(x, _mm512_set1_ps(-0.0f))));
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_add_ps(v, one)));
  }
}

void exp_row(const float* x, float* y, int64_t K) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, exp16(_mm512_maskz_loadu_ps(m, x + k)));
  }
}

void normalize_row(const float* x, float* y, int64_t K, float scale, float min_sum) {
  double sum = 0.0;
  for (int64_t k = 0; k < K; ++k) sum += double(x[k]);
  const __m512 s = _mm512_set1_ps(std::max(float(sum), min_sum)), vs = _mm512_set1_ps(scale);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + k), s), vs));
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

namespace {

// One position of the online softmax, as cpu_scalar takes it: a score above the
// maximum becomes the maximum and gives the factor on what was summed so far (ms);
// any other gives the position's weight (vs). Returns whether the maximum grew.
inline bool softmax_step(float s, float& M, float& ms, float& vs) {
  ms = vs = 1.0f;
  if (s > M) {
    ms = std::exp(M - s);
    M = s;
    return true;
  }
  vs = std::exp(s - M);
  return false;
}

// The sink folded in after the positions, as cpu_scalar does: a new maximum scales
// what was summed (by the returned factor), else the sink only adds to the sum.
inline float fold_sink(float M, float& S, float sink) {
  if (sink > M) {
    const float ms = std::exp(M - sink);
    S = S * ms + 1.0f;
    return ms;
  }
  S += std::exp(sink - M);
  return 1.0f;
}

}  // namespace

void attention_item(const float* q, int64_t hd, const uint16_t* const* krows, const uint16_t* const* vrows,
                    int64_t off, int64_t L, float scale, float* out, const float* sink) {
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
    float ms, vs;
    if (softmax_step(_mm512_reduce_add_ps(d) * scale, M, ms, vs)) {
      const __m512 vms = _mm512_set1_ps(ms);
      for (int c = 0; c < nch; ++c) acc[c] = round_f16(_mm512_mul_ps(acc[c], vms));
    }
    const uint16_t* vr = vrows[j] + off;
    const __m512 vvs = _mm512_set1_ps(vs);
    for (int c = 0; c < nch; ++c)
      acc[c] = round_f16(
          _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[c], vr + 16 * c)), vvs)));
    S = S * ms + vs;
  }
  const __m512 f = _mm512_set1_ps(sink ? fold_sink(M, S, *sink) : 1.0f);
  const __m512 inv = _mm512_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
  for (int c = 0; c < nch; ++c) _mm512_mask_storeu_ps(out + 16 * c, mk[c], _mm512_mul_ps(_mm512_mul_ps(acc[c], f), inv));
}

void attention_heads_dv(const float* const* q, float* const* out, int heads, int64_t hd, int64_t dv,
                        const uint16_t* const* krows, const uint16_t* const* vrows, int64_t koff, int64_t voff,
                        int64_t L, float scale, const float* sinks) {
  constexpr int64_t P = 16;  // positions a block: one per lane of the dot products
  const int64_t nvc = (dv + 15) / 16;
  // Scratch kept per thread: this runs once per (token, head group) and layer.
  thread_local std::vector<float> qf, kt, vf, acc, M, S;
  qf.resize(size_t(heads * hd));
  kt.resize(size_t(hd * P));
  vf.assign(size_t(P * nvc * 16), 0.0f);
  acc.assign(size_t(heads * nvc * 16), 0.0f);
  M.assign(size_t(heads), -INFINITY);
  S.assign(size_t(heads), 0.0f);
  for (int h = 0; h < heads; ++h)
    for (int64_t d = 0; d < hd; ++d) qf[size_t(h * hd + d)] = _cvtsh_ss(_cvtss_sh(q[h][d], _MM_FROUND_TO_NEAREST_INT));
  alignas(64) float dots[P];
  for (int64_t j0 = 0; j0 < L; j0 += P) {
    const int64_t n = std::min(P, L - j0);
    // The block's keys transposed (kt[d * P + p]: position p's value d) and its values
    // widened, shared by every head.
    for (int64_t p = 0; p < P; ++p)
      for (int64_t d = 0; d < hd; ++d) kt[size_t(d * P + p)] = p < n ? _cvtsh_ss(krows[j0 + p][koff + d]) : 0.0f;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t d = 0; d < dv; ++d) vf[size_t(p * nvc * 16 + d)] = _cvtsh_ss(vrows[j0 + p][voff + d]);
    for (int h = 0; h < heads; ++h) {
      // 16 positions' dot products at once, each summed over d in order with a
      // multiply and an add, as cpu_scalar sums one.
      __m512 dot = _mm512_setzero_ps();
      const float* qh = &qf[size_t(h * hd)];
      for (int64_t d = 0; d < hd; ++d)
        dot = _mm512_add_ps(dot, _mm512_mul_ps(_mm512_set1_ps(qh[d]), _mm512_loadu_ps(&kt[size_t(d * P)])));
      _mm512_store_ps(dots, dot);
      float* a = &acc[size_t(h * nvc * 16)];
      float& m = M[size_t(h)];
      float& sum = S[size_t(h)];
      for (int64_t p = 0; p < n; ++p) {
        float ms, vs;
        if (softmax_step(dots[p] * scale, m, ms, vs)) {
          const __m512 vms = _mm512_set1_ps(ms);
          for (int64_t c = 0; c < nvc; ++c)
            _mm512_storeu_ps(a + 16 * c, round_f16(_mm512_mul_ps(_mm512_loadu_ps(a + 16 * c), vms)));
        }
        const __m512 vvs = _mm512_set1_ps(vs);
        const float* v = &vf[size_t(p * nvc * 16)];
        for (int64_t c = 0; c < nvc; ++c)
          _mm512_storeu_ps(a + 16 * c, round_f16(_mm512_add_ps(_mm512_loadu_ps(a + 16 * c),
                                                               _mm512_mul_ps(_mm512_loadu_ps(v + 16 * c), vvs))));
        sum = sum * ms + vs;
      }
    }
  }
  for (int h = 0; h < heads; ++h) {
    float sum = S[size_t(h)];
    const __m512 f = _mm512_set1_ps(sinks ? fold_sink(M[size_t(h)], sum, sinks[h]) : 1.0f);
    const __m512 inv = _mm512_set1_ps(sum == 0.0f ? 0.0f : 1.0f / sum);
    const float* a = &acc[size_t(h * nvc * 16)];
    for (int64_t c = 0; c < nvc; ++c) {
      const __mmask16 mk = tail_mask(dv - 16 * c);
      _mm512_mask_storeu_ps(out[h] + 16 * c, mk, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(a + 16 * c), f), inv));
    }
  }
}

namespace {

// Row j of F16 K or V rows as NCH float vectors; requests row j + 8. One head's rows
// are a whole KV row apart and each page of positions lies anywhere, beyond what the
// hardware prefetchers follow (docs/performance.md has BM_Attention with and without).
template <int NCH>
inline void load_row_ahead(const uint16_t* const* rows, int64_t off, int64_t j, int64_t L, __m512* out) {
  constexpr int64_t kAhead = 8;
  if (j + kAhead < L)
    for (int c = 0; c < NCH; c += 2)
      _mm_prefetch(reinterpret_cast<const char*>(rows[j + kAhead] + off + 16 * c), _MM_HINT_T0);
  const uint16_t* r = rows[j] + off;
  for (int c = 0; c < NCH; ++c) out[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 16 * c)));
}

inline __m512i lane_idx() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

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

// A tile of up to 16 query rows (query tokens x heads) that read one KV head, each
// row's running max, sum and F16 accumulator advancing exactly as in attention_item,
// in three passes over blocks of positions. The vector lanes hold RG rows x 16 / RG
// positions (RG = 16 for a prefill's 16 rows, 8 or 4 for a decode step's query heads,
// so the lanes stay full):
//   1. the scores: each K row is loaded once for all rows, 16 dot products summed
//      across their lanes together (reduce_add16);
//   2. per position, the rows' running maxima and sums, and the exps of 16 lanes at
//      once (exp16);
//   3. per position, each row's F16 accumulator, which stays in memory (vcvtph2ps
//      from it, vcvtps2ph to it: faster here than the register round trip), the rows
//      giving every position several independent chains.
// Rows are in order of non-decreasing length; a row takes no part past its length.
template <int NCH, int RG>
void attention_tile_fixed(const float* const* q, float* const* out, const int64_t* len, int R,
                          const uint16_t* const* krows, const uint16_t* const* vrows, int64_t off, float scale,
                          const float* sinks) {
  constexpr int P = 16 / RG;                // positions per vector
  constexpr int64_t kBlock = 64, kGroups = kBlock / P;
  constexpr int HD = 16 * NCH;
  alignas(64) float qf[RG][HD];        // F16-rounded queries; rows past R are zero
  alignas(64) uint16_t acc[RG][HD];    // F16 accumulators
  alignas(64) float e[kGroups][16];    // lane p * RG + r: pass 1 the scores, pass 2 the weights
  alignas(64) float ms[kGroups][16];   // pass 2: the factors on what was summed so far
  __mmask16 newmax[kGroups];
  alignas(64) int32_t lens[16];
  for (int r = 0; r < RG; ++r)
    for (int c = 0; c < NCH; ++c) {
      const __m512 v = r < R ? _mm512_loadu_ps(q[r] + 16 * c) : _mm512_setzero_ps();
      _mm512_store_ps(qf[r] + 16 * c, _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(acc[r] + 16 * c), _mm256_setzero_si256());
    }
  for (int l = 0; l < 16; ++l) lens[l] = l % RG < R ? int32_t(len[l % RG]) : 0;
  const __m512i vlen = _mm512_load_si512(lens);
  const __m512i lane_pos = _mm512_srli_epi32(lane_idx(), __builtin_ctz(RG));  // lane's position in its vector
  const int64_t L = len[R - 1];
  // Running max and sum of row r in lane r.
  __m512 M = _mm512_set1_ps(-INFINITY), S = _mm512_setzero_ps();
  const __m512 vscale = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
  int rb = 0;  // rows [rb, R) are still within their length
  for (int64_t j0 = 0; j0 < L; j0 += kBlock) {
    const int64_t n = std::min(kBlock, L - j0), ng = (n + P - 1) / P;
    for (int64_t g = 0; g < ng; ++g) {
      __m512 d[16];
      for (int p = 0; p < P; ++p) {
        const int64_t j = g * P + p;
        if (P > 1 && j >= n) {
          for (int r = 0; r < RG; ++r) d[kTransposed[p * RG + r]] = _mm512_setzero_ps();
          continue;
        }
        __m512 k[NCH];
        load_row_ahead<NCH>(krows, off, j0 + j, L, k);
        for (int r = 0; r < RG; ++r) {
          __m512 s = _mm512_setzero_ps();
          for (int c = 0; c < NCH; ++c) s = _mm512_fmadd_ps(_mm512_load_ps(qf[r] + 16 * c), k[c], s);
          d[kTransposed[p * RG + r]] = s;
        }
      }
      _mm512_store_ps(e[g], _mm512_mul_ps(reduce_add16(d), vscale));
    }
    for (int64_t g = 0; g < ng; ++g) {
      // lanes whose position is within their row's length
      const __mmask16 act =
          _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_set1_epi32(int32_t(j0 + g * P)), lane_pos), vlen);
      const __m512 sc = _mm512_maskz_load_ps(act, e[g]);
      // exp of sc - M is the position's weight, of M - sc (a new maximum) the factor
      // on what was summed so far; the positions of a vector in order (P > 1: each
      // moved to lanes [0, RG) for its step); lanes past their length see exp(0)
      __mmask16 gt = 0;
      __m512 x = _mm512_setzero_ps();
      for (int p = 0; p < P; ++p) {
        const __mmask16 ap = __mmask16((act >> (p * RG)) & tail_mask(RG));
        const __m512i down = _mm512_add_epi32(lane_idx(), _mm512_set1_epi32(p * RG));
        const __m512 sp = p ? _mm512_permutexvar_ps(down, sc) : sc;
        const __mmask16 gp = _mm512_mask_cmp_ps_mask(ap, sp, M, _CMP_GT_OQ);
        const __m512 xp = _mm512_maskz_mov_ps(ap, _mm512_mask_sub_ps(_mm512_sub_ps(sp, M), gp, M, sp));
        M = _mm512_mask_mov_ps(M, gp, sp);
        if (P == 1) {
          x = xp;
          gt = gp;
        } else {
          x = _mm512_mask_permutexvar_ps(x, __mmask16(tail_mask(RG) << (p * RG)),
                                         _mm512_sub_epi32(lane_idx(), _mm512_set1_epi32(p * RG)), xp);
          gt = __mmask16(gt | (gp << (p * RG)));
        }
      }
      const __m512 ex = exp16(x);
      const __m512 vm = _mm512_mask_mov_ps(one, gt, ex), vs = _mm512_mask_mov_ps(ex, gt, one);
      for (int p = 0; p < P; ++p) {
        const __mmask16 ap = __mmask16((act >> (p * RG)) & tail_mask(RG));
        const __m512i down = _mm512_add_epi32(lane_idx(), _mm512_set1_epi32(p * RG));
        const __m512 mp = p ? _mm512_permutexvar_ps(down, vm) : vm, wp = p ? _mm512_permutexvar_ps(down, vs) : vs;
        S = _mm512_mask_add_ps(S, ap, _mm512_mul_ps(S, mp), wp);
      }
      _mm512_store_ps(e[g], vs);
      _mm512_store_ps(ms[g], vm);
      newmax[g] = gt;
    }
    for (int64_t j = 0; j < n; ++j) {
      while (rb < R && len[rb] <= j0 + j) ++rb;
      __m512 v[NCH];
      load_row_ahead<NCH>(vrows, off, j0 + j, L, v);
      const int64_t g = j / P, l0 = j % P * RG;
      for (unsigned m = unsigned(newmax[g] >> l0) & ((1u << RG) - 1); m; m &= m - 1) {
        const int r = __builtin_ctz(m);
        const __m512 f = _mm512_set1_ps(ms[g][l0 + r]);
        for (int c = 0; c < NCH; ++c) {
          __m256i* a = reinterpret_cast<__m256i*>(acc[r] + 16 * c);
          _mm256_store_si256(a, _mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256(a)), f),
                                                _MM_FROUND_TO_NEAREST_INT));
        }
      }
      for (int r = rb; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(e[g][l0 + r]);
        for (int c = 0; c < NCH; ++c) {
          __m256i* a = reinterpret_cast<__m256i*>(acc[r] + 16 * c);
          const __m512 t = _mm512_add_ps(_mm512_cvtph_ps(_mm256_load_si256(a)), _mm512_mul_ps(v[c], w));
          _mm256_store_si256(a, _mm512_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT));
        }
      }
    }
  }
  alignas(64) float sums[16], maxes[16], fs[16];
  _mm512_store_ps(sums, S);
  _mm512_store_ps(maxes, M);
  for (int r = 0; r < R; ++r) fs[r] = sinks ? fold_sink(maxes[r], sums[r], sinks[r]) : 1.0f;
  for (int r = 0; r < R; ++r) {
    const __m512 f = _mm512_set1_ps(fs[r]);
    const __m512 inv = _mm512_set1_ps(sums[r] == 0.0f ? 0.0f : 1.0f / sums[r]);
    for (int c = 0; c < NCH; ++c) {
      const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc[r] + 16 * c));
      _mm512_storeu_ps(out[r] + 16 * c, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(a), f), inv));
    }
  }
}

template <int NCH>
void attention_tile_by(const float* const* q, float* const* out, const int64_t* len, int R,
                       const uint16_t* const* krows, const uint16_t* const* vrows, int64_t off, float scale,
                       const float* sinks) {
  if (R <= 4) return attention_tile_fixed<NCH, 4>(q, out, len, R, krows, vrows, off, scale, sinks);
  if (R <= 8) return attention_tile_fixed<NCH, 8>(q, out, len, R, krows, vrows, off, scale, sinks);
  return attention_tile_fixed<NCH, 16>(q, out, len, R, krows, vrows, off, scale, sinks);
}

}  // namespace

void attention_tile(const float* const* q, float* const* out, const int64_t* len, int rows, int64_t hd,
                    const uint16_t* const* krows, const uint16_t* const* vrows, int64_t off, float scale,
                    const float* sinks) {
  if (rows <= 0) return;
  switch (hd) {
    case 64: return attention_tile_by<4>(q, out, len, rows, krows, vrows, off, scale, sinks);
    case 128: return attention_tile_by<8>(q, out, len, rows, krows, vrows, off, scale, sinks);
    default:
      for (int r = 0; r < rows; ++r)
        attention_item(q[r], hd, krows, vrows, off, len[r], scale, out[r], sinks ? sinks + r : nullptr);
  }
}

}  // namespace tessera::cpu_avx512::kern
