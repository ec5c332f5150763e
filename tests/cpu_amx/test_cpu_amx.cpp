// The cpu_amx backend: the tile emulator against hand-computed results and (where
// the CPU has AMX) against the instructions themselves; the tile products against
// cpu_scalar's dot products bit for bit (emulated, and real where possible); the
// backend through the conformance API with every product forced onto the tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "cpu_amx_backend.h"
#include "cpu_scalar_backend.h"
#include "kernels.h"
#include "tessera/conformance.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/hwprobe.h"
#include "tessera/plugin_config.h"
#include "tessera/plugin_registry.h"
#include "tessera/quant.h"
#include "tessera/scheduler.h"
#include "tile.h"

namespace tessera::cpu_amx {
namespace {

using tile::Config;
using tile::Dp;
using tile::Emulator;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bf16_of(float f) { return uint16_t(bits(f) >> 16); }  // exact for the values used here

Config cfg_mnk(int M, int N4, int K4) {  // tmm0 = C (M x N4 dwords), tmm1 = A (M x K4), tmm2 = B (K4 x N4)
  Config c;
  c.palette_id = 1;
  c.rows[0] = uint8_t(M), c.colsb[0] = uint16_t(4 * N4);
  c.rows[1] = uint8_t(M), c.colsb[1] = uint16_t(4 * K4);
  c.rows[2] = uint8_t(K4), c.colsb[2] = uint16_t(4 * N4);
  return c;
}

bool cpu_avx512_usable_here(std::string* why) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_usable() && f.avx512vnni && f.avx512bf16 && f.avx512dq && f.fma && f.f16c) return true;
  *why = "no AVX-512 here (the vectorized quantizer is cpu_avx512's)";
  return false;
}

std::string real_amx_skip_reason() {
  std::string why;
  if (!hardware_usable(&why)) return "no AMX here: " + why;
  return {};
}

// ---- Emulator: configuration and faults ------------------------------------------

TEST(CpuAmxTileEmulator, ConfigValidation) {
  Config ok = cfg_mnk(16, 16, 16);
  EXPECT_EQ(tile::check_config(ok), "");
  Config c = ok;
  c.rows[3] = 17, c.colsb[3] = 4;
  EXPECT_NE(tile::check_config(c).find("17 rows"), std::string::npos);
  c = ok;
  c.colsb[3] = 65, c.rows[3] = 1;
  EXPECT_NE(tile::check_config(c).find("65 bytes"), std::string::npos);
  c = ok;
  c.palette_id = 2;
  EXPECT_NE(tile::check_config(c), "");
  c = ok;
  c.reserved0[5] = 1;
  EXPECT_NE(tile::check_config(c), "");
  c = ok;
  c.rows[9] = 1;  // tile 9 does not exist in palette 1
  EXPECT_NE(tile::check_config(c), "");
  c = ok;
  c.rows[4] = 3;  // rows without bytes per row
  EXPECT_NE(tile::check_config(c), "");
  Config zero;  // palette 0: back to the init state
  EXPECT_EQ(tile::check_config(zero), "");

  Emulator e;
  EXPECT_FALSE(e.configured());
  EXPECT_THROW(e.zero(0), Error);  // #UD before LDTILECFG
  c = ok;
  c.rows[3] = 17, c.colsb[3] = 4;
  EXPECT_THROW(e.ldtilecfg(c), Error);
  EXPECT_FALSE(e.configured());
  e.ldtilecfg(ok);
  EXPECT_TRUE(e.configured());
  e.ldtilecfg(zero);
  EXPECT_FALSE(e.configured());
}

