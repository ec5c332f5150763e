// AVX-512 row kernels of the format-kernel weight types (compiled with the kernel flags):
// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (blocks of 32) and Q2_K, Q3_K, IQ4_XS (blocks of
// 256). Like the row kernels of kernels_matmul.cpp, every weight row is dequantized in
// registers against an activation column converted once to the reference's vec_dot
// type (quant::quantize_row of Q8_0 / Q8_1 / Q8_K, bit for bit) and laid out
// ("prepared") in the order the weight bytes unpack into, with the offset corrections
// that make an unsigned x signed product (vpdpbusd, vpmaddubsw) signed. Integer sums
// are exact. Blocks of 32 scale and add each block's sum as cpu_scalar does (bit for
// bit); blocks of 256 differ from it in the float accumulation order.
//
// Blocks of 32 (prep_p32 / dot_p32): 4 blocks per step. Their 4 x 16 bytes of nibbles
// fill one 512-bit register, 128-bit lane k = block k (picked out of the group's bytes
// by one vpermt2w, with the F16 scales by another; MXFP4, whose fields sit at odd
// offsets, inserts 16-byte loads); the low nibbles (elements 0-15 of each block) and
// the high ones (16-31) are two vpdpbusd operands against two activation planes in
// the same order, so each lane's int32 sums belong to one block, scaled by the
// block's dx * dy (the reference's product; Q4_0: by dx, then by dy) in the lane's 4
// floats:
//  - Q4_0: q (0..15) unsigned, the accumulator starts at -8 x (the lane's activations);
//  - Q4_1 / Q5_1: q (0..15 / 0..31) unsigned as is; the min uses the Q8_1 block sum s;
//  - Q5_0: q (0..31) unsigned, the accumulator starts at -16 x (the lane's activations);
//  - IQ4_NL / MXFP4: vpshufb maps the nibble to its grid value + 128 (unsigned), the
//    accumulator starts at -128 x (the lane's activations).
// The fifth bits of Q5_0 / Q5_1 become two 64-bit masks (one bit per byte) per step.
//
// Blocks of 256 (Q8_K activations):
//  - Q2_K / Q3_K: the 64 bytes of 2-bit fields give 4 vectors (shift 0, 2, 4, 6), each
//    holding 32 elements of both 128-element halves; Q3_K's high bit (hmask) is
//    merged with a masked OR. vpmaddubsw (q unsigned) then vpdpwssd with the 16-element
//    sub-block scales (int16) keeps the block's scaled sum exact in int32. Q3_K's -4
//    offset is -4 x sum(scale x 16-element activation sum), subtracted in int32;
//    Q2_K's mins use the same sums, scaled by dmin as the reference does.
//  - IQ4_XS: each 128-bit lane of the 128 nibble bytes is one 32-element sub-block; the
//    grid values + 128 go through vpdpbusd (accumulator started at -128 x the lane's
//    activations, exact in int32), then each lane is scaled by its sub-block's float
//    scale d * dy * (ls - 32) as the reference computes it.
//
// No static initializer in this file executes AVX-512 code (constants are built
// inside the functions).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "kernels_matmul_common.h"
#include "kernels_simd.h"
#include "tessera/quant_blocks.h"

namespace tessera::cpu_avx512::kern {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void prefetch_w(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + PF_DIST, _MM_HINT_T0); }

// ---------------------------------------------------------------- blocks of 32

enum class F32 { Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 };

