// Quantization of float rows into every supported dtype.
//  - Q8_0, Q8_K (activations) and Q4_0 reproduce ggml's reference quantizers
//    bit for bit, since the reference quantizes activations that way.
//  - Q4_K, Q5_K, Q6_K follow the method of ggml's reference weight quantizers
//    (weighted least-squares search of scale and min per sub-block, then 6/8-bit
//    scale quantization and a final re-quantization against the stored scales).
//  - Q8_1 (activations) reproduces ggml's reference; Q4_1, Q5_0, Q5_1 and MXFP4 use
//    the method of ggml's reference quantizers; IQ4_NL a simpler nearest-grid fit.
//  - Q2_K, Q3_K and IQ4_XS have no quantizer (read from files only).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "quant_internal.h"
#include "tessera/error.h"

namespace tessera::quant {
using detail::get_scale_min_k4;
using detail::h2f;
using detail::nearest_int;
using detail::set_scale_min_k4;

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// The value of largest magnitude (the first of equal ones); 0 for an all-zero block.
float signed_absmax(const float* x, int n) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

// Activation blocks holding a NaN or an infinity get a NaN scale and all-zero levels
// (and sums), on every backend: the non-finite value then reaches every product the
// block enters, where the engine's non-finite-logits check sees it. Without this the
// max/abs search skips a NaN and its level converts to 0, so a NaN activation would
// silently become a zero (decision 90). Finite blocks are untouched.
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool any_non_finite(const float* x, int n) {
  bool bad = false;
  for (int j = 0; j < n; ++j) bad |= !std::isfinite(x[j]);
  return bad;
}

// One block of n values as int8 levels of scale amax / 127 (Q8_0's rounding: halves
// away from zero, as the reference); returns the unrounded scale.
float quant_block_q8(const float* x, int n, uint16_t& d_out, int8_t* qs) {
  if (any_non_finite(x, n)) {
    d_out = fp32_to_fp16(kNaN);
    std::memset(qs, 0, size_t(n));
    return kNaN;
  }
  float amax = 0.f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  d_out = fp32_to_fp16(d);
  for (int j = 0; j < n; ++j) qs[j] = int8_t(std::roundf(x[j] * id));
  return d;
}

// ---------------------------------------------------------------- 32-blocks

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) quant_block_q8(x, QK8_0, y[i].d, y[i].qs);
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    // The signed value of largest magnitude maps to -8, the one code with no +8 twin.
    const float max = signed_absmax(x, QK4_0);
    const float d = max / -8.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      // Truncation of (v + 8.5) rounds v to nearest (ties up) for v >= -8.5.
      const int q0 = std::clamp(int(x[j] * id + 8.5f), 0, 15);
      const int q1 = std::clamp(int(x[j + QK4_0 / 2] * id + 8.5f), 0, 15);
      y[i].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

// Q8_1 (activations of Q4_1 / Q5_1): Q8_0's quantization, plus s = fp16(d * sum)
// with the unrounded float d, as ggml's reference.
void quant_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    const float d = quant_block_q8(x, QK8_0, y[i].d, y[i].qs);
    int sum = 0;
    for (int j = 0; j < QK8_0; ++j) sum += y[i].qs[j];
    y[i].s = fp32_to_fp16(float(sum) * d);
  }
}

// Q4_1 / Q5_1: min/max mapping, levels rounded half up (ggml's reference).
template <int NMAX>
void minmax_levels(const float* x, uint16_t& d_out, uint16_t& m_out, uint8_t L[32]) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / NMAX;
  const float id = d != 0.f ? 1.f / d : 0.f;
  d_out = fp32_to_fp16(d);
  m_out = fp32_to_fp16(lo);
  for (int j = 0; j < 32; ++j) L[j] = uint8_t(std::min(NMAX, int((x[j] - lo) * id + 0.5f)));
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    minmax_levels<15>(x, y[i].d, y[i].m, L);
    for (int j = 0; j < 16; ++j) y[i].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
  }
}

void pack_q5(const uint8_t L[32], uint8_t qs[16], uint8_t qh_out[4]) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
    qh |= uint32_t(L[j] >> 4) << j;
    qh |= uint32_t(L[j + 16] >> 4) << (j + 16);
  }
  for (int b = 0; b < 4; ++b) qh_out[b] = uint8_t(qh >> (8 * b));
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    minmax_levels<31>(x, y[i].d, y[i].m, L);
    pack_q5(L, y[i].qs, y[i].qh);
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    const float max = signed_absmax(x, 32);
    const float d = max / -16.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) L[j] = uint8_t(std::clamp(int(x[j] * id + 16.5f), 0, 31));
    pack_q5(L, y[i].qs, y[i].qh);
  }
}