TEST(CpuAmxTileEmulator, ProductShapeFaults) {
  Emulator e;
  e.ldtilecfg(cfg_mnk(4, 4, 2));
  EXPECT_NO_THROW(e.dpb(Dp::SS, 0, 1, 2));
  EXPECT_THROW(e.dpb(Dp::SS, 0, 0, 2), Error);  // aliased operands
  EXPECT_THROW(e.dpb(Dp::SS, 0, 2, 1), Error);  // A's K (4 dwords) != B's rows (4)? B as A: rows 2 != C's 4
  Config c = cfg_mnk(4, 4, 2);
  c.rows[2] = 3;  // B rows != A's dwords per row
  e.ldtilecfg(c);
  EXPECT_THROW(e.dpb(Dp::SS, 0, 1, 2), Error);
  c = cfg_mnk(4, 4, 2);
  c.colsb[2] = 12;  // B's columns != C's
  e.ldtilecfg(c);
  EXPECT_THROW(e.dpbf16ps(0, 1, 2), Error);
  c = cfg_mnk(4, 4, 2);
  c.rows[1] = 5;  // A's rows != C's
  e.ldtilecfg(c);
  EXPECT_THROW(e.dpb(Dp::UU, 0, 1, 2), Error);
}

TEST(CpuAmxTileEmulator, LoadZeroFillsAndStoreWritesTheShape) {
  Emulator e;
  Config c;
  c.palette_id = 1;
  c.rows[0] = 2, c.colsb[0] = 3;
  e.ldtilecfg(c);
  uint8_t src[2 * 8];
  for (int i = 0; i < 16; ++i) src[i] = uint8_t(i + 1);
  e.loadd(0, src, 8);  // rows 0 and 1, 3 bytes each, stride 8
  const uint8_t* t = e.data(0);
  EXPECT_EQ(t[0], 1);
  EXPECT_EQ(t[2], 3);
  EXPECT_EQ(t[3], 0);
  EXPECT_EQ(t[64], 9);
  EXPECT_EQ(t[66], 11);
  EXPECT_EQ(t[67], 0);
  EXPECT_EQ(t[128], 0);
  uint8_t dst[16];
  std::memset(dst, 0xAA, sizeof dst);
  e.stored(0, dst, 8);
  EXPECT_EQ(dst[0], 1);
  EXPECT_EQ(dst[2], 3);
  EXPECT_EQ(dst[3], 0xAA);
  EXPECT_EQ(dst[8], 9);
  EXPECT_EQ(dst[10], 11);
  EXPECT_EQ(dst[11], 0xAA);
}

// ---- Emulator: int8 products ------------------------------------------------------

// One row, one dword of A times one dword column of B, accumulated into C.
int32_t dot1(Dp kind, const int8_t a[4], const int8_t b[4], int32_t c0) {
  Emulator e;
  e.ldtilecfg(cfg_mnk(1, 1, 1));
  e.loadd(0, &c0, 4);
  e.loadd(1, a, 4);
  e.loadd(2, b, 4);
  e.dpb(kind, 0, 1, 2);
  int32_t out;
  e.stored(0, &out, 4);
  return out;
}

TEST(CpuAmxTileEmulator, SignedUnsignedMixes) {
  const int8_t a[4] = {-1, 2, -128, 127}, b[4] = {-1, -3, 1, -128};
  // Bytes: a = ff 02 80 7f, b = ff fd 01 80.
  EXPECT_EQ(dot1(Dp::SS, a, b, 0), (-1) * (-1) + 2 * (-3) + (-128) * 1 + 127 * (-128));
  EXPECT_EQ(dot1(Dp::SU, a, b, 0), (-1) * 255 + 2 * 253 + (-128) * 1 + 127 * 128);
  EXPECT_EQ(dot1(Dp::US, a, b, 0), 255 * (-1) + 2 * (-3) + 128 * 1 + 127 * (-128));
  EXPECT_EQ(dot1(Dp::UU, a, b, 0), 255 * 255 + 2 * 253 + 128 * 1 + 127 * 128);
  EXPECT_EQ(dot1(Dp::SS, a, b, 1000), 1000 + (-1) * (-1) + 2 * (-3) + (-128) * 1 + 127 * (-128));
}

