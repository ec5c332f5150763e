// Helpers shared by the scalar quantization sources (not a public header).
#pragma once
#include <cstdint>
#include <cstring>

#include "tessera/quant.h"

namespace tessera::quant::detail {

// Round to nearest, ties to even, for |v| < 2^22, independent of the FP rounding
// mode: adding 1.5*2^23 puts the integer in the low mantissa bits. This is the
// rounding ggml's K-quant and Q8_K quantizers use, so ties go the same way.
inline int nearest_int(float v) {
  float t = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// The 12 scale bytes of Q4_K/Q5_K hold eight 6-bit scales and eight 6-bit mins:
// bytes 0-3: low 6 bits of scales 0-3 (top 2 bits: high bits of scales 4-7),
// bytes 4-7: low 6 bits of mins 0-3 (top 2 bits: high bits of mins 4-7),
// bytes 8-11: low nibble = low 4 bits of scale j+4, high nibble = of min j+4.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

inline void set_scale_min_k4(int j, uint8_t* q, uint8_t sc, uint8_t m) {
  // q must be zeroed before the first call (high bits are OR-ed in).
  if (j < 4) {
    q[j] = uint8_t((q[j] & 0xC0) | (sc & 63));
    q[j + 4] = uint8_t((q[j + 4] & 0xC0) | (m & 63));
  } else {
    q[j + 4] = uint8_t((sc & 0xF) | ((m & 0xF) << 4));
    q[j - 4] |= uint8_t((sc >> 4) << 6);
    q[j] |= uint8_t((m >> 4) << 6);
  }
}

// Q3_K's 16 scales, 6 bits each, from its 12 packed bytes: the low 4 bits of scale j
// are nibble (j / 8) of byte j % 8, the high 2 bits are bit pair (j / 4) of byte
// 8 + j % 4. Returned biased (0..63; the value uses scale - 32).
inline void q3_k_scales(const uint8_t packed[12], int sc[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = lo | (hi << 4);
  }
}

inline float h2f(uint16_t h) { return fp16_to_fp32(h); }

}  // namespace tessera::quant::detail
