// The real build of the cpu_amx products: AMX tile instructions, AVX-512 for the Q4_0
// unpacking and the block scaling (compiled with -mamx-tile -mamx-int8 -mamx-bf16 and
// the AVX-512 flags, -ffp-contract=off). Entered only after the probe found AMX
// usable. No static initializer here executes an AMX or AVX-512 instruction.
#include <immintrin.h>

#include "kernel_impl.h"

namespace tessera::cpu_amx::kern {

namespace {

// GCC's tile intrinsics paste their tile numbers into the instruction text, so the
// numbers the kernel uses are spelled out.
struct RealTiles {
  static void configure(const tile::Config& c) { _tile_loadconfig(&c); }
  static void release() { _tile_release(); }
  template <int T>
  static void load(const void* p, int64_t stride);
  template <int T>
  static void store(void* p, int64_t stride);
  template <int T>
  static void zero();
  template <int D, int A, int B>
  static void dp();
  static void unpack_q4(const uint8_t* v, int8_t* out) {
    const __m512i lo = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    for (int g = 0; g < 4; ++g) {
      const __m512i z = _mm512_loadu_si512(v + 64 * g);
      _mm512_storeu_si512(out + 64 * g, _mm512_sub_epi8(_mm512_and_si512(z, lo), eight));
      _mm512_storeu_si512(out + 64 * (4 + g), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(z, 4), lo), eight));
    }
  }
  template <bool Q4>
  static void scale(const int32_t* c, const uint16_t* dw16, const float* dy, int64_t ldd, int rows, float* acc,
                    int64_t acc_stride) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dw16)));
    for (int m = 0; m < rows; ++m) {
      const __m512 y = _mm512_set1_ps(dy[m * ldd]);
      const __m512 sv = _mm512_cvtepi32_ps(_mm512_loadu_si512(c + 16 * m));
      const __m512 t = Q4 ? _mm512_mul_ps(_mm512_mul_ps(sv, dw), y) : _mm512_mul_ps(sv, _mm512_mul_ps(dw, y));
      float* a = acc + m * acc_stride;
      _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), t));
    }
  }
};

// C tiles 0-3 are zeroed and stored, A and B tiles 4-7 loaded.
#define TESSERA_AMX_C_TILE(T)                                                                         \
  template <>                                                                                         \
  void RealTiles::store<T>(void* p, int64_t stride) { _tile_stored(T, p, stride); }                   \
  template <>                                                                                         \
  void RealTiles::zero<T>() { _tile_zero(T); }
#define TESSERA_AMX_IN_TILE(T) \
  template <>                  \
  void RealTiles::load<T>(const void* p, int64_t stride) { _tile_loadd(T, p, stride); }
TESSERA_AMX_C_TILE(0)
TESSERA_AMX_C_TILE(1)
TESSERA_AMX_C_TILE(2)
TESSERA_AMX_C_TILE(3)
TESSERA_AMX_IN_TILE(4)
TESSERA_AMX_IN_TILE(5)
TESSERA_AMX_IN_TILE(6)
TESSERA_AMX_IN_TILE(7)
#undef TESSERA_AMX_C_TILE
#undef TESSERA_AMX_IN_TILE
template <>
void RealTiles::dp<0, 4, 6>() { _tile_dpbssd(0, 4, 6); }
template <>
void RealTiles::dp<1, 4, 7>() { _tile_dpbssd(1, 4, 7); }
template <>
void RealTiles::dp<2, 5, 6>() { _tile_dpbssd(2, 5, 6); }
template <>
void RealTiles::dp<3, 5, 7>() { _tile_dpbssd(3, 5, 7); }

}  // namespace

void matmul_tiles_real(const Job& job, int64_t t0, int64_t t1) { impl::matmul_tiles<RealTiles>(job, t0, t1); }

}  // namespace tessera::cpu_amx::kern
