// Dot products of a weight row with an activation row already converted to
// vec_dot_type(weight), with the arithmetic of ggml's generic CPU kernels:
// integer sums inside each block, one float scale per block (or sub-block lane).
#include <cstring>
#include <string>

#include "quant/quant_internal.h"
#include "tessera/error.h"

namespace tessera::quant {
using detail::get_scale_min_k4;
using detail::h2f;

namespace {

float dot_f32(int64_t n, const float* x, const float* y) {
  double s = 0.0;  // products in float, accumulated in double (ggml_float)
  for (int64_t i = 0; i < n; ++i) s += double(x[i] * y[i]);
  return float(s);
}

float dot_f16(int64_t n, const uint16_t* x, const uint16_t* y) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return float(s);
}

float dot_bf16(int64_t n, const uint16_t* x, const uint16_t* y) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
  return float(s);
}

float dot_q8_0(int64_t nb, const BlockQ8_0* x, const BlockQ8_0* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < QK8_0; ++j) s += x[i].qs[j] * y[i].qs[j];
    sum += s * (h2f(x[i].d) * h2f(y[i].d));
  }
  return sum;
}

float dot_q4_0(int64_t nb, const BlockQ4_0* x, const BlockQ8_0* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s0 = 0, s1 = 0;
    for (int j = 0; j < QK4_0 / 2; ++j) {
      s0 += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
      s1 += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
    }
    sum += (s0 + s1) * h2f(x[i].d) * h2f(y[i].d);
  }
  return sum;
}

// Shared tail of the K-quant dots. `a` holds the 256 unsigned/signed weight
// levels of one block in element order; products are summed per 8-lane slot
// (element index mod 8) like ggml's generic kernel, so the float rounding of the
// final scaling matches it too. `sub` is the number of elements per scale.
void lane_sums(const int8_t* a, const int8_t* q8, const int* scale, int sub, int32_t aux32[8]) {
  std::memset(aux32, 0, 8 * sizeof(int32_t));
  for (int e = 0; e < QK_K; e += 8) {
    const int sc = scale[e / sub];
    for (int l = 0; l < 8; ++l) aux32[l] += sc * (q8[e + l] * a[e + l]);
  }
}

// Q4_K / Q5_K: value = d*sc*q - dmin*m. The min part needs no per-element work:
// sum(q8 * m) over a 32-element sub-block = m * (its two 16-element bsums).
float dot_q4_k(int64_t nb, const BlockQ4_K* x, const BlockQ8_K* y) {
  float sums[8] = {0};
  float sumf = 0.f;
  int8_t a[QK_K];
  int sc[8];
  int32_t aux32[8];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      for (int l = 0; l < 32; ++l) a[64 * c + l] = int8_t(q[l] & 0xF);
      for (int l = 0; l < 32; ++l) a[64 * c + 32 + l] = int8_t(q[l] >> 4);
    }
    int32_t summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      get_scale_min_k4(j, x[i].scales, s, m);
      sc[j] = s;
      summ += (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) * m;
    }
    lane_sums(a, y[i].qs, sc, 32, aux32);
    const float d = h2f(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
    const float dmin = h2f(x[i].dmin) * y[i].d;
    sumf -= dmin * summ;
  }
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

float dot_q5_k(int64_t nb, const BlockQ5_K* x, const BlockQ8_K* y) {
  float sums[8] = {0};
  float sumf = 0.f;
  int8_t a[QK_K];
  int sc[8];
  int32_t aux32[8];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const uint8_t* qh = x[i].qh;
    for (int c = 0; c < 4; ++c, q += 32) {
      const uint8_t u1 = uint8_t(1u << (2 * c)), u2 = uint8_t(2u << (2 * c));
      for (int l = 0; l < 32; ++l) a[64 * c + l] = int8_t((q[l] & 0xF) + ((qh[l] & u1) ? 16 : 0));
      for (int l = 0; l < 32; ++l) a[64 * c + 32 + l] = int8_t((q[l] >> 4) + ((qh[l] & u2) ? 16 : 0));
    }
    int32_t summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      get_scale_min_k4(j, x[i].scales, s, m);
      sc[j] = s;
      summ += (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) * m;
    }
    lane_sums(a, y[i].qs, sc, 32, aux32);
    const float d = h2f(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
    const float dmin = h2f(x[i].dmin) * y[i].d;
    sumf -= dmin * summ;
  }
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

float dot_q6_k(int64_t nb, const BlockQ6_K* x, const BlockQ8_K* y) {
  float sums[8] = {0};
  int8_t a[QK_K];
  int sc[16];
  int32_t aux32[8];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    for (int c = 0; c < QK_K; c += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        a[c + l] = int8_t(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        a[c + l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        a[c + l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        a[c + l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    for (int j = 0; j < 16; ++j) sc[j] = x[i].scales[j];
    lane_sums(a, y[i].qs, sc, 16, aux32);
    const float d = h2f(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
  }
  float sumf = 0.f;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

}  // namespace

DType vec_dot_type(DType weight) {
  switch (weight) {
    case DType::F32: return DType::F32;
    case DType::F16: return DType::F16;
    case DType::BF16: return DType::BF16;
    case DType::Q4_0:
    case DType::Q8_0: return DType::Q8_0;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return DType::Q8_K;
    default: break;
  }
  throw Error("no dot product for tensor type " +
              std::string(ggml_type_name(static_cast<uint32_t>(weight))));
}

float vec_dot(DType wt, int64_t n, const void* w, const void* a) {
  (void)row_bytes(wt, n);  // validates n against the block size
  const int64_t nb = n / dtype_traits(wt).block_elems;
  switch (wt) {
    case DType::F32: return dot_f32(n, static_cast<const float*>(w), static_cast<const float*>(a));
    case DType::F16:
      return dot_f16(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a));
    case DType::BF16:
      return dot_bf16(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a));
    case DType::Q8_0:
      return dot_q8_0(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_0:
      return dot_q4_0(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K:
      return dot_q4_k(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q5_K:
      return dot_q5_k(nb, static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K:
      return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    default: break;
  }
  throw Error("no dot product for tensor type " +
              std::string(ggml_type_name(static_cast<uint32_t>(wt))));
}

}  // namespace tessera::quant
