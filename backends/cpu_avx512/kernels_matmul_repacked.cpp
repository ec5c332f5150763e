// AVX-512 products of repacked weights (compiled with the kernel flags): Q4_0, Q8_0,
// Q4_K, Q5_K and Q6_K rows regrouped at load into 16-row tiles (kernels.h), so one
// vpdpbusd covers 16 rows; kernels_matmul.cpp holds the row kernels.
//
// No static initializer in this file executes AVX-512 code.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "kernels_matmul_common.h"
#include "kernels_simd.h"
#include "tessera/quant_blocks.h"
namespace tessera::cpu_avx512::kern {
namespace {

// Bytes per block of one 16-row tile: 32 bytes of scales + 16 rows of quantized bytes.
// Q4_K: d, dmin, the 6-bit scales and mins split into 4-bit and 2-bit fields, qs (see
// tile_dot_q4k); 16 x 144 bytes, the GGUF blocks' size, as decode reads every byte.
constexpr int64_t kQ4KSl = 64, kQ4KMl = kQ4KSl + 64, kQ4KHi = kQ4KMl + 64, kQ4KQs = kQ4KHi + 64;
constexpr int64_t kQ4KTileBytes = kQ4KQs + 32 * 64;
static_assert(kQ4KTileBytes == 16 * int64_t(sizeof(BlockQ4_K)));
// Q5_K: Q4_K's header, then the fifth bits (8 x 64 bytes: vector j lane i = row i's
// qh[4j..4j+3]), then qs as Q4_K's; 16 x 176 bytes, the GGUF blocks' size.
constexpr int64_t kQ5KQh = kQ4KQs, kQ5KQs = kQ5KQh + 8 * 64, kQ5KTileBytes = kQ5KQs + 32 * 64;
static_assert(kQ5KTileBytes == 16 * int64_t(sizeof(BlockQ5_K)));
// Bit position, in a row's kQ4KHi dword, of the top 2 bits of its scale j (the mins'
// take bits 4-11 and 20-27: see tile_dot_q4k).
constexpr int kQ4KScaleHiBit[8] = {0, 2, 12, 14, 16, 18, 28, 30};
// Q6_K: d, scales, then 16 groups of ql, ql, qh vectors (see tile_dot_q6k); 16 x 210
// bytes, the GGUF blocks' size.
constexpr int64_t kQ6KScales = 32, kQ6KQ = kQ6KScales + 256, kQ6KGroupBytes = 3 * 64;
constexpr int64_t kQ6KTileBytes = kQ6KQ + 16 * kQ6KGroupBytes;
static_assert(kQ6KTileBytes == 16 * int64_t(sizeof(BlockQ6_K)));
constexpr int64_t tile_block_bytes(DType wt) {
  return wt == DType::Q4_0   ? 32 + 16 * 16
         : wt == DType::Q8_0 ? 32 + 16 * 32
         : wt == DType::Q4_K ? kQ4KTileBytes
         : wt == DType::Q5_K ? kQ5KTileBytes
                             : kQ6KTileBytes;
}
constexpr int64_t block_elems_rp(DType wt) {
  return wt == DType::Q4_K || wt == DType::Q5_K || wt == DType::Q6_K ? 256 : 32;
}

// Prepared activation for repacked weights: int8 values in natural order [A64(K)],
// per block the float scale [nb] and the int32 offset correction [nb]
// (-8 * block sum for Q4_0, -128 * block sum for Q8_0).
inline size_t rp_off_d(int64_t K) { return A64(size_t(K)); }
inline size_t rp_off_c(int64_t K) { return A64(size_t(K)) + A64(size_t(K / 32) * 4); }

// Calls f(std::integral_constant<int, I>) for I = 0..N-1 (so I can be an immediate).
template <int N, typename F>
inline void static_for(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

// The activation's 4-byte group J of the 16 bytes at p, in every lane (one vpdpbusd
// operand). One column (decode): `chunk` holds those 16 bytes in every 128-bit lane,
// loaded once per block, and a shuffle picks the group (cheaper than broadcast loads
// per group for decode, docs/performance.md). Several columns (prefill): broadcast loads,
// which leave the shuffle port to the weight unpacking.
template <int NC, int J>
inline __m512i act_group(const int8_t* p, __m512i chunk) {
  if constexpr (NC == 1) {
    return _mm512_shuffle_epi32(chunk, _MM_PERM_ENUM(J * 0x55));
  } else {
    int32_t v;
    std::memcpy(&v, p + 4 * J, 4);
    return _mm512_set1_epi32(v);
  }
}
inline __m512i act_chunk(const int8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// G consecutive tiles (decode: NC = 1) or NC columns of one tile (prefill) per call;
// res is [G][NC][16]. Decode walks G tiles side by side so that each activation block
// is loaded once per G tiles: a tile of K >= 4096 outgrows L1, and reloading the
// activation from L2 per tile slowed the kernel markedly (docs/performance.md).
template <bool Q4, int NC, int G, bool PF = true>
void tile_dot(const uint8_t* tile, int64_t nb, const uint8_t* const* act, int64_t K, float* res) {
  static_assert(NC == 1 || G == 1);
  constexpr int64_t TB = Q4 ? 32 + 256 : 32 + 512;
  const int64_t tstride = nb * TB;
  __m512 acc[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  const __m512i lowmask = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(char(0x80));
  // Decode (one column) reads each weight once: where it prefetches (PF), a
  // non-temporal request keeps the stream from evicting the activations, KV rows and
  // outputs (docs/performance.md); prefill re-reads a tile per 4 columns, so it keeps T0.
  constexpr auto kHint = NC == 1 ? _MM_HINT_NTA : _MM_HINT_T0;  // enum _mm_hint (GCC) or int (clang)
  const float* dy[NC];
  const int32_t* cy[NC];
  const int8_t* y[NC];
  for (int c = 0; c < NC; ++c) {
    y[c] = reinterpret_cast<const int8_t*>(act[c]);
    dy[c] = reinterpret_cast<const float*>(act[c] + rp_off_d(K));
    cy[c] = reinterpret_cast<const int32_t*>(act[c] + rp_off_c(K));
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512 dw[G];
    __m512i i[G][NC];
    for (int g = 0; g < G; ++g) {
      const char* p = reinterpret_cast<const char*>(tile + g * tstride + b * TB);
      if constexpr (PF)
        for (int l = 0; l <= TB / 64; ++l) _mm_prefetch(p + PF_DIST + 64 * l, kHint);  // the block's lines
      dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      for (int c = 0; c < NC; ++c) i[g][c] = _mm512_set1_epi32(cy[c][b]);
    }
    __m512i ch0[NC], ch1[NC];  // the block's activation bytes 0-15 and 16-31 (decode)
    for (int c = 0; c < NC; ++c) {
      if constexpr (NC == 1) ch0[c] = act_chunk(y[c] + b * 32), ch1[c] = act_chunk(y[c] + b * 32 + 16);
      else ch0[c] = ch1[c] = _mm512_setzero_si512();
    }
    if constexpr (Q4) {
      // Vector t: low nibbles are weights 4t.., high nibbles 16 + 4t..
      static_for<4>([&](auto t) {
        __m512i a0[NC], a1[NC];
        for (int c = 0; c < NC; ++c)
          a0[c] = act_group<NC, t>(y[c] + b * 32, ch0[c]), a1[c] = act_group<NC, t>(y[c] + b * 32 + 16, ch1[c]);
        for (int g = 0; g < G; ++g) {
          const __m512i z = _mm512_loadu_si512(tile + g * tstride + b * TB + 32 + 64 * t);
          const __m512i lo = _mm512_and_si512(z, lowmask), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lowmask);
          for (int c = 0; c < NC; ++c) {
            i[g][c] = _mm512_dpbusd_epi32(i[g][c], lo, a0[c]);
            i[g][c] = _mm512_dpbusd_epi32(i[g][c], hi, a1[c]);
          }
        }
      });
    } else {
      static_for<8>([&](auto t) {  // vector t: weights 4t..
        __m512i a[NC];
        for (int c = 0; c < NC; ++c) a[c] = act_group<NC, t % 4>(y[c] + b * 32 + 16 * (t / 4), t < 4 ? ch0[c] : ch1[c]);
        for (int g = 0; g < G; ++g) {
          const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(tile + g * tstride + b * TB + 32 + 64 * t), off);
          for (int c = 0; c < NC; ++c) i[g][c] = _mm512_dpbusd_epi32(i[g][c], u, a[c]);
        }
      });
    }
    // Lane = row, blocks in order, the reference's rounding: Q4_0 adds (s * dx) * dy,
    // Q8_0 adds s * (dx * dy), no FMA: bit-identical to cpu_scalar.
    for (int c = 0; c < NC; ++c) {
      const __m512 vdy = _mm512_set1_ps(dy[c][b]);
      for (int g = 0; g < G; ++g) {
        const __m512 si = _mm512_cvtepi32_ps(i[g][c]);
        const __m512 t = Q4 ? _mm512_mul_ps(_mm512_mul_ps(si, dw[g]), vdy) : _mm512_mul_ps(si, _mm512_mul_ps(dw[g], vdy));
        acc[g][c] = _mm512_add_ps(acc[g][c], t);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(res + 16 * (g * NC + c), acc[g][c]);
}

// Repacked Q4_K tile (16 rows, lane = row). Per 256-weight block: F16 d[16] and
// dmin[16]; three vectors of one dword per row holding its 6-bit scales s0..s7 and
// mins m0..m7 as 4-bit and 2-bit fields; then 32 x 64 bytes of quantized bytes,
// vector g lane i = row i's qs[4g..4g+3]. The fields sit where one shift and one mask
// bring them, in place, to where they are used (a row's dwords, bit 0 first):
//   at kQ4KSl: s0..s7 bits 0-3, 4 bits each   -> scale j = (>> 4j) & 0xF
//   at kQ4KMl: m0 m2 m4 m6 m1 m3 m5 m7 bits 0-3 -> int16 pair k = (m2k, m2k+1) bits 0-3
//   at kQ4KHi: m2k bits 4-5 at 4 + 2k, m2k+1 at 20 + 2k (16 x the value after >> 2k in
//              each int16), s_j bits 4-5 at kQ4KScaleHiBit[j]
// (the GGUF block's own 12-byte packing needs a dozen operations per pair). Per sub-block
// the integer dot is exact (vpdpbusd), scaled by the row's scale in int32 (vpmulld);
// mins against the activation's 32-element sums with vpdpwssd.
// Q5 (Q5_K): each nibble gets its fifth bit from the qh vectors (see kQ5KQh): weight
// 64ch + l and 64ch + 32 + l take bits 2ch and 2ch + 1 of row's qh[l], brought to bit 4
// of the same byte by one 32-bit rotation (bit 4 of every byte comes from that byte).
template <int NC, bool Q5 = false, bool PF = true>
void tile_dot_q4k(const uint8_t* tile, int64_t nb, const uint8_t* const* act, int64_t K, float* res) {
  constexpr int64_t TB = Q5 ? kQ5KTileBytes : kQ4KTileBytes, QS = Q5 ? kQ5KQs : kQ4KQs;
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i lowmask = _mm512_set1_epi8(0x0F), m4 = _mm512_set1_epi32(0x0F), m30 = _mm512_set1_epi32(0x30);
  const __m512i p4 = _mm512_set1_epi32(0x000F000F), p30 = _mm512_set1_epi32(0x00300030);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * TB;
    if constexpr (PF)
      for (int l = 0; l < TB / 64; ++l) _mm_prefetch(reinterpret_cast<const char*>(p) + PF_DIST + 64 * l, _MM_HINT_T0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    const __m512i sl = _mm512_loadu_si512(p + kQ4KSl), ml = _mm512_loadu_si512(p + kQ4KMl), hb = _mm512_loadu_si512(p + kQ4KHi);
    const uint8_t* a[NC];
    for (int c = 0; c < NC; ++c) a[c] = act[c] + size_t(b) * kQ8KBlockBytes;
    __m512i tot[NC], mn[NC];
    for (int c = 0; c < NC; ++c) tot[c] = mn[c] = _mm512_setzero_si512();
    static_for<4>([&](auto k) {  // mins: int16 pairs (m2k, m2k+1), low and high fields
      const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(ml, 4 * k), p4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(hb, 2 * k), p30);
      const __m512i m = _mm512_or_si512(lo, hi);
      for (int c = 0; c < NC; ++c) {
        int32_t ys;  // the activation's (sum_2k, sum_2k+1) int16 pair
        std::memcpy(&ys, a[c] + 272 + 4 * k, 4);
        mn[c] = _mm512_dpwssd_epi32(mn[c], m, _mm512_set1_epi32(ys));
      }
    });
    // Scale j as int32 lanes: (sl >> 4j) & 0x0F | (hb rotated to put its bits at 4-5)
    // & 0x30, ternary logic A&C | B&~C over B = the masked high bits.
    auto scale = [&](int j) {
      const __m512i h = _mm512_rorv_epi32(hb, _mm512_set1_epi32((kQ4KScaleHiBit[j] - 4) & 31));
      return _mm512_ternarylogic_epi32(_mm512_srl_epi32(sl, _mm_cvtsi32_si128(4 * j)), _mm512_and_si512(h, m30), m4, 0xE4);
    };
    auto chunk = [&](int ch) {  // weights 64ch..64ch+63: sub-blocks 2ch (low nibbles), 2ch+1
      __m512i alo[NC], ahi[NC];
      for (int c = 0; c < NC; ++c) alo[c] = ahi[c] = _mm512_setzero_si512();
      const uint8_t* q = p + QS + 512 * ch;
      [[maybe_unused]] __m512i rlo, rhi;  // Q5: rotations taking bits 2ch, 2ch + 1 to bit 4
      if constexpr (Q5) rlo = _mm512_set1_epi32((4 - 2 * ch) & 31), rhi = _mm512_set1_epi32((3 - 2 * ch) & 31);
      for (int g = 0; g < 8; ++g) {
        const __m512i z = _mm512_loadu_si512(q + 64 * g);
        __m512i lo, hi;
        if constexpr (Q5) {  // (nibble & 0x0F) | fifth bit: ternary logic A&C | B&~C, C = 0x0F
          const __m512i h = _mm512_loadu_si512(p + kQ5KQh + 64 * g);
          lo = _mm512_ternarylogic_epi32(z, _mm512_and_si512(_mm512_rolv_epi32(h, rlo), bit4), lowmask, 0xE4);
          hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), _mm512_and_si512(_mm512_rolv_epi32(h, rhi), bit4),
                                         lowmask, 0xE4);
        } else {
          lo = _mm512_and_si512(z, lowmask), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lowmask);
        }
        for (int c = 0; c < NC; ++c) {
          int32_t y0, y1;
          std::memcpy(&y0, a[c] + 64 * ch + 4 * g, 4);
          std::memcpy(&y1, a[c] + 64 * ch + 32 + 4 * g, 4);
          alo[c] = _mm512_dpbusd_epi32(alo[c], lo, _mm512_set1_epi32(y0));
          ahi[c] = _mm512_dpbusd_epi32(ahi[c], hi, _mm512_set1_epi32(y1));
        }
      }
      const __m512i slo = scale(2 * ch), shi = scale(2 * ch + 1);
      for (int c = 0; c < NC; ++c)
        tot[c] = _mm512_add_epi32(tot[c], _mm512_add_epi32(_mm512_mullo_epi32(alo[c], slo), _mm512_mullo_epi32(ahi[c], shi)));
    };
    // One column unrolls the chunks (shift counts become immediates); several keep a
    // loop, as unrolled their accumulators spill.
    if constexpr (NC == 1) static_for<4>([&](auto ch) { chunk(ch); });
    else
#pragma GCC unroll 1
      for (int ch = 0; ch < 4; ++ch) chunk(ch);
    for (int c = 0; c < NC; ++c) {
      const __m512 vdy = _mm512_set1_ps(PrepQ8K::d(a[c]));
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[c]), _mm512_mul_ps(d, vdy), acc[c]);
      acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mn[c]), _mm512_mul_ps(dmin, vdy), acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(res + 16 * c, acc[c]);
}

// Repacked Q6_K tile (16 rows, lane = row). Per 256-weight block: F16 d[16]; 16 x 16
// int8 sub-block scales (vector j lane i = row i's scale j); then for h = 0, 1 and
// g = 0..7 the three vectors la, lb, qh that the kernel reads together, in the order it
// reads them (one sequential stream: the hardware prefetcher carries it without
// software prefetch). Lane i of la = row i's ql[64h + 4g..+3] (weights 128h + 4g..,
// low nibbles, and 128h + 64 + 4g.., high), of lb = ql[64h + 32 + 4g..+3] (weights
// 128h + 32 + 4g.. and 128h + 96 + 4g..), of qh = qh[32h + 4g..+3], their top two bits
// (bits 0-1, 2-3, 4-5, 6-7 in that order of the four). The 6-bit values go to vpdpbusd
// unsigned; each 16-weight sub-block's accumulator starts at -32 x the activation's
// sum over it, so it holds the exact signed dot, then is scaled by the row's int8
// scale in int32 (vpmulld): one exact int32 per row and block, converted once.
template <int NC, bool PF = true>
void tile_dot_q6k(const uint8_t* tile, int64_t nb, const uint8_t* const* act, int64_t K, float* res) {
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  constexpr auto kHint = NC == 1 ? _MM_HINT_NTA : _MM_HINT_T0;  // as tile_dot
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * kQ6KTileBytes;
    if constexpr (PF)
      for (int l = 0; l < (kQ6KTileBytes + 63) / 64; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(p) + PF_DIST + 64 * l, kHint);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const uint8_t* a[NC];
    __m512i tot[NC];
    for (int c = 0; c < NC; ++c) a[c] = act[c] + size_t(b) * kQ8KBlockBytes, tot[c] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h)
      for (int qd = 0; qd < 2; ++qd) {  // g in [4qd, 4qd + 4): sub-blocks 8h + qd + {0, 2, 4, 6}
        __m512i s[NC][4];
        for (int c = 0; c < NC; ++c) {
          const int16_t* sums = PrepQ8K::sums(a[c]);
          for (int k = 0; k < 4; ++k) s[c][k] = _mm512_set1_epi32(-32 * int32_t(sums[8 * h + qd + 2 * k]));
        }
        for (int g = 4 * qd; g < 4 * qd + 4; ++g) {
          const uint8_t* q = p + kQ6KQ + kQ6KGroupBytes * (8 * h + g);
          const __m512i la = _mm512_loadu_si512(q), lb = _mm512_loadu_si512(q + 64), qh = _mm512_loadu_si512(q + 128);
          const __m512i e[4] = {
              _mm512_or_si512(_mm512_and_si512(la, m0f), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30)),
              _mm512_or_si512(_mm512_and_si512(lb, m0f), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30)),
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(la, 4), m0f), _mm512_and_si512(qh, m30)),
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lb, 4), m0f), _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30)),
          };
          for (int c = 0; c < NC; ++c)
            for (int k = 0; k < 4; ++k) {
              int32_t y;
              std::memcpy(&y, a[c] + 128 * h + 32 * k + 4 * g, 4);
              s[c][k] = _mm512_dpbusd_epi32(s[c][k], e[k], _mm512_set1_epi32(y));
            }
        }
        for (int k = 0; k < 4; ++k) {
          const __m512i sc = _mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQ6KScales + 16 * (8 * h + qd + 2 * k))));
          for (int c = 0; c < NC; ++c) tot[c] = _mm512_add_epi32(tot[c], _mm512_mullo_epi32(s[c][k], sc));
        }
      }
    for (int c = 0; c < NC; ++c)
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[c]), _mm512_mul_ps(d, _mm512_set1_ps(PrepQ8K::d(a[c]))), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(res + 16 * c, acc[c]);
}