TEST(CpuAmxTileEmulator, Int32WrapsAround) {
  const int8_t a[4] = {-1, -1, -1, -1}, b[4] = {-1, -1, -1, -1};  // UU: 4 * 255 * 255 = 260100
  EXPECT_EQ(dot1(Dp::UU, a, b, INT32_MAX), int32_t(uint32_t(INT32_MAX) + 260100u));
  EXPECT_LT(dot1(Dp::UU, a, b, INT32_MAX), 0);
  const int8_t c[4] = {-128, -128, -128, -128}, d[4] = {127, 127, 127, 127};  // SS: -65024
  EXPECT_EQ(dot1(Dp::SS, c, d, INT32_MIN), int32_t(uint32_t(INT32_MIN) - 65024u));
  EXPECT_GT(dot1(Dp::SS, c, d, INT32_MIN), 0);
}

TEST(CpuAmxTileEmulator, MatrixProductLayout) {
  // C (2 x 3) = A (2 x 8 bytes) * B (2 rows x 3 dwords): element (m, n) = sum over k, i
  // of A[m][4k + i] * B[k][4n + i].
  Emulator e;
  e.ldtilecfg(cfg_mnk(2, 3, 2));
  int8_t A[2][8], B[2][12];
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < 8; ++i) A[m][i] = int8_t(m * 8 + i - 7);
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 12; ++i) B[k][i] = int8_t(3 * k - i);
  int32_t C[2][3] = {};
  e.loadd(0, C, 12);
  e.loadd(1, A, 8);
  e.loadd(2, B, 12);
  e.dpb(Dp::SS, 0, 1, 2);
  e.stored(0, C, 12);
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 3; ++n) {
      int32_t want = 0;
      for (int k = 0; k < 2; ++k)
        for (int i = 0; i < 4; ++i) want += A[m][4 * k + i] * B[k][4 * n + i];
      EXPECT_EQ(C[m][n], want) << m << "," << n;
    }
}

// ---- Emulator: TDPBF16PS ----------------------------------------------------------

// C (1 x 1) += A (1 x K pairs) * B (K rows x 1 pair).
float bf16_dot(const std::vector<float>& a, const std::vector<float>& b, float c0) {
  const int K = int(a.size() / 2);
  Emulator e;
  e.ldtilecfg(cfg_mnk(1, 1, K));
  std::vector<uint16_t> A(a.size()), B(b.size());
  for (size_t i = 0; i < a.size(); ++i) A[i] = bf16_of(a[i]), B[i] = bf16_of(b[i]);
  e.loadd(0, &c0, 4);
  e.loadd(1, A.data(), 4 * K);
  e.loadd(2, B.data(), 4);
  e.dpbf16ps(0, 1, 2);
  float out;
  e.stored(0, &out, 4);
  return out;
}

TEST(CpuAmxTileEmulator, Bf16RoundsToNearestEven) {
  const float u = std::ldexp(1.f, -24);  // half an ulp of 1
  EXPECT_EQ(bf16_dot({1.f, 0.f}, {u, 0.f}, 1.f), 1.f);                          // tie -> even (1)
  EXPECT_EQ(bf16_dot({3.f, 0.f}, {u, 0.f}, 1.f), 1.f + std::ldexp(1.f, -22));  // 1.5 ulp tie -> even (2 ulp)
  EXPECT_EQ(bf16_dot({1.f, 0.f}, {u, 0.f}, 1.f + std::ldexp(1.f, -23)), 1.f + std::ldexp(1.f, -22));  // odd -> up
}

TEST(CpuAmxTileEmulator, Bf16EvenAndOddAccumulateSeparately) {
  // The SDM keeps one accumulator for the even and one for the odd element of each
  // pair: even = 2^24 + 1 -> 2^24 (tie to even), odd = -2^24, sum 0. Adding the
  // products in order into one accumulator would give 1.
  const float big = std::ldexp(1.f, 24);
  EXPECT_EQ(bf16_dot({big, -big, 1.f, 0.f}, {1.f, 1.f, 1.f, 0.f}, 0.f), 0.f);
}