// The 16-entry grid + 128 as bytes (IQ4_NL, MXFP4), in every 128-bit lane (a
// constant in .rodata, loaded: nothing runs at static initialization).
template <F32 F>
struct Grid {
  static constexpr const int8_t* src() { return F == F32::MXFP4 ? quant::kMXFP4Values : quant::kIQ4NLValues; }
  alignas(16) static constexpr uint8_t kBiased[16] = {
      uint8_t(src()[0] + 128),  uint8_t(src()[1] + 128),  uint8_t(src()[2] + 128),  uint8_t(src()[3] + 128),
      uint8_t(src()[4] + 128),  uint8_t(src()[5] + 128),  uint8_t(src()[6] + 128),  uint8_t(src()[7] + 128),
      uint8_t(src()[8] + 128),  uint8_t(src()[9] + 128),  uint8_t(src()[10] + 128), uint8_t(src()[11] + 128),
      uint8_t(src()[12] + 128), uint8_t(src()[13] + 128), uint8_t(src()[14] + 128), uint8_t(src()[15] + 128)};
};
template <F32 F>
inline __m512i grid_table() {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(Grid<F>::kBiased)));
}

template <F32 F>
struct P32 {
  static constexpr int64_t BS =
      F == F32::Q4_1 ? 20 : F == F32::Q5_0 ? 22 : F == F32::Q5_1 ? 24 : F == F32::IQ4_NL || F == F32::Q4_0 ? 18 : 17;
  static constexpr int64_t QS =
      F == F32::Q4_1 ? 4 : F == F32::Q5_0 ? 6 : F == F32::Q5_1 ? 8 : F == F32::IQ4_NL || F == F32::Q4_0 ? 2 : 1;
  static constexpr int64_t QH = F == F32::Q5_0 ? 2 : 4;  // Q5_0 / Q5_1 only
  static constexpr bool kQ5 = F == F32::Q5_0 || F == F32::Q5_1;
  static constexpr bool kMin = F == F32::Q4_1 || F == F32::Q5_1;  // Q8_1 activations
  static constexpr bool kTable = F == F32::IQ4_NL || F == F32::MXFP4;
  static constexpr int kBias = F == F32::Q4_0 ? 8 : F == F32::Q5_0 ? 16 : kTable ? 128 : 0;
  // The reference scales Q4_0's integer sum by dx, then by dy; the others by dx * dy.
  static constexpr bool kScaleFirst = F == F32::Q4_0;
  // Prepared column, per group of 4 blocks: [lo plane 64][hi plane 64] ([corr 64:
  // int32]) [d 64: the 4 blocks' float d (rounded through F16), each in its lane's 4
  // floats] ([s 64: Q8_1's s, likewise]).
  static constexpr int64_t kCorr = 128, kD = kBias ? 192 : 128, kS = kD + 64;
  static constexpr int64_t GB = kD + (kMin ? 128 : 64);
  static int64_t groups(int64_t K) { return (K / 32 + 3) / 4; }
  static size_t bytes(int64_t K) { return size_t(groups(K) * GB); }
};

// Q8_0 (Q8_1: plus s) quantization exactly as quant::quantize_row, into the P32 layout.
template <F32 F>
void prep_p32(const float* x, int64_t K, uint8_t* dst) {
  using P = P32<F>;
  const int64_t nb = K / 32, ng = P::groups(K);
  std::memset(dst, 0, P::bytes(K));
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    float id;
    const float d = q8_0_scale(x0, x1, id);
    const __m512 vid = _mm512_set1_ps(id);
    // max(-127): an overflowing product (the infinite id of a block of tiny subnormals)
    // converts to INT_MIN, whose sums would overflow (a no-op otherwise)
    const __m512i lo = _mm512_set1_epi32(-127);
    const __m512i q0 = _mm512_max_epi32(_mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x0, vid))), lo);
    const __m512i q1 = _mm512_max_epi32(_mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(x1, vid))), lo);
    uint8_t* g = dst + (b / 4) * P::GB;
    const int k = int(b % 4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(g + 16 * k), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(g + 64 + 16 * k), _mm512_cvtepi32_epi8(q1));
    _mm_storeu_ps(reinterpret_cast<float*>(g + P::kD) + 4 * k, _mm_set1_ps(round_to_f16(d)));
    if constexpr (P::kMin) {
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm_storeu_ps(reinterpret_cast<float*>(g + P::kS) + 4 * k, _mm_set1_ps(round_to_f16(float(sum) * d)));
    }
  }
  if constexpr (P::kBias != 0) {
    const __m512i z = _mm512_setzero_si512(), bias = _mm512_set1_epi8(char(P::kBias));
    for (int64_t g = 0; g < ng; ++g) {
      uint8_t* a = dst + g * P::GB;
      const __m512i c = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, bias, _mm512_load_si512(a)), bias,
                                            _mm512_load_si512(a + 64));
      _mm512_store_si512(a + P::kCorr, _mm512_sub_epi32(z, c));
    }
  }
}

