// Small AVX-512 helpers shared by the kernel files (which are compiled with AVX-512
// flags; never include this from code that runs before cpu_avx512::usable()).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "tessera/quant_blocks.h"

namespace tessera::cpu_avx512::kern {

// Lanes [0, min(n, 16)) of a 16-float vector.
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// quant::fp16_to_fp32(quant::fp32_to_fp16(x)) without the two calls (each made the
// compiler spill the vector registers of an activation-quantizing loop around it): the
// hardware's round to nearest even, and the library only for a NaN (which it turns
// into the quiet 0x7E00 where the hardware would keep the payload).
inline float round_to_f16(float x) {
  if (x != x) return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace tessera::cpu_avx512::kern
