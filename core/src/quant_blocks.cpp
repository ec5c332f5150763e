// The core's part of quant_blocks.h: IEEE half and bfloat16 conversions (integer-only,
// so the result does not depend on the compiler's floating-point flags) and each
// weight type's activation format.
#include <cstdint>
#include <cstring>

#include <string>

#include "tessera/error.h"
#include "tessera/quant_blocks.h"

namespace tessera::quant {

namespace {
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return float_of(sign | 0x7F800000 | (mant << 13));  // inf / NaN
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);  // +-0
  // Subnormal: value = mant * 2^-24; normalise into a float.
  int e = 113;  // biased float exponent of 2^-14
  while ((mant & 0x400) == 0) {
    mant <<= 1;
    --e;
  }
  return float_of(sign | (uint32_t(e) << 23) | ((mant & 0x3FF) << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00;           // NaN -> quiet NaN (as ggml)
  if (a >= 0x477FF000) return sign | 0x7C00;          // >= 65520 rounds to inf
  if (a >= 0x38800000) {                              // normal half (>= 2^-14)
    uint32_t r = a - 0x38000000;                      // rebias exponent 127 -> 15
    r += 0xFFF + ((r >> 13) & 1);                     // round to nearest even
    return sign | uint16_t(r >> 13);
  }
  if (a < 0x33000000) return sign;                    // < 2^-25 -> 0
  // Subnormal half: units of 2^-24. value = m * 2^(e-150) -> m >> (126 - e).
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;                     // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;    // may carry into 0x400: min normal
  return sign | uint16_t(q);
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return uint16_t((u >> 16) | 0x40);  // keep NaN, quiet
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);                 // nearest even
}

DType vec_dot_type(DType weight) {
  switch (weight) {
    case DType::F32: return DType::F32;
    case DType::F16: return DType::F16;
    case DType::BF16: return DType::BF16;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::IQ4_NL:
    case DType::MXFP4:
    case DType::Q8_0: return DType::Q8_0;
    case DType::Q4_1:
    case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return DType::Q8_K;
    default: break;
  }
  throw Error("no dot product for tensor type " +
              std::string(ggml_type_name(static_cast<uint32_t>(weight))));
}

}  // namespace tessera::quant
