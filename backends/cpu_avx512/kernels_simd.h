// Small AVX-512 helpers shared by the kernel files (which are compiled with AVX-512
// flags; never include this from code that runs before cpu_avx512::usable()).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace tessera::cpu_avx512::kern {

// Lanes [0, min(n, 16)) of a 16-float vector.
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

}  // namespace tessera::cpu_avx512::kern