using TileFn = void (*)(const uint8_t*, int64_t, const uint8_t* const*, int64_t, float*);
template <int NC, bool PF = true>
TileFn pick_tile(DType wt) {
  return wt == DType::Q4_0   ? &tile_dot<true, NC, 1, PF>
         : wt == DType::Q8_0 ? &tile_dot<false, NC, 1, PF>
         : wt == DType::Q4_K ? &tile_dot_q4k<NC, false, PF>
         : wt == DType::Q5_K ? &tile_dot_q4k<NC, true, PF>
                             : &tile_dot_q6k<NC, PF>;
}
// Decode: tiles per call of one column (see tile_dot), and the kernel for them.
// Q4_0 / Q8_0 walk `asked` (1, 2 or 4) tiles per call, the others one.
constexpr int kDecodeTiles = 4;  // the most
int decode_tiles(DType wt, int asked) {
  return (wt == DType::Q4_0 || wt == DType::Q8_0) && (asked == 2 || asked == kDecodeTiles) ? asked : 1;
}
template <bool PF>
TileFn pick_decode_tiles(DType wt, int g) {
  if (wt == DType::Q4_0 && g > 1) return g == 4 ? &tile_dot<true, 1, 4, PF> : &tile_dot<true, 1, 2, PF>;
  if (wt == DType::Q8_0 && g > 1) return g == 4 ? &tile_dot<false, 1, 4, PF> : &tile_dot<false, 1, 2, PF>;
  return pick_tile<1, PF>(wt);
}

}  // namespace

