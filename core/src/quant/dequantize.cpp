// Dequantization of every supported dtype: GGUF block layouts, ggml's arithmetic
// (each value is d * q or d * q - m computed in float, exactly as ggml does).
#include <cstring>
#include <string>

#include "quant/quant_internal.h"
#include "tessera/error.h"

namespace tessera::quant {
using detail::get_scale_min_k4;
using detail::h2f;

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
