// Dequantization of every supported dtype: GGUF block layouts, ggml's arithmetic
// (each value is d * q or d * q - m computed in float, exactly as ggml does).
#include <cstring>
#include <string>

#include "quant_internal.h"
#include "tessera/error.h"

namespace tessera::quant {
using detail::get_scale_min_k4;
using detail::h2f;
using detail::q3_k_scales;

namespace {

void deq_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = x[i].qs[j] * d;
  }
}

void deq_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  // Byte j holds element j in its low nibble and element j+16 in its high nibble.
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[i * QK4_0 + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
      y[i * QK4_0 + j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q8_1(const BlockQ8_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = x[i].qs[j] * d;
  }
}

void deq_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), m = h2f(x[i].m);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = (x[i].qs[j] & 0x0F) * d + m;
      y[i * 32 + j + 16] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}

// Fifth bits of a Q5_0 / Q5_1 block: element j's is bit j of the little-endian qh.
inline uint32_t q5_high(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | (uint32_t(qh[1]) << 8) | (uint32_t(qh[2]) << 16) | (uint32_t(qh[3]) << 24);
}

void deq_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const uint32_t qh = q5_high(x[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int x0 = int((x[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
      const int x1 = int((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      y[i * 32 + j] = x0 * d;
      y[i * 32 + j + 16] = x1 * d;
    }
  }
}

void deq_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), m = h2f(x[i].m);
    const uint32_t qh = q5_high(x[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int x0 = int((x[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
      const int x1 = int((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      y[i * 32 + j] = x0 * d + m;
      y[i * 32 + j + 16] = x1 * d + m;
    }
  }
}

void deq_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = d * kIQ4NLValues[x[i].qs[j] & 0xF];
      y[i * 32 + j + 16] = d * kIQ4NLValues[x[i].qs[j] >> 4];
    }
  }
}

void deq_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = e8m0_to_fp32_half(x[i].e);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = kMXFP4Values[x[i].qs[j] & 0xF] * d;
      y[i * 32 + j + 16] = kMXFP4Values[x[i].qs[j] >> 4] * d;
    }
  }
}

void deq_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  // Per 128 elements, 32 bytes of qs: bit pair 2j of byte l is element 32j + l.
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * half + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void deq_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  // As Q2_K for the low bits; hmask bit (n/128*4 + shift/2) of byte l (0..31) is
  // the high bit of the element with the same position.
  int sc[16];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    q3_k_scales(x[i].scales, sc);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d * (sc[is++] - 32);
          for (int l = 0; l < 16; ++l) {
            const int k = 16 * half + l;
            *y++ = dl * (((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

void deq_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < QK_K / 32; ++ib, qs += 16, y += 32) {
      const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIQ4NLValues[qs[j] & 0xF];
        y[j + 16] = dl * kIQ4NLValues[qs[j] >> 4];
      }
    }
  }
}

void deq_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  // Each 64-element chunk uses 32 bytes: low nibbles are sub-block 2c, high 2c+1.
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const float dmin = h2f(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c, x[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(2 * c + 1, x[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void deq_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  // As Q4_K, plus a fifth bit: qh[l] bit 2c is element l of sub-block 2c, bit 2c+1 of 2c+1.
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const float dmin = h2f(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c, x[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      get_scale_min_k4(2 * c + 1, x[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t u1 = uint8_t(1u << (2 * c)), u2 = uint8_t(2u << (2 * c));
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      ql += 32;
    }
  }
}

void deq_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  // Per 128 elements: ql 64 bytes (low nibbles: 0-31 / 32-63, high: 64-95 / 96-127),
  // qh 32 bytes (2 bits for each of the four 32-element quarters), 8 int8 scales
  // (one per 16 elements). Values are (6-bit q) - 32.
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void deq_q8_k(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * x[i].qs[j];
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = n / dtype_traits(t).block_elems;
  (void)row_bytes(t, n);  // validates n against the block size
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    case DType::Q8_0: deq_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); return;
    case DType::Q4_0: deq_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); return;
    case DType::Q8_1: deq_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb); return;
    case DType::Q4_1: deq_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); return;
    case DType::Q5_0: deq_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); return;
    case DType::Q5_1: deq_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); return;
    case DType::IQ4_NL: deq_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb); return;
    case DType::MXFP4: deq_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb); return;
    case DType::Q2_K: deq_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb); return;
    case DType::Q3_K: deq_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb); return;
    case DType::IQ4_XS: deq_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb); return;
    case DType::Q4_K: deq_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); return;
    case DType::Q5_K: deq_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); return;
    case DType::Q6_K: deq_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); return;
    case DType::Q8_K: deq_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb); return;
    default: break;
  }
  throw Error("dequantize_row: unsupported tensor type " +
              std::string(ggml_type_name(static_cast<uint32_t>(t))));
}

}  // namespace tessera::quant