bool repack_supported(DType wt) {
  return wt == DType::Q4_0 || wt == DType::Q8_0 || wt == DType::Q4_K || wt == DType::Q5_K || wt == DType::Q6_K;
}

size_t repacked_bytes(DType wt, int64_t K, int64_t N) {
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  return size_t(tiles) * size_t(K / block_elems_rp(wt)) * size_t(tile_block_bytes(wt));
}

namespace {

// Zeroes tiles [t0, t1) of a repacked copy and calls f(o, i, blk) for row i of every
// tile and block: o = the tile block, blk = the row's GGUF block. Padding rows past N
// stay zero (scale 0).
template <typename F>
void for_each_tile_row(const uint8_t* w, int64_t wstride, int64_t K, int64_t N, int64_t block_elems,
                       int64_t block_bytes, int64_t tile_bytes, uint8_t* dst, int64_t t0, int64_t t1, F&& f) {
  const int64_t nb = K / block_elems;
  std::memset(dst + size_t(t0 * nb) * size_t(tile_bytes), 0, size_t((t1 - t0) * nb) * size_t(tile_bytes));
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = dst + size_t(t * nb + b) * size_t(tile_bytes);
      for (int i = 0; i < kTileRows && t * kTileRows + i < N; ++i) f(o, i, w + (t * kTileRows + i) * wstride + b * block_bytes);
    }
}

}  // namespace