// Index vectors for vpermt2w over the (up to 128) bytes of 4 consecutive blocks (two
// registers): word 8k + t of `qs` = word t of block k's nibbles; word 4k + t (t < 4) of
// `d` = block k's F16 d, of `m` = its F16 m; lane k of `qh` = block k's qh low word 4
// times, then its high word 4 times. Only for the formats whose fields sit at even
// offsets (not MXFP4).
template <F32 F>
struct P32Idx {
  alignas(64) int16_t qs[32], d[32], m[32], qh[32];
  constexpr P32Idx() : qs(), d(), m(), qh() {
    using P = P32<F>;
    for (int k = 0; k < 4; ++k)
      for (int t = 0; t < 8; ++t) {
        qs[8 * k + t] = int16_t((P::QS + k * P::BS) / 2 + t);
        qh[8 * k + t] = int16_t((P::QH + k * P::BS) / 2 + (t >= 4 ? 1 : 0));
      }
    for (int k = 0; k < 4; ++k)
      for (int t = 0; t < 4; ++t) d[4 * k + t] = int16_t(k * P::BS / 2), m[4 * k + t] = int16_t((2 + k * P::BS) / 2);
    for (int i = 16; i < 32; ++i) d[i] = m[i] = 0;
  }
};
template <F32 F>
inline constexpr P32Idx<F> kP32Idx{};