// Index of the grid value nearest to v (grid ascending over the given indices).
int nearest_index(const int8_t* grid, const int* order, int n, float v) {
  int best = order[0];
  float err = std::fabs(v - grid[best]);
  for (int k = 1; k < n; ++k) {
    const float e = std::fabs(v - grid[order[k]]);
    if (e < err) {
      err = e;
      best = order[k];
    }
  }
  return best;
}

// IQ4_NL: the largest-magnitude value maps to the grid end -127, then each value
// takes its nearest grid point; the scale is refit by least squares on those points.
void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb) {
  static const int order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    const float max = signed_absmax(x, 32), amax = std::fabs(max);
    if (amax < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockIQ4_NL));
      continue;
    }
    const float d0 = max / kIQ4NLValues[0];
    const float id = 1.f / d0;
    float sumqx = 0.f, sumq2 = 0.f;
    for (int j = 0; j < 32; ++j) {
      L[j] = uint8_t(nearest_index(kIQ4NLValues, order, 16, x[j] * id));
      const float q = kIQ4NLValues[L[j]];
      sumqx += q * x[j];
      sumq2 += q * q;
    }
    y[i].d = fp32_to_fp16(sumq2 > 0.f ? sumqx / sumq2 : d0);
    for (int j = 0; j < 16; ++j) y[i].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
  }
}

// MXFP4 (ggml's reference): shared exponent e = floor(log2(amax)) - 2 + 127, so
// amax / 2^(e-127) lies in [4, 8); each value then takes the nearest E2M1 level.
void quant_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  static const int order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 8};
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const int e = amax > 0.f ? std::clamp(int(std::floor(std::log2(amax))) - 2 + 127, 0, 254) : 0;
    y[i].e = uint8_t(e);
    const float d = e8m0_to_fp32_half(uint8_t(e));
    for (int j = 0; j < 16; ++j) {
      const int a = nearest_index(kMXFP4Values, order, 15, x[j] / d);
      const int b = nearest_index(kMXFP4Values, order, 15, x[j + 16] / d);
      y[i].qs[j] = uint8_t(a | (b << 4));
    }
  }
}

// ---------------------------------------------------------------- K-quant helpers

// Fit x[i] ~= scale * L[i] - mn with L in [0, nmax] and mn >= 0, minimising the
// weighted squared error. Starts from the plain min/max mapping, then tries
// nstep+1 slightly different step sizes; for each candidate set of levels the
// optimal (scale, min) has a closed form (2x2 weighted least squares).
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* mn,
                    float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0];
  float sum_w = 0.f, sum_x = 0.f;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0.f) lo = 0.f;  // the offset only ever subtracts
  if (hi == lo) {
    std::fill(L, L + n, uint8_t(0));
    *mn = -lo;
    return 0.f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1.f / iscale;
  float best_err = 0.f;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * L[i] + lo - x[i];
    best_err += w[i] * diff * diff;
  }
  uint8_t cand[QK_K];
  for (int s = 0; s <= nstep; ++s) {
    const float is = (rmin + rdelta * s + nmax) / (hi - lo);
    float sl = 0.f, sl2 = 0.f, sxl = 0.f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(is * (x[i] - lo)), 0, nmax);
      cand[i] = uint8_t(l);
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    const float det = sum_w * sl2 - sl * sl;
    if (det <= 0.f) continue;
    float this_scale = (sum_w * sxl - sum_x * sl) / det;
    float this_min = (sl2 * sum_x - sl * sxl) / det;
    if (this_min > 0.f) {  // a positive offset is not representable: refit scale alone
      this_min = 0.f;
      this_scale = sxl / sl2;
    }
    float err = 0.f;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * cand[i] + this_min - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best_err) {
      std::memcpy(L, cand, size_t(n));
      best_err = err;
      scale = this_scale;
      lo = this_min;
    }
  }
  *mn = -lo;
  return scale;
}

