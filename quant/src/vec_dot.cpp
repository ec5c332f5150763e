// Dot products of a weight row with an activation row already converted to
// vec_dot_type(weight), with the arithmetic of ggml's generic CPU kernels:
// integer sums inside each block, one float scale per block (or sub-block lane).
#include <cstring>
#include <string>

#include "quant_internal.h"
#include "tessera/error.h"

namespace tessera::quant {
using detail::get_scale_min_k4;
using detail::h2f;
using detail::q3_k_scales;

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

inline uint32_t q5_high(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | (uint32_t(qh[1]) << 8) | (uint32_t(qh[2]) << 16) | (uint32_t(qh[3]) << 24);
}

// Integer dot of a 32-element block of 4-bit codes (low nibbles are elements 0-15,
// high nibbles 16-31) mapped through a 16-entry table with 32 int8 activations.
inline int32_t nibble_table_dot(const uint8_t qs[16], const int8_t* table, const int8_t* q8) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += table[qs[j] & 0xF] * q8[j] + table[qs[j] >> 4] * q8[j + 16];
  return s;
}

// Integer dot of a Q5 block (4 low bits in qs, the fifth in qh) with 32 int8
// activations; `bias` is subtracted from every level (16 for Q5_0, 0 for Q5_1).
inline int32_t q5_dot(const uint8_t qs[16], const uint8_t qh_bytes[4], int bias, const int8_t* q8) {
  const uint32_t qh = q5_high(qh_bytes);
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) {
    const int x0 = int((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - bias;
    const int x1 = int((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - bias;
    s += x0 * q8[j] + x1 * q8[j + 16];
  }
  return s;
}

constexpr int8_t kNibbleLevels[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Q4_1 / Q5_1 with Q8_1: sum(d*q + m) * (dy*q8) = dx*dy*sum(q*q8) + m * (dy*sum(q8)),
// the last factor being the activation block's stored s.
float dot_q4_1(int64_t nb, const BlockQ4_1* x, const BlockQ8_1* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i)
    sum += (h2f(x[i].d) * h2f(y[i].d)) * nibble_table_dot(x[i].qs, kNibbleLevels, y[i].qs) +
           h2f(x[i].m) * h2f(y[i].s);
  return sum;
}

float dot_q5_0(int64_t nb, const BlockQ5_0* x, const BlockQ8_0* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i) sum += (h2f(x[i].d) * h2f(y[i].d)) * q5_dot(x[i].qs, x[i].qh, 16, y[i].qs);
  return sum;
}

float dot_q5_1(int64_t nb, const BlockQ5_1* x, const BlockQ8_1* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i)
    sum += (h2f(x[i].d) * h2f(y[i].d)) * q5_dot(x[i].qs, x[i].qh, 0, y[i].qs) + h2f(x[i].m) * h2f(y[i].s);
  return sum;
}

float dot_iq4_nl(int64_t nb, const BlockIQ4_NL* x, const BlockQ8_0* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i) sum += h2f(x[i].d) * h2f(y[i].d) * nibble_table_dot(x[i].qs, kIQ4NLValues, y[i].qs);
  return sum;
}

float dot_mxfp4(int64_t nb, const BlockMXFP4* x, const BlockQ8_0* y) {
  float sum = 0.f;
  for (int64_t i = 0; i < nb; ++i)
    sum += h2f(y[i].d) * e8m0_to_fp32_half(x[i].e) * nibble_table_dot(x[i].qs, kMXFP4Values, y[i].qs);
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

// Q2_K: value = d*sc*q - dmin*m per 16-element sub-block; the min part is
// m * bsums[sub-block]. Integer sums per block, as ggml's generic kernel.
float dot_q2_k(int64_t nb, const BlockQ2_K* x, const BlockQ8_K* y) {
  float sumf = 0.f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q2 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    const uint8_t* sc = x[i].scales;
    int32_t summs = 0;
    for (int j = 0; j < 16; ++j) summs += y[i].bsums[j] * (sc[j] >> 4);
    const float dall = y[i].d * h2f(x[i].d);
    const float dmin = y[i].d * h2f(x[i].dmin);
    int32_t isum = 0;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q2 += 32) {
      for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
        for (int half = 0; half < 2; ++half) {
          const int d = sc[is++] & 0xF;
          int32_t s = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) s += q8[l] * ((q2[l] >> shift) & 3);
          isum += d * s;
        }
      }
    }
    sumf += dall * isum - dmin * summs;
  }
  return sumf;
}

float dot_q3_k(int64_t nb, const BlockQ3_K* x, const BlockQ8_K* y) {
  float sums[8] = {0};
  int8_t a[QK_K];
  int sc[16];
  int32_t aux32[8];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q3 = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    int8_t* p = a;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128, q3 += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1), p += 32)
        for (int l = 0; l < 32; ++l) p[l] = int8_t(((q3[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
    }
    q3_k_scales(x[i].scales, sc);
    for (int j = 0; j < 16; ++j) sc[j] -= 32;
    lane_sums(a, y[i].qs, sc, 16, aux32);
    const float d = h2f(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
  }
  float sumf = 0.f;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

float dot_iq4_xs(int64_t nb, const BlockIQ4_XS* x, const BlockQ8_K* y) {
  float sumf = 0.f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d4d8 = h2f(x[i].d) * y[i].d;
    const uint8_t* qs = x[i].qs;
    const int8_t* q8 = y[i].qs;
    for (int ib = 0; ib < QK_K / 32; ++ib, qs += 16, q8 += 32) {
      const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d4d8 * (ls - 32);
      sumf += dl * nibble_table_dot(qs, kIQ4NLValues, q8);
    }
  }
  return sumf;
}

}  // namespace


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
    case DType::Q4_1:
      return dot_q4_1(nb, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q5_0:
      return dot_q5_0(nb, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q5_1:
      return dot_q5_1(nb, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::IQ4_NL:
      return dot_iq4_nl(nb, static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::MXFP4:
      return dot_mxfp4(nb, static_cast<const BlockMXFP4*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q2_K:
      return dot_q2_k(nb, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q3_K:
      return dot_q3_k(nb, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_XS:
      return dot_iq4_xs(nb, static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(a));
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