// One group of `cnt` (1..4) blocks at bp: lo / hi = the unsigned weight bytes of
// elements 0-15 / 16-31 of block k in 128-bit lane k (zero for missing blocks); dw =
// each block's scale (F16 d, or MXFP4's 2^(e-128)) in its lane's 4 floats; mw (Q4_1,
// Q5_1) = each block's F16 m in the first float of its lane, 0 elsewhere.
template <F32 F>
struct P32Group {
  __m512i lo, hi;
  __m512 dw, mw;
  P32Group(const uint8_t* bp, int cnt, __m512i tbl) {
    using P = P32<F>;
    const __m512i lowmask = _mm512_set1_epi8(0x0F);
    __m512i z;
    if constexpr (F == F32::MXFP4) {
      uint32_t e = 0;
      if (cnt == 4) {
        z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 1)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 18)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 35)), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + 52)), 3);
        e = uint32_t(bp[0]) | uint32_t(bp[17]) << 8 | uint32_t(bp[34]) << 16 | uint32_t(bp[51]) << 24;
      } else {
        alignas(64) uint8_t buf[64] = {};
        for (int k = 0; k < cnt; ++k) std::memcpy(buf + 16 * k, bp + 17 * k + 1, 16), e |= uint32_t(bp[17 * k]) << (8 * k);
        z = _mm512_load_si512(buf);
      }
      // 2^(e-128) (quant::e8m0_to_fp32_half): (e-1) << 23, or 0x00200000 << e for e < 2.
      const __m512i v = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(
          _mm_cvtsi32_si128(int(e)), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)));
      const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
      const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v);
      const __m512i r = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2)), normal, sub);
      dw = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(__mmask16((1u << (4 * cnt)) - 1), r));
    } else {
      // The group's bytes as two registers (masked: nothing is read past block cnt - 1).
      const int64_t n = cnt * P::BS;
      const __m512i w0 = _mm512_maskz_loadu_epi8(n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1, bp);
      const __m512i w1 = n > 64 ? _mm512_maskz_loadu_epi8((__mmask64(1) << (n - 64)) - 1, bp + 64) : _mm512_setzero_si512();
      const P32Idx<F>& ix = kP32Idx<F>;
      z = _mm512_permutex2var_epi16(w0, _mm512_load_si512(ix.qs), w1);
      dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(w0, _mm512_load_si512(ix.d), w1)));
      if constexpr (P::kMin)
        mw = _mm512_cvtph_ps(_mm512_castsi512_si256(
            _mm512_maskz_permutex2var_epi16(__mmask32(0x1111), w0, _mm512_load_si512(ix.m), w1)));
      if constexpr (P::kQ5) {
        // Fifth bits: lane k = block k's qh words; byte j of the lo (hi) plane tests bit
        // j % 8 of byte j / 8 of the low (high) word.
        const __m512i qh = _mm512_permutex2var_epi16(w0, _mm512_load_si512(ix.qh), w1);
        const __m512i bits = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128));
        const __m512i plo = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
        const __m512i phi = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9));
        const __mmask64 mlo = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, plo), bits);
        const __mmask64 mhi = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, phi), bits);
        const __m512i sixteen = _mm512_set1_epi8(16);
        lo = _mm512_mask_add_epi8(_mm512_and_si512(z, lowmask), mlo, _mm512_and_si512(z, lowmask), sixteen);
        hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lowmask);
        hi = _mm512_mask_add_epi8(hi, mhi, hi, sixteen);
        return;
      }
    }
    lo = _mm512_and_si512(z, lowmask);
    hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), lowmask);
    if constexpr (P::kTable) {
      lo = _mm512_shuffle_epi8(tbl, lo);
      hi = _mm512_shuffle_epi8(tbl, hi);
    }
  }
};

template <F32 F, int NC>
void dot_p32(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  using P = P32<F>;
  const int64_t nb = K / 32;
  float sum[NC];
  for (int c = 0; c < NC; ++c) sum[c] = 0.0f;
  const __m512i tbl = P::kTable ? grid_table<F>() : _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; b += 4) {
    const uint8_t* bp = w + b * P::BS;
    prefetch_w(bp);
    prefetch_w(bp + 64);
    const int cnt = int(std::min<int64_t>(4, nb - b));
    const P32Group<F> g(bp, cnt, tbl);
    const size_t go = size_t(b / 4) * P::GB;
    for (int c = 0; c < NC; ++c) {
      const uint8_t* a = act[c] + go;
      __m512i i = P::kBias ? _mm512_load_si512(a + P::kCorr) : _mm512_setzero_si512();
      i = _mm512_dpbusd_epi32(i, g.lo, _mm512_load_si512(a));
      i = _mm512_dpbusd_epi32(i, g.hi, _mm512_load_si512(a + 64));
      // Each block's integer sum in all four of its lanes (exact), times the weight
      // scale x activation scale, as the reference multiplies them; the blocks' terms
      // then added to the sum one by one in block order, as the reference adds them, so
      // the result equals cpu_scalar's bit for bit.
      i = _mm512_add_epi32(i, _mm512_shuffle_epi32(i, _MM_PERM_CDAB));
      i = _mm512_add_epi32(i, _mm512_shuffle_epi32(i, _MM_PERM_BADC));
      const __m512 dy = _mm512_load_ps(reinterpret_cast<const float*>(a + P::kD));
      __m512 term = P::kScaleFirst ? _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(i), g.dw), dy)
                                   : _mm512_mul_ps(_mm512_mul_ps(g.dw, dy), _mm512_cvtepi32_ps(i));
      if constexpr (P::kMin)
        term = _mm512_add_ps(term, _mm512_mul_ps(g.mw, _mm512_load_ps(reinterpret_cast<const float*>(a + P::kS))));
      alignas(64) float t[16];
      _mm512_store_ps(t, term);
      for (int k = 0; k < cnt; ++k) sum[c] += t[4 * k];
    }
  }
  for (int c = 0; c < NC; ++c) res[c] = sum[c];
}