TEST(CpuAmxTileEmulator, Bf16DenormalsAreZero) {
  const float den = from_bits(0x00200000u);  // a binary32 denormal, exactly a bf16 (0x0020)
  ASSERT_EQ(std::fpclassify(den), FP_SUBNORMAL);
  EXPECT_EQ(bf16_dot({den, 0.f}, {1.f, 0.f}, 0.f), 0.f);         // input denormal read as zero
  EXPECT_EQ(bf16_dot({1.f, 0.f}, {1.f, 0.f}, den), 1.f);         // the accumulator's too
  const float t = std::ldexp(1.f, -70);
  EXPECT_EQ(bits(bf16_dot({t, 0.f}, {t, 0.f}, 0.f)), 0u);        // 2^-140: flushed to zero
  EXPECT_EQ(bf16_dot({t, 0.f}, {t, 0.f}, FLT_MIN), FLT_MIN);     // (the flushed product adds nothing)
  EXPECT_EQ(tile::fma_daz_ftz(-t, t, 0.f), 0.f);
  EXPECT_EQ(bits(tile::fma_daz_ftz(-t, t, -0.f)), 0x80000000u);  // flushed keeping the sign
  EXPECT_EQ(tile::add_daz_ftz(1.5f * FLT_MIN, -FLT_MIN), 0.f);              // a denormal result: flushed
  EXPECT_EQ(tile::add_daz_ftz(FLT_MIN, -std::ldexp(1.f, -127)), FLT_MIN);  // a denormal input: zero
}

// ---- Emulator against the instructions -------------------------------------------

class CpuAmxTileHardware : public testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = real_amx_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