// Symmetric fit x[i] ~= scale * (L[i] - nmax), L in [0, 2*nmax-1], weights x^2
// (what ggml's Q6_K reference uses). Tries 19 step sizes around the one that maps
// the largest-magnitude value to -nmax and keeps the best least-squares scale.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t(0));
    return 0.f;
  }
  auto level = [&](float iscale, int i) {
    return std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
  };
  float iscale = -nmax / max;
  float sumlx = 0.f, suml2 = 0.f;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.f;
  float best = scale * sumlx;  // the error falls as sumlx^2/suml2 rises
  for (int s = -9; s <= 9; ++s) {
    if (s == 0) continue;
    const float is = -(nmax + 0.1f * s) / max;
    sumlx = suml2 = 0.f;
    for (int i = 0; i < n; ++i) {
      const int l = level(is, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0.f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(level(is, i) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): eight 32-element sub-blocks, each
// with a 6-bit scale and a 6-bit min, relative to the fp16 super-scales d, dmin.
// Produces the packed scale bytes, d, dmin and the final levels L[256].
void quant_kx_scales(const float* x, int nmax, float rmin, float rdelta, int nstep,
                     uint8_t scales_out[K_SCALE_SIZE], uint16_t& d_out, uint16_t& dmin_out,
                     uint8_t L[QK_K]) {
  float scales[QK_K / 32], mins[QK_K / 32], w[32];
  float max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < QK_K / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.f);
    // Large values matter more, but small ones keep a floor weight.
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.f ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0.f ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, K_SCALE_SIZE);
  for (int j = 0; j < QK_K / 32; ++j) {
    const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(63, nearest_int(inv_min * mins[j]));
    set_scale_min_k4(j, scales_out, uint8_t(ls), uint8_t(lm));
  }
  d_out = fp32_to_fp16(max_scale / 63.f);
  dmin_out = fp32_to_fp16(max_min / 63.f);
  // Re-quantize against the scales actually stored, so rounding of the 6-bit
  // scales and fp16 super-scales is absorbed by the levels.
  const float d = h2f(d_out), dmin = h2f(dmin_out);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, scales_out, sc, m);
    const float ds = d * sc;
    if (ds == 0.f) continue;
    const float dm = dmin * m;
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] = uint8_t(std::clamp(nearest_int((x[32 * j + l] + dm) / ds), 0, nmax));
  }
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_kx_scales(x, 15, -1.f, 0.1f, 20, y[i].scales, y[i].d, y[i].dmin, L);
    uint8_t* q = y[i].qs;
    for (int c = 0; c < QK_K; c += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[c + l] | (L[c + l + 32] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_kx_scales(x, 31, -0.5f, 0.1f, 15, y[i].scales, y[i].d, y[i].dmin, L);
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    uint8_t* ql = y[i].qs;
    for (int c = 0; c < 4; ++c, ql += 32) {
      for (int l = 0; l < 32; ++l) {
        const int a = L[64 * c + l], b = L[64 * c + l + 32];
        y[i].qh[l] |= uint8_t(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
        ql[l] = uint8_t((a & 0xF) | ((b & 0xF) << 4));
      }
    }
  }
}

void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0.f, max_abs = 0.f;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs) {
        max_abs = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    // The sub-block scales are int8: the largest-magnitude one maps to -128.
    const float iscale = -128.f / max_scale;
    y[i].d = fp32_to_fp16(1.f / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib)
      y[i].scales[ib] = int8_t(std::min(127, nearest_int(iscale * scales[ib])));
    const float d = h2f(y[i].d);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float ds = d * y[i].scales[j];
      if (ds == 0.f) continue;
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = int8_t(std::clamp(nearest_int(x[16 * j + l] / ds), -32, 31) + 32);
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int c = 0; c < QK_K; c += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[c + l], q2 = L[c + l + 32], q3 = L[c + l + 64], q4 = L[c + l + 96];
        ql[l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

void quant_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const bool non_finite = any_non_finite(x, QK_K);
    const float max = non_finite ? 0.f : signed_absmax(x, QK_K);
    if (max == 0.f) {
      y[i].d = non_finite ? kNaN : 0.f;
      std::memset(y[i].qs, 0, sizeof(y[i].qs));
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    // Signed max maps to -127 (never -128); d = 1/iscale is negative when max > 0.
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) y[i].qs[j] = int8_t(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += y[i].qs[16 * g + l];
      y[i].bsums[g] = int16_t(s);
    }
    y[i].d = 1.f / iscale;
  }
}

}  // namespace

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t nb = n / dtype_traits(t).block_elems;
  (void)row_bytes(t, n);  // validates n against the block size
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0: quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); return;
    case DType::Q4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return;
    case DType::Q8_1: quant_q8_1(src, static_cast<BlockQ8_1*>(dst), nb); return;
    case DType::Q4_1: quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb); return;
    case DType::Q5_0: quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb); return;
    case DType::Q5_1: quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb); return;
    case DType::IQ4_NL: quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), nb); return;
    case DType::MXFP4: quant_mxfp4(src, static_cast<BlockMXFP4*>(dst), nb); return;
    case DType::Q4_K: quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); return;
    case DType::Q5_K: quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb); return;
    case DType::Q6_K: quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); return;
    case DType::Q8_K: quant_q8_k(src, static_cast<BlockQ8_K*>(dst), nb); return;
    default: break;
  }
  throw Error("quantize_row: unsupported tensor type " +
              std::string(ggml_type_name(static_cast<uint32_t>(t))));
}

}  // namespace tessera::quant