// ---------------------------------------------------------------- blocks of 256 (Q8_K)

// Q2_K / Q3_K prepared block (320 bytes): vector j (bytes 64j..64j+63) = elements
// 32j..32j+31 then 128+32j..128+32j+31; float d at 256; the 16-element sums (natural
// order, int16) at 288 (32-byte aligned).
constexpr size_t kPK2Bytes = 320;
// IQ4_XS prepared block: planes (m, h) at 128m + 64h, byte 16k + j = element
// 32(4m+k) + 16h + j; at 256 + 64m the int32 corrections (-128 x lane sum of vector m's
// two planes); float d at 384.
constexpr size_t kPXSBytes = 448;

void prep_q2q3(const float* x, int64_t K, uint8_t* dst) {
  alignas(64) int8_t q[256];
  int16_t sums[16];
  for (int64_t b = 0; b < K / 256; ++b) {
    uint8_t* o = dst + size_t(b) * kPK2Bytes;
    float d;
    quant_q8_k_block(x + 256 * b, q, sums, d);
    std::memset(o + 256, 0, 64);
    for (int j = 0; j < 4; ++j) {
      std::memcpy(o + 64 * j, q + 32 * j, 32);
      std::memcpy(o + 64 * j + 32, q + 128 + 32 * j, 32);
    }
    std::memcpy(o + 256, &d, 4);
    std::memcpy(o + 288, sums, 32);
  }
}

void prep_iq4xs(const float* x, int64_t K, uint8_t* dst) {
  alignas(64) int8_t q[256];
  int16_t sums[16];
  const __m512i z = _mm512_setzero_si512(), bias = _mm512_set1_epi8(char(0x80));
  for (int64_t b = 0; b < K / 256; ++b) {
    uint8_t* o = dst + size_t(b) * kPXSBytes;
    float d;
    quant_q8_k_block(x + 256 * b, q, sums, d);
    for (int m = 0; m < 2; ++m)
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 2; ++h) std::memcpy(o + 128 * m + 64 * h + 16 * k, q + 32 * (4 * m + k) + 16 * h, 16);
    for (int m = 0; m < 2; ++m) {
      const __m512i c = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, bias, _mm512_load_si512(o + 128 * m)), bias,
                                            _mm512_load_si512(o + 128 * m + 64));
      _mm512_store_si512(o + 256 + 64 * m, _mm512_sub_epi32(z, c));
    }
    std::memset(o + 384, 0, 64);
    std::memcpy(o + 384, &d, 4);
  }
}

// vpshufb indices giving, in each 128-bit lane, one int16 of the lane repeated 8 times:
// element e in lanes 0 and 2, e + 1 in lanes 1 and 3.
inline __m512i int16_pick(int e) {
  const short w0 = short(((2 * e + 1) << 8) | (2 * e)), w1 = short(((2 * e + 3) << 8) | (2 * e + 2));
  return _mm512_mask_blend_epi16(__mmask32(0xFF00FF00u), _mm512_set1_epi16(w0), _mm512_set1_epi16(w1));
}

// Q2_K (Q3 = false) / Q3_K (Q3 = true). Vector j of the block's 2-bit fields holds
// sub-blocks 2j, 2j+1 (lower half) and 8+2j, 9+2j (upper half), one per 128-bit lane:
// its scale vector comes from the 16 int16 scales laid out [0-7, 0-7, 8-15, 8-15].
// NR weight rows (stride wstride) x NC columns per call, res[4 * r + c]; each row's
// arithmetic is the same whatever NR is, so results do not depend on the pairing.
template <bool Q3>
struct Q23Consts {
  __m512i three, four8, pick[4], hb[4];
  Q23Consts() {
    three = _mm512_set1_epi8(3), four8 = _mm512_set1_epi8(4);
    for (int j = 0; j < 4; ++j) {
      pick[j] = int16_pick(2 * j);
      // Q3_K: bit j of hmask (lower half: elements 0-127) and bit 4 + j (upper half).
      hb[j] = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << j)), _mm256_set1_epi8(char(1 << (4 + j))), 1);
    }
  }
};