// Random shapes and contents, the same operations on both; the destination's bytes
// must be identical. bf16 inputs cover ordinary values, tiny ones (denormal products
// and sums), denormal inputs, every exponent, infinities and NaNs.
TEST_F(CpuAmxTileHardware, EmulatorMatchesInstructionsBitForBit) {
  std::mt19937 rng(12345);
  int compared = 0;
  for (int it = 0; it < 6000; ++it) {
    const int M = 1 + int(rng() % 16), K4 = 1 + int(rng() % 16), N4 = 1 + int(rng() % 16);
    // Tiles at random distinct numbers.
    int t[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    std::shuffle(t, t + 8, rng);
    const int C = t[0], A = t[1], B = t[2];
    Config cfg;
    cfg.palette_id = 1;
    cfg.rows[C] = uint8_t(M), cfg.colsb[C] = uint16_t(4 * N4);
    cfg.rows[A] = uint8_t(M), cfg.colsb[A] = uint16_t(4 * K4);
    cfg.rows[B] = uint8_t(K4), cfg.colsb[B] = uint16_t(4 * N4);
    alignas(64) uint8_t a[1024], b[1024], c[1024], o1[1024], o2[1024];
    const bool bf = it % 2 == 1;
    const int mode = it / 2 % 5;
    for (int i = 0; i < 1024; ++i) a[i] = uint8_t(rng()), b[i] = uint8_t(rng());
    for (int i = 0; i < 256; ++i) {
      uint32_t v = rng();
      if (rng() % 4 == 0) v = rng() % 2 ? 0x7FFFFF00u + rng() % 256 : 0x80000000u + rng() % 256;  // near the wrap
      std::memcpy(c + 4 * i, &v, 4);
    }
    if (bf) {
      for (uint8_t* p : {a, b})
        for (int i = 0; i < 512; ++i) {
          const uint32_t e = mode == 4 ? rng() % 256 : mode == 2 ? 56 + rng() % 17 : rng() % 8 == 0 ? 0 : 120 + rng() % 16;
          const uint16_t h = uint16_t((rng() % 2) << 15 | e << 7 | (rng() % 128));
          std::memcpy(p + 2 * i, &h, 2);
        }
      for (int i = 0; i < 256; ++i) {
        float f = std::ldexp(float(int(rng() % 100000) - 50000), -10);
        if (rng() % 8 == 0) f = 1e-39f * float(rng() % 3);
        if (mode == 2) f = std::ldexp(f, -130);
        if (mode == 4 && rng() % 4 == 0) f = from_bits(uint32_t(rng()));
        std::memcpy(c + 4 * i, &f, 4);
      }
    }
    const int64_t sa = 64 - 4 * (rng() % 2), sc = 64;  // an odd A stride sometimes
    Emulator& e = tile::thread_emulator();
    e.ldtilecfg(cfg);
    e.loadd(C, c, sc), e.loadd(A, a, sa), e.loadd(B, b, 64);
    tile::real::ldtilecfg(cfg);
    tile::real::loadd(C, c, sc), tile::real::loadd(A, a, sa), tile::real::loadd(B, b, 64);
    const Dp kind = Dp(rng() % 4);
    if (bf) {
      e.dpbf16ps(C, A, B);
      tile::real::dpbf16ps(C, A, B);
    } else {
      e.dpb(kind, C, A, B);
      tile::real::dpb(kind, C, A, B);
    }
    std::memset(o1, 0x5A, sizeof o1), std::memset(o2, 0x5A, sizeof o2);
    e.stored(C, o1, 64);
    tile::real::stored(C, o2, 64);
    ASSERT_EQ(std::memcmp(o1, o2, sizeof o1), 0)
        << "case " << it << (bf ? " TDPBF16PS" : std::string(" ") + tile::dp_name(kind)) << " M " << M << " K4 " << K4
        << " N4 " << N4 << " mode " << mode;
    ++compared;
  }
  tile::real::release();
  tile::thread_emulator().release();
  EXPECT_EQ(compared, 6000);
}

// ---- Tile products against cpu_scalar's dot products -----------------------------

struct ProductCase {
  DType type;
  int64_t K, N, M;
};

// Weights and activations from a seed; out[m][n] by the tile kernel (emulated or
// real) and by quant::vec_dot on the reference's Q8_0 activation rows.
void check_product(const ProductCase& pc, bool real) {
  std::mt19937 rng(uint32_t(pc.K * 131 + pc.N * 7 + pc.M));
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t K = pc.K, N = pc.N, M = pc.M, nb = K / 32;
  std::vector<float> wf(size_t(N * K)), x(size_t(M * K));
  for (float& v : wf) v = nd(rng);
  for (float& v : x) v = nd(rng) * (rng() % 7 == 0 ? 100.f : 1.f);
  const size_t rb = row_bytes(pc.type, K);
  std::vector<uint8_t> w(rb * size_t(N));
  for (int64_t n = 0; n < N; ++n) quant::quantize_row(pc.type, wf.data() + n * K, w.data() + size_t(n) * rb, K);
  std::vector<uint8_t> rep(kern::repacked_bytes(pc.type, K, N));
  kern::repack(pc.type, w.data(), int64_t(rb), K, N, rep.data());
  ASSERT_TRUE(kern::layout_matches(pc.type, w.data(), int64_t(rb), K, N, rep.data()));
  const int64_t mp = (M + 15) / 16 * 16;
  std::vector<int8_t> q(kern::act_q_bytes(M, K), 0);
  std::vector<float> d(size_t(mp * nb), 0.f);
  for (int64_t m = 0; m < M; ++m) kern::quantize_row_q8_0(x.data() + m * K, K, q.data(), m, d.data() + m * nb);
  std::vector<float> out(size_t(M * N), NAN);
  kern::Job job;
  job.wt = pc.type, job.K = K, job.N = N, job.w = rep.data(), job.q = q.data(), job.d = d.data();
  job.ldd = nb, job.M = M, job.out = out.data(), job.out_stride = N;
  const int64_t tiles = (N + 15) / 16;
  // Split as the backend does (pairs of tiles), in two calls.
  const int64_t half = (tiles + 1) / 2 / 2 * 2;
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, half}, {half, tiles}}) {
    if (t0 >= t1) continue;
    if (real)
      kern::matmul_tiles_real(job, t0, t1);
    else
      kern::matmul_tiles_emulated(job, t0, t1);
  }
  std::vector<quant::BlockQ8_0> act(static_cast<size_t>(nb));
  for (int64_t m = 0; m < M; ++m) {
    quant::quantize_row(DType::Q8_0, x.data() + m * K, act.data(), K);
    for (int64_t n = 0; n < N; ++n) {
      const float want = quant::vec_dot(pc.type, K, w.data() + size_t(n) * rb, act.data());
      const float got = out[size_t(m * N + n)];
      ASSERT_EQ(bits(got), bits(want)) << dtype_name(pc.type) << " K" << K << " N" << N << " M" << M << ": row " << m
                                       << " col " << n << ": " << got << " vs " << want;
    }
  }
}