void repack(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, uint8_t* dst, int64_t t0, int64_t t1) {
  if (wt == DType::Q6_K) {
    for_each_tile_row(w, wstride, K, N, QK_K, sizeof(BlockQ6_K), kQ6KTileBytes, dst, t0, t1,
                      [](uint8_t* o, int i, const uint8_t* p) {
                        const auto* blk = reinterpret_cast<const BlockQ6_K*>(p);
                        std::memcpy(o + 2 * i, &blk->d, 2);
                        for (int j = 0; j < 16; ++j) o[kQ6KScales + 16 * j + i] = uint8_t(blk->scales[j]);
                        for (int h = 0; h < 2; ++h)
                          for (int g = 0; g < 8; ++g) {
                            uint8_t* q = o + kQ6KQ + kQ6KGroupBytes * (8 * h + g) + 4 * i;
                            std::memcpy(q, blk->ql + 64 * h + 4 * g, 4);
                            std::memcpy(q + 64, blk->ql + 64 * h + 32 + 4 * g, 4);
                            std::memcpy(q + 128, blk->qh + 32 * h + 4 * g, 4);
                          }
                      });
  } else if (wt == DType::Q4_K || wt == DType::Q5_K) {
    // Both blocks start with d, dmin and the 12 scale bytes; Q5_K then has qh[32].
    const bool q5 = wt == DType::Q5_K;
    for_each_tile_row(w, wstride, K, N, QK_K, q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K), tile_block_bytes(wt), dst, t0,
                      t1, [q5](uint8_t* o, int i, const uint8_t* p) {
                        const auto* blk = reinterpret_cast<const BlockQ4_K*>(p);  // d, dmin, scales
                        const auto* blk5 = reinterpret_cast<const BlockQ5_K*>(p);
                        const uint8_t* qs = q5 ? blk5->qs : blk->qs;
                        std::memcpy(o + 2 * i, &blk->d, 2);
                        std::memcpy(o + 32 + 2 * i, &blk->dmin, 2);
                        uint32_t u[4];
                        unpack_scales_k4(blk->scales, u);
                        const uint8_t* sc = reinterpret_cast<const uint8_t*>(u);
                        const uint8_t* mi = sc + 8;
                        uint32_t sl = 0, ml = 0, hb = 0;  // see tile_dot_q4k
                        for (int j = 0; j < 8; ++j) {
                          sl |= uint32_t(sc[j] & 0xF) << (4 * j);
                          hb |= uint32_t(sc[j] >> 4) << kQ4KScaleHiBit[j];
                        }
                        for (int k = 0; k < 4; ++k) {
                          ml |= uint32_t(mi[2 * k] & 0xF) << (4 * k) | uint32_t(mi[2 * k + 1] & 0xF) << (16 + 4 * k);
                          hb |= uint32_t(mi[2 * k] >> 4) << (4 + 2 * k) | uint32_t(mi[2 * k + 1] >> 4) << (20 + 2 * k);
                        }
                        std::memcpy(o + kQ4KSl + 4 * i, &sl, 4);
                        std::memcpy(o + kQ4KMl + 4 * i, &ml, 4);
                        std::memcpy(o + kQ4KHi + 4 * i, &hb, 4);
                        const int64_t at = q5 ? kQ5KQs : kQ4KQs;
                        for (int g = 0; g < 32; ++g) std::memcpy(o + at + 64 * g + 4 * i, qs + 4 * g, 4);
                        if (q5)
                          for (int j = 0; j < 8; ++j)
                            std::memcpy(o + kQ5KQh + 64 * j + 4 * i, blk5->qh + 4 * j, 4);
                      });
  } else {
    const int64_t BS = wt == DType::Q4_0 ? 18 : 34, QB = BS - 2;  // quantized bytes per block
    for_each_tile_row(w, wstride, K, N, 32, BS, tile_block_bytes(wt), dst, t0, t1,
                      [QB](uint8_t* o, int i, const uint8_t* blk) {
                        std::memcpy(o + 2 * i, blk, 2);
                        for (int64_t g = 0; g < QB / 4; ++g) std::memcpy(o + 32 + 64 * g + 4 * i, blk + 2 + 4 * g, 4);
                      });
  }
}