// One block of one row, unpacked: the 4 vectors of unsigned weights, their scale
// vectors, the 16 scales (and Q2_K's mins) as int16, d and dmin.
template <bool Q3>
struct Q23Block {
  __m512i q[4], sv[4];
  __m256i s16, m16;
  float d, dmin;
  Q23Block(const uint8_t* bp, const Q23Consts<Q3>& k) {
    constexpr int64_t QS = Q3 ? 32 : 16;
    dmin = 0.f;
    if constexpr (Q3) {
      // The 6-bit scales (biased by 32) from their 12 bytes (quant::detail::q3_k_scales).
      constexpr uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
      const uint32_t a0 = load_u32(bp + 96), a1 = load_u32(bp + 100), a2 = load_u32(bp + 104);
      const uint32_t u0 = (a0 & k2) | ((a2 & k1) << 4), u1 = (a1 & k2) | (((a2 >> 2) & k1) << 4),
                     u2 = ((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4), u3 = ((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4);
      const __m128i s8 = _mm_sub_epi8(
          _mm_set_epi64x(int64_t(uint64_t(u2) | (uint64_t(u3) << 32)), int64_t(uint64_t(u0) | (uint64_t(u1) << 32))),
          _mm_set1_epi8(32));
      s16 = _mm256_cvtepi8_epi16(s8);
      m16 = _mm256_setzero_si256();
      d = h2f(load_u16(bp + 108));
    } else {
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bp));
      s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
      m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
      d = h2f(load_u16(bp + 80));
      dmin = h2f(load_u16(bp + 82));
    }
    const __m512i S = _mm512_castsi256_si512(s16);
    const __m512i B = _mm512_shuffle_i64x2(S, S, _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i z = _mm512_loadu_si512(bp + QS);
    q[0] = _mm512_and_si512(z, k.three);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(z, 2), k.three);
    q[2] = _mm512_and_si512(_mm512_srli_epi16(z, 4), k.three);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(z, 6), k.three);
    if constexpr (Q3) {
      const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp)));
      for (int j = 0; j < 4; ++j) q[j] = _mm512_mask_add_epi8(q[j], _mm512_test_epi8_mask(H, k.hb[j]), q[j], k.four8);
    }
    for (int j = 0; j < 4; ++j) sv[j] = _mm512_shuffle_epi8(B, k.pick[j]);
  }
};