// The vectorized quantizer (cpu_avx512's) gives the scalar reference's bits.
TEST(CpuAmxTileProducts, Avx512QuantizerEqualsScalar) {
  std::string why;
  if (!cpu_avx512_usable_here(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t K : {32, 96, 2048}) {
    const int64_t M = 19, nb = K / 32;
    std::vector<float> x(size_t(M * K));
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 1e4f : i % 89 == 0 ? 0.f : 1.f);
    for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = 0.f;  // an all-zero block
    std::vector<int8_t> q1(kern::act_q_bytes(M, K), 0), q2(kern::act_q_bytes(M, K), 0);
    std::vector<float> d1(size_t(M * nb)), d2(size_t(M * nb));
    for (int64_t m = 0; m < M; ++m) {
      kern::quantize_row_q8_0(x.data() + m * K, K, q1.data(), m, d1.data() + m * nb);
      kern::quantize_row_q8_0_avx512(x.data() + m * K, K, q2.data(), m, d2.data() + m * nb);
    }
    EXPECT_EQ(q1, q2) << "K " << K;
    EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0) << "K " << K;
  }
}

const ProductCase kProducts[] = {
    {DType::Q8_0, 32, 1, 1},    {DType::Q8_0, 64, 16, 16},  {DType::Q8_0, 256, 17, 17}, {DType::Q8_0, 96, 48, 33},
    {DType::Q8_0, 512, 40, 40}, {DType::Q4_0, 32, 1, 1},    {DType::Q4_0, 64, 16, 16},  {DType::Q4_0, 256, 33, 17},
    {DType::Q4_0, 96, 48, 5},   {DType::Q4_0, 512, 70, 64},
};

TEST(CpuAmxTileProducts, EmulatedEqualsScalarBitForBit) {
  for (const ProductCase& pc : kProducts) check_product(pc, false);
}

TEST(CpuAmxTileProducts, RealEqualsScalarBitForBit) {
  if (const std::string why = real_amx_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const ProductCase& pc : kProducts) check_product(pc, true);
}

// ---- The backend through the conformance API ---------------------------------------