size_t act_bytes_repacked(DType wt, int64_t K) {
  if (wt == DType::Q4_K || wt == DType::Q5_K || wt == DType::Q6_K) return size_t(K / QK_K) * kQ8KBlockBytes;
  return rp_off_c(K) + A64(size_t(K / 32) * 4);
}

void prep_act_repacked(DType wt, const float* x, int64_t K, uint8_t* dst) {
  if (wt == DType::Q6_K) return prep_q8_k_for(DType::Q6_K, x, K, dst);  // natural qs, d, 16-element sums
  if (wt == DType::Q4_K || wt == DType::Q5_K) {  // natural order; 32-element sums as int16 pairs
    prep_q8_k_for(DType::Q6_K, x, K, dst);  // natural qs, d, 16-element sums
    for (int64_t b = 0; b < K / QK_K; ++b) {
      int16_t* sums = reinterpret_cast<int16_t*>(dst + size_t(b) * kQ8KBlockBytes + 272);
      int16_t s32[8];
      for (int j = 0; j < 8; ++j) s32[j] = int16_t(sums[2 * j] + sums[2 * j + 1]);
      std::memcpy(sums, s32, sizeof s32);
    }
    return;
  }
  const int64_t nb = K / 32;
  int8_t* qs = reinterpret_cast<int8_t*>(dst);
  float* dd = reinterpret_cast<float*>(dst + rp_off_d(K));
  int32_t* cc = reinterpret_cast<int32_t*>(dst + rp_off_c(K));
  const int32_t mult = wt == DType::Q4_0 ? -8 : -128;
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    float id;
    const float d = q8_0_scale(x0, x1, id);
    dd[b] = round_to_f16(d);
    const __m512 vid = _mm512_set1_ps(id);
    // max(-127): an overflowing product (the infinite id of a block of tiny subnormals)
    // converts to INT_MIN, whose sums would overflow (a no-op otherwise)
    const __m512i lo = _mm512_set1_epi32(-127);
    const __m512i q0 = _mm512_max_epi32(_mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x0, vid))), lo);
    const __m512i q1 = _mm512_max_epi32(_mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x1, vid))), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    cc[b] = mult * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}