template <bool Q3, int NR, int NC>
void dot_q2q3_rows(const uint8_t* w, int64_t wstride, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / 256;
  constexpr int64_t BS = Q3 ? 110 : 84;
  __m512 acc[NR][NC];
  __m256 accm[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps(), accm[r][c] = _mm256_setzero_ps();
  const Q23Consts<Q3> k;
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* bp = w + r * wstride + b * BS;
      prefetch_w(bp);
      prefetch_w(bp + 64);
      const Q23Block<Q3> blk(bp, k);
      for (int c = 0; c < NC; ++c) {
        const uint8_t* a = act[c] + size_t(b) * kPK2Bytes;
        __m512i i = _mm512_madd_epi16(_mm512_maddubs_epi16(blk.q[0], _mm512_load_si512(a)), blk.sv[0]);
        i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(blk.q[1], _mm512_load_si512(a + 64)), blk.sv[1]);
        i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(blk.q[2], _mm512_load_si512(a + 128)), blk.sv[2]);
        i = _mm512_dpwssd_epi32(i, _mm512_maddubs_epi16(blk.q[3], _mm512_load_si512(a + 192)), blk.sv[3]);
        float dy;
        std::memcpy(&dy, a + 256, 4);
        const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 288));
        if constexpr (Q3) {
          // The -4 offset: 4 x sum(scale x 16-element sum), in int32 (exact).
          const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(blk.s16, bs), 2);
          i = _mm512_sub_epi32(i, _mm512_zextsi256_si512(off));
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(blk.d * dy), acc[r][c]);
        } else {
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(dy * blk.d), acc[r][c]);
          accm[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(blk.m16, bs)), _mm256_set1_ps(dy * blk.dmin),
                                       accm[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) {
      float v = _mm512_reduce_add_ps(acc[r][c]);
      if constexpr (!Q3) {
        __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm[r][c]), _mm256_extractf128_ps(accm[r][c], 1));
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        v -= _mm_cvtss_f32(m);
      }
      res[4 * r + c] = v;
    }
}
template <bool Q3, int NC>
void dot_q2q3(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  dot_q2q3_rows<Q3, 1, NC>(w, 0, K, act, res);
}

// IQ4_XS: 8 sub-blocks of 32, lane k of vector m (the qs bytes 64m..64m+63) = sub-block
// 4m + k. Each lane's int32 sums (exact) are scaled by the sub-block's float scale
// d * dy * (ls - 32), the reference's dl, computed as it does. NR rows as dot_q2q3_rows.
template <int NR, int NC>
void dot_iq4xs_rows(const uint8_t* w, int64_t wstride, int64_t K, const uint8_t* const* act, float* res) {
  const int64_t nb = K / 256;
  constexpr int64_t BS = 136;
  __m512 acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i tbl = grid_table<F32::IQ4_NL>(), lowmask = _mm512_set1_epi8(0x0F);
  const __m256i shl = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), shh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i lanes0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i lanes1 = _mm512_add_epi32(lanes0, _mm512_set1_epi32(4));
  for (int64_t b = 0; b < nb; ++b)
    for (int r = 0; r < NR; ++r) {
      const uint8_t* bp = w + r * wstride + b * BS;
      prefetch_w(bp);
      prefetch_w(bp + 64);
      prefetch_w(bp + 128);
      const float d = h2f(load_u16(bp));
      // ls - 32 of the 8 sub-blocks: low 4 bits from scales_l, high 2 from scales_h.
      const __m256i lo4 =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(load_u32(bp + 4))), shl), _mm256_set1_epi32(0xF));
      const __m256i hi2 =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(load_u16(bp + 2))), shh), _mm256_set1_epi32(3));
      const __m256 ls =
          _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32(hi2, 4)), _mm256_set1_epi32(32)));
      const __m512i z0 = _mm512_loadu_si512(bp + 8), z1 = _mm512_loadu_si512(bp + 72);
      const __m512i l0 = _mm512_shuffle_epi8(tbl, _mm512_and_si512(z0, lowmask));
      const __m512i h0 = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(z0, 4), lowmask));
      const __m512i l1 = _mm512_shuffle_epi8(tbl, _mm512_and_si512(z1, lowmask));
      const __m512i h1 = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(z1, 4), lowmask));
      for (int c = 0; c < NC; ++c) {
        const uint8_t* a = act[c] + size_t(b) * kPXSBytes;
        __m512i i0 = _mm512_dpbusd_epi32(_mm512_load_si512(a + 256), l0, _mm512_load_si512(a));
        i0 = _mm512_dpbusd_epi32(i0, h0, _mm512_load_si512(a + 64));
        __m512i i1 = _mm512_dpbusd_epi32(_mm512_load_si512(a + 320), l1, _mm512_load_si512(a + 128));
        i1 = _mm512_dpbusd_epi32(i1, h1, _mm512_load_si512(a + 192));
        float dy;
        std::memcpy(&dy, a + 384, 4);
        const __m512 dl = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(d * dy), ls));
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_permutexvar_ps(lanes0, dl), acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_permutexvar_ps(lanes1, dl), acc[r][c]);
      }
    }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) res[4 * r + c] = _mm512_reduce_add_ps(acc[r][c]);
}
template <int NC>
void dot_iq4xs(const uint8_t* w, int64_t K, const uint8_t* const* act, float* res) {
  dot_iq4xs_rows<1, NC>(w, 0, K, act, res);
}