// Every MatMul / MatMulId case of the suite plus larger ones, with min_columns = 1 so
// that every product of a Q8_0 / Q4_0 weight runs on the tiles, on 1 and 2 executors.
// repack = false: the wrapped cpu_avx512 keeps no copy, so the tiles read their own.
void run_backend_conformance(bool emulate, bool repack = true) {
  std::vector<ConformanceCase> cases = conformance_cases(ConformanceFilter{"MatMul,MatMulId", "Q8_0,Q4_0"});
  ASSERT_FALSE(cases.empty());
  for (DType t : {DType::Q8_0, DType::Q4_0})
    for (auto [K, N, M] : {std::tuple<int64_t, int64_t, int64_t>{256, 48, 40}, {512, 33, 64}, {64, 130, 100}}) {
      ConformanceCase c;
      c.op = "MatMul", c.kind = Op::MatMul, c.type = t, c.dtype = dtype_name(t);
      c.k = K, c.n = N, c.m = M;
      c.shape = "K" + std::to_string(K) + "_N" + std::to_string(N) + "_M" + std::to_string(M) + "_amx";
      c.seed = uint64_t(K * 1000003 + N * 101 + M);
      cases.push_back(c);
    }
  for (int threads : {1, 2}) {
    FastPool pool(threads);
    Options o;
    o.emulate = emulate;
    o.min_columns = 1;
    o.avx512.repack = repack;
    auto be = make_backend(&pool, o);
    auto ref = cpu_scalar::make_backend(nullptr);
    for (const ConformanceCase& c : cases) {
      const ConformanceResult r = run_conformance_case(c, *be, *ref);
      EXPECT_EQ(r.status, ConformanceStatus::Pass)
          << c.name() << " (" << threads << " threads" << (repack ? "" : ", own copy") << "): " << conformance_status_name(r.status) << " nmse " << r.nmse
          << " " << r.message;
    }
  }
}

TEST(CpuAmxBackend, EmulatedProductsPassConformance) { run_backend_conformance(true); }

TEST(CpuAmxBackend, EmulatedProductsOnOwnCopyPassConformance) { run_backend_conformance(true, false); }

TEST(CpuAmxBackend, RealProductsPassConformance) {
  if (const std::string why = real_amx_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  run_backend_conformance(false);
}

// Without AVX-512 cpu_amx wraps nothing (wrap_avx512 = false does the same here): it
// takes the tile products, making its tile copy on first use for a weight
// prepare_weight() never saw, and declines every other node, which the scheduler
// runs on the next backend. Results equal cpu_scalar's bit for bit.
TEST(CpuAmxBackend, UnwrappedTakesTileProductsAndDeclinesTheRest) {
  Options o;
  o.emulate = true;
  o.wrap_avx512 = false;
  std::shared_ptr<Backend> amx = make_backend(nullptr, o);
  std::shared_ptr<Backend> ref = cpu_scalar::make_backend(nullptr);
  const int64_t K = 64, N = 40;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wf(size_t(N * K));
  for (float& v : wf) v = nd(rng);
  const size_t rb = row_bytes(DType::Q8_0, K);
  std::vector<uint8_t> w(rb * size_t(N));
  for (int64_t n = 0; n < N; ++n) quant::quantize_row(DType::Q8_0, wf.data() + n * K, w.data() + size_t(n) * rb, K);
  auto run = [&](Scheduler& s, int64_t M) {
    std::vector<float> x(size_t(M * K)), y(size_t(M * N)), z(size_t(M * N));
    for (float& v : x) v = nd(rng);
    auto go = [&](Scheduler& sc, std::vector<float>& out) {
      Graph g;
      const int tw = g.add_tensor(Tensor::contiguous(DType::Q8_0, {K, N}, w.data()));
      const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
      const int ty = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, out.data()));
      Node mm;
      mm.op = Op::MatMul, mm.dst = ty, mm.src = {tw, tx, -1, -1, -1};
      g.add_node(mm);
      Node sl;
      sl.op = Op::Silu, sl.dst = ty, sl.src = {ty, -1, -1, -1, -1};
      g.add_node(sl);
      const std::vector<int> placed = sc.place(g);
      sc.run(g);
      return placed;
    };
    Scheduler plain({ref});
    go(plain, z);
    const std::vector<int> placed = go(s, y);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(bits(y[i]), bits(z[i])) << "M " << M << " element " << i;
    return placed;
  };
  Scheduler s({amx, ref});
  EXPECT_EQ(run(s, 20), (std::vector<int>{0, 1}));  // 20 rows: a tile product; Silu declined
  EXPECT_EQ(run(s, 3), (std::vector<int>{1, 1}));   // below min_columns: declined too
  Graph g;
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {8}, nullptr));
  Node sl;
  sl.op = Op::Silu, sl.dst = tx, sl.src = {tx, -1, -1, -1, -1};
  g.add_node(sl);
  const OpSupport sup = amx->supports(g, sl);
  EXPECT_FALSE(sup.supported);
  EXPECT_NE(sup.reason.find("without AVX-512"), std::string::npos) << sup.reason;
}