void matmul_tiles_repacked(const MatMulJob& j, int64_t N, int64_t t0, int64_t t1) {
  const TileFn f1 = pick_tile<1>(j.wt), f2 = pick_tile<2>(j.wt), f3 = pick_tile<3>(j.wt), f4 = pick_tile<4>(j.wt);
  const int64_t nb = j.K / block_elems_rp(j.wt), TB = tile_block_bytes(j.wt);
  alignas(64) float res[kDecodeTiles * 16];  // also 4 columns of one tile
  // Column m's rows of tiles [t, t + n), from r (16 per tile).
  auto store = [&](int64_t m, int64_t t, int64_t n, const float* r) {
    float* o = j.col_out(m) + t * kTileRows;
    if ((t + n) * kTileRows <= N)  // full tiles: copies of constant size, not libc calls
      for (int64_t k = 0; k < n; ++k) std::memcpy(o + k * kTileRows, r + 16 * k, sizeof(float) * kTileRows);
    else
      std::memcpy(o, r, sizeof(float) * size_t(N - t * kTileRows));
  };
  int64_t t = t0;
  if (j.M == 1) {
    const int G = decode_tiles(j.wt, j.decode_tiles);
    const TileFn fg = j.decode_prefetch ? pick_decode_tiles<true>(j.wt, G) : pick_decode_tiles<false>(j.wt, G);
    const uint8_t* a = j.col_act(0);
    for (; t + G <= t1; t += G) {
      fg(j.w + size_t(t * nb) * size_t(TB), nb, &a, j.K, res);
      store(0, t, G, res);
    }
  }
  for (; t < t1; ++t) {
    const uint8_t* tile = j.w + size_t(t * nb) * size_t(TB);
    for (int64_t m0 = 0; m0 < j.M; m0 += 4) {
      const int nc = int(std::min<int64_t>(4, j.M - m0));
      const uint8_t* a[4];
      for (int c = 0; c < nc; ++c) a[c] = j.col_act(m0 + c);
      (nc == 4 ? f4 : nc == 3 ? f3 : nc == 2 ? f2 : f1)(tile, nb, a, j.K, res);
      for (int c = 0; c < nc; ++c) store(m0 + c, t, 1, res + 16 * c);
    }
  }
}