template <int NC>
RowDotFn pick_nc(DType wt) {
  switch (wt) {
    case DType::Q4_0: return &dot_p32<F32::Q4_0, NC>;
    case DType::Q4_1: return &dot_p32<F32::Q4_1, NC>;
    case DType::Q5_0: return &dot_p32<F32::Q5_0, NC>;
    case DType::Q5_1: return &dot_p32<F32::Q5_1, NC>;
    case DType::IQ4_NL: return &dot_p32<F32::IQ4_NL, NC>;
    case DType::MXFP4: return &dot_p32<F32::MXFP4, NC>;
    case DType::Q2_K: return &dot_q2q3<false, NC>;
    case DType::Q3_K: return &dot_q2q3<true, NC>;
    case DType::IQ4_XS: return &dot_iq4xs<NC>;
    default: return nullptr;
  }
}

}  // namespace

bool format_supported(DType wt) { return pick_nc<1>(wt) != nullptr; }

size_t format_act_bytes(DType wt, int64_t K) {
  switch (wt) {
    case DType::Q4_0: return P32<F32::Q4_0>::bytes(K);
    case DType::Q4_1: return P32<F32::Q4_1>::bytes(K);
    case DType::Q5_0: return P32<F32::Q5_0>::bytes(K);
    case DType::Q5_1: return P32<F32::Q5_1>::bytes(K);
    case DType::IQ4_NL: return P32<F32::IQ4_NL>::bytes(K);
    case DType::MXFP4: return P32<F32::MXFP4>::bytes(K);
    case DType::Q2_K:
    case DType::Q3_K: return size_t(K / 256) * kPK2Bytes;
    case DType::IQ4_XS: return size_t(K / 256) * kPXSBytes;
    default: return 0;
  }
}

void format_prep_act(DType wt, const float* x, int64_t K, uint8_t* dst) {
  switch (wt) {
    case DType::Q4_0: return prep_p32<F32::Q4_0>(x, K, dst);
    case DType::Q4_1: return prep_p32<F32::Q4_1>(x, K, dst);
    case DType::Q5_0: return prep_p32<F32::Q5_0>(x, K, dst);
    case DType::Q5_1: return prep_p32<F32::Q5_1>(x, K, dst);
    case DType::IQ4_NL: return prep_p32<F32::IQ4_NL>(x, K, dst);
    case DType::MXFP4: return prep_p32<F32::MXFP4>(x, K, dst);
    case DType::Q2_K:
    case DType::Q3_K: return prep_q2q3(x, K, dst);
    case DType::IQ4_XS: return prep_iq4xs(x, K, dst);
    default: return;
  }
}

RowDot2Fn format_dot2(DType wt) {
  switch (wt) {
    case DType::Q2_K: return &dot_q2q3_rows<false, 2, 1>;
    case DType::Q3_K: return &dot_q2q3_rows<true, 2, 1>;
    case DType::IQ4_XS: return &dot_iq4xs_rows<2, 1>;
    default: return nullptr;
  }
}

RowDotFn format_dot(DType wt, int nc) {
  switch (nc) {
    case 1: return pick_nc<1>(wt);
    case 2: return pick_nc<2>(wt);
    case 3: return pick_nc<3>(wt);
    case 4: return pick_nc<4>(wt);
    default: return nullptr;
  }
}

}  // namespace tessera::cpu_avx512::kern