TEST(CpuAmxBackend, UnusableWithoutAmxOrEmulation) {
  std::string why;
  if (hardware_usable(&why)) GTEST_SKIP() << "this CPU has AMX: the backend is usable without emulation";
  EXPECT_FALSE(why.empty());
  Options o;
  o.emulate = false;
  try {
    make_backend(nullptr, o);
    FAIL() << "make_backend succeeded without AMX";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// The built plugin: emulation asked for by the environment or by plugins.toml makes it
// usable below cpu_avx512 with an "emulated" note; the backend it creates runs.
TEST(CpuAmxPlugin, EmulationFromEnvironmentOrPluginsToml) {
  PluginConfig cfg;
  cfg.paths = {TESSERA_PLUGIN_DIR};
  const char* old_env = std::getenv("TESSERA_AMX_EMULATE");
  const std::string keep_env = old_env ? old_env : "";
  const char* old_toml = std::getenv("TESSERA_PLUGINS_TOML");
  const std::string keep_toml = old_toml ? old_toml : "";
  auto check_emulated = [&](const char* how) {
    PluginRegistry reg(cfg);
    const PluginRecord* r = reg.find("cpu_amx");
    ASSERT_NE(r, nullptr) << how;
    EXPECT_TRUE(r->usable) << how << ": " << r->reason;
    EXPECT_EQ(r->score, 20) << how;
    EXPECT_EQ(r->reason.rfind("emulated", 0), 0u) << how << ": " << r->reason;
    FastPool pool(2);
    auto be = reg.create_backend("cpu_amx", &pool, {{"emulate", "true"}, {"min_columns", "1"}});
    EXPECT_EQ(be->name(), "cpu_amx");
    EXPECT_THROW(reg.create_backend("cpu_amx", &pool, {{"min_columns", "0"}}), Error) << how;
  };
  setenv("TESSERA_AMX_EMULATE", "1", 1);
  check_emulated("TESSERA_AMX_EMULATE=1");
  unsetenv("TESSERA_AMX_EMULATE");
  const std::string toml = (std::filesystem::temp_directory_path() / "tessera_cpu_amx_test_plugins.toml").string();
  std::ofstream(toml) << "[backend.cpu_amx]\noptions = { emulate = true }\n";
  setenv("TESSERA_PLUGINS_TOML", toml.c_str(), 1);
  check_emulated("plugins.toml emulate = true");
  std::filesystem::remove(toml);
  unsetenv("TESSERA_PLUGINS_TOML");
  {  // Neither: usable only with the hardware, and then ranked above cpu_avx512.
    PluginRegistry reg(cfg);
    const PluginRecord* r = reg.find("cpu_amx");
    ASSERT_NE(r, nullptr);
    std::string why;
    if (hardware_usable(&why)) {
      EXPECT_TRUE(r->usable);
      EXPECT_EQ(r->score, 60);
    } else {
      EXPECT_FALSE(r->usable);
      EXPECT_NE(r->reason.find("needs AMX"), std::string::npos) << r->reason;
      EXPECT_NE(r->reason.find(why), std::string::npos) << r->reason;
    }
  }
  if (old_env) setenv("TESSERA_AMX_EMULATE", keep_env.c_str(), 1);
  if (old_toml) setenv("TESSERA_PLUGINS_TOML", keep_toml.c_str(), 1);
}

}  // namespace
}  // namespace tessera::cpu_amx