int64_t repacking_columns(DType wt) { return wt == DType::Q4_0 || wt == DType::Q8_0 ? 8 : 32; }

void matmul_tiles_repacking(const MatMulJob& j, int64_t N, int64_t t0, int64_t t1, uint8_t* scratch) {
  const TileFn f1 = pick_tile<1>(j.wt), f2 = pick_tile<2>(j.wt), f3 = pick_tile<3>(j.wt), f4 = pick_tile<4>(j.wt);
  const int64_t nb = j.K / block_elems_rp(j.wt);
  alignas(64) float res[4 * 16];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t rows = std::min<int64_t>(kTileRows, N - t * kTileRows);
    // The tile, repacked as tile 0 of a weight whose rows start at row t * 16.
    repack(j.wt, j.w + size_t(t * kTileRows) * size_t(j.wstride), j.wstride, j.K, rows, scratch, 0, 1);
    for (int64_t m0 = 0; m0 < j.M; m0 += 4) {
      const int nc = int(std::min<int64_t>(4, j.M - m0));
      const uint8_t* a[4];
      for (int c = 0; c < nc; ++c) a[c] = j.col_act(m0 + c);
      (nc == 4 ? f4 : nc == 3 ? f3 : nc == 2 ? f2 : f1)(scratch, nb, a, j.K, res);
      for (int c = 0; c < nc; ++c) std::memcpy(j.col_out(m0 + c) + t * kTileRows, res + 16 * c, sizeof(float) * size_t(rows));
    }
  }
}

}  // namespace tessera::cpu_avx512::kern
