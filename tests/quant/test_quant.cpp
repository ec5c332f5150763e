// Unit tests of the dtype table and the scalar reference quantization arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/quant.h"

using namespace tessera;
using namespace tessera::quant;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.f, float mean = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, int64_t(x.size())));
  quantize_row(t, x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n);
  dequantize_row(t, q.data(), y.data(), int64_t(n));
  return y;
}

// sqrt(sum (a-b)^2 / sum a^2)
double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(a[i]) * double(a[i]);
  }
  return std::sqrt(num / den);
}

uint16_t h(float f) { return fp32_to_fp16(f); }

}  // namespace

// ------------------------------------------------------------------ dtype table

TEST(DType, TraitsAndRowBytes) {
  EXPECT_EQ(row_bytes(DType::F32, 256), 1024u);
  EXPECT_EQ(row_bytes(DType::F16, 256), 512u);
  EXPECT_EQ(row_bytes(DType::BF16, 256), 512u);
  EXPECT_EQ(row_bytes(DType::I32, 3), 12u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 256), 8u * 34);
  EXPECT_EQ(row_bytes(DType::Q4_0, 256), 8u * 18);
  EXPECT_EQ(row_bytes(DType::Q4_K, 256), 144u);
  EXPECT_EQ(row_bytes(DType::Q5_K, 256), 176u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 256), 210u);
  EXPECT_EQ(row_bytes(DType::Q8_K, 512), 584u);
  EXPECT_EQ(row_bytes(DType::Q4_K, 0), 0u);
  EXPECT_THROW(row_bytes(DType::Q4_K, 100), Error);
  EXPECT_THROW(row_bytes(DType::Q8_0, 33), Error);

  EXPECT_EQ(dtype_traits(DType::Q4_K).block_elems, 256);
  EXPECT_EQ(dtype_traits(DType::Q4_0).block_bytes, sizeof(BlockQ4_0));
  EXPECT_EQ(dtype_traits(DType::Q8_K).block_bytes, sizeof(BlockQ8_K));
  EXPECT_TRUE(dtype_traits(DType::Q6_K).quantized);
  EXPECT_FALSE(dtype_traits(DType::BF16).quantized);
  ASSERT_NE(dtype_traits(14u), nullptr);
  EXPECT_EQ(dtype_traits(14u)->type, DType::Q6_K);
  EXPECT_EQ(dtype_traits(3u), nullptr);   // q4_1: not supported
  EXPECT_EQ(dtype_traits(999u), nullptr);
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_name(DType::F32), "f32");
  EXPECT_EQ(dtype_name(DType::Q4_K), "q4_K");
  EXPECT_EQ(dtype_from_name("q4_0"), DType::Q4_0);
  EXPECT_EQ(dtype_from_name("F16"), DType::F16);
  EXPECT_EQ(dtype_from_name("Q6_K"), DType::Q6_K);
  EXPECT_EQ(dtype_from_name("q6_k"), DType::Q6_K);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_FALSE(dtype_from_name("q4_1").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());

  EXPECT_EQ(ggml_type_name(0), "f32");
  EXPECT_EQ(ggml_type_name(3), "q4_1");
  EXPECT_EQ(ggml_type_name(10), "q2_K");
  EXPECT_EQ(ggml_type_name(16), "iq2_xxs");
  EXPECT_EQ(ggml_type_name(23), "iq4_xs");
  EXPECT_EQ(ggml_type_name(29), "iq1_m");
  EXPECT_EQ(ggml_type_name(30), "bf16");
  EXPECT_EQ(ggml_type_name(35), "tq2_0");
  EXPECT_EQ(ggml_type_name(39), "mxfp4");
  EXPECT_EQ(std::string(ggml_type_name(1000)), "type 1000");
  for (uint32_t id = 0; id < 40; ++id) EXPECT_FALSE(ggml_type_name(id).empty()) << id;
}

// ------------------------------------------------------------------ fp16 / bf16

TEST(Fp16, KnownValues) {
  EXPECT_EQ(h(0.f), 0x0000);
  EXPECT_EQ(h(-0.f), 0x8000);
  EXPECT_EQ(h(1.f), 0x3C00);
  EXPECT_EQ(h(-2.f), 0xC000);
  EXPECT_EQ(h(0.5f), 0x3800);
  EXPECT_EQ(h(65504.f), 0x7BFF);
  EXPECT_EQ(h(65519.f), 0x7BFF);                 // below the halfway point
  EXPECT_EQ(h(65520.f), 0x7C00);                 // tie -> even -> inf
  EXPECT_EQ(h(1e10f), 0x7C00);
  EXPECT_EQ(h(-INFINITY), 0xFC00);
  EXPECT_EQ(h(std::ldexp(1.f, -14)), 0x0400);    // min normal
  EXPECT_EQ(h(std::ldexp(1.f, -24)), 0x0001);    // min subnormal
  EXPECT_EQ(h(std::ldexp(1.f, -25)), 0x0000);    // tie -> even (0)
  EXPECT_EQ(h(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(h(std::ldexp(3.f, -25)), 0x0002);    // 1.5 units: tie -> even (2)
  EXPECT_EQ(h(std::ldexp(5.f, -25)), 0x0002);    // 2.5 units: tie -> even (2)
  EXPECT_EQ(h(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(h(1.f + std::ldexp(1.f, -11)), 0x3C00);      // tie -> even
  EXPECT_EQ(h(1.f + 3 * std::ldexp(1.f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(h(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20)), 0x3C01);
  const uint16_t n = h(NAN);
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x03FF, 0);

  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.f, -24));
  EXPECT_EQ(fp16_to_fp32(0x8000), 0.f);
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7C00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0xFC01)));
}

TEST(Fp16, AllHalvesRoundTrip) {
  for (uint32_t v = 0; v < 0x10000; ++v) {
    const float f = fp16_to_fp32(uint16_t(v));
    if (std::isnan(f)) {
      EXPECT_TRUE((v & 0x7C00) == 0x7C00 && (v & 0x3FF) != 0);
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), v) << std::hex << v;
  }
}

TEST(Fp16, RoundingMatchesHardwareConversion) {
#ifdef __FLT16_MAX__
  // The compiler's float -> _Float16 conversion rounds to nearest even: an
  // independent oracle. Sweep random bit patterns and the midpoints of halves.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(rng());
    if (std::isnan(f)) continue;
    const _Float16 r = static_cast<_Float16>(f);
    uint16_t expect;
    std::memcpy(&expect, &r, 2);
    ASSERT_EQ(fp32_to_fp16(f), expect) << std::hexfloat << f;
  }
  for (uint32_t v = 0; v < 0x7C00; ++v) {
    const float mid = (fp16_to_fp32(uint16_t(v)) + fp16_to_fp32(uint16_t(v + 1))) * 0.5f;
    const _Float16 r = static_cast<_Float16>(mid);
    uint16_t expect;
    std::memcpy(&expect, &r, 2);
    ASSERT_EQ(fp32_to_fp16(mid), expect) << std::hex << v;
  }
#else
  GTEST_SKIP() << "no _Float16 in this compiler";
#endif
}

TEST(Bf16, KnownValues) {
  EXPECT_EQ(fp32_to_bf16(1.f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-2.f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // max float rounds to inf
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00000001)), 0x0000);  // tiny subnormal
  // A NaN whose payload lives only in the low 16 bits must stay NaN.
  const uint16_t n = fp32_to_bf16(from_bits(0x7F800001));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(n)));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(-NAN))));
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.f);
  for (uint32_t v = 0; v < 0x10000; ++v) {
    const float f = bf16_to_fp32(uint16_t(v));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), v);
  }
}

// ------------------------------------------------------------------ hand-built blocks

TEST(Blocks, Q4_0Layout) {
  BlockQ4_0 b{};
  b.d = h(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;         // low nibble: first half
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f) << j;    // high nibble: second half
  }
}

TEST(Blocks, Q8_0Layout) {
  uint8_t raw[34];
  const uint16_t d = h(0.25f);
  std::memcpy(raw, &d, 2);
  for (int j = 0; j < 32; ++j) raw[2 + j] = uint8_t(int8_t(j - 16));
  float y[32];
  dequantize_row(DType::Q8_0, raw, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.25f);
}

// Scales/mins of the 8 sub-blocks of a Q4_K/Q5_K test block; they use all 6 bits.
constexpr int kSc[8] = {1, 7, 33, 63, 5, 40, 17, 62};
constexpr int kMn[8] = {0, 12, 63, 2, 50, 9, 31, 44};

void pack_k_scales(uint8_t s[12]) {
  // Written from the format description, independently of the library code.
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t((kSc[j] & 63) | ((kSc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t((kMn[j] & 63) | ((kMn[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((kSc[j + 4] & 15) | ((kMn[j + 4] & 15) << 4));
  }
}

TEST(Blocks, Q4_KLayout) {
  BlockQ4_K b{};
  b.d = h(0.125f);
  b.dmin = h(0.0625f);
  pack_k_scales(b.scales);
  auto level = [](int e) { return (e * 5 + e / 7) % 16; };
  // Element e: chunk e/64 of 32 bytes; first 32 elements low nibbles, next 32 high.
  for (int e = 0; e < 256; ++e) {
    uint8_t& byte = b.qs[32 * (e / 64) + e % 32];
    byte |= uint8_t((e % 64) < 32 ? level(e) : level(e) << 4);
  }
  float y[256];
  dequantize_row(DType::Q4_K, &b, y, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const float expect = 0.125f * kSc[s] * level(e) - 0.0625f * kMn[s];
    EXPECT_FLOAT_EQ(y[e], expect) << e;
  }
}

TEST(Blocks, Q5_KLayout) {
  BlockQ5_K b{};
  b.d = h(0.125f);
  b.dmin = h(0.0625f);
  pack_k_scales(b.scales);
  auto level = [](int e) { return (e * 11 + e / 5) % 32; };
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, l = e % 32;
    const bool hi = (e % 64) >= 32;
    b.qs[32 * c + l] |= uint8_t(hi ? (level(e) & 15) << 4 : (level(e) & 15));
    if (level(e) & 16) b.qh[l] |= uint8_t(1u << (2 * c + (hi ? 1 : 0)));
  }
  float y[256];
  dequantize_row(DType::Q5_K, &b, y, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    EXPECT_FLOAT_EQ(y[e], 0.125f * kSc[s] * level(e) - 0.0625f * kMn[s]) << e;
  }
}

TEST(Blocks, Q6_KLayout) {
  BlockQ6_K b{};
  b.d = h(0.5f);
  for (int s = 0; s < 16; ++s) b.scales[s] = int8_t(s * 9 - 70);
  auto level = [](int e) { return (e * 7 + e / 9) % 64; };  // stored 0..63, value -32
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    // quarters 0,1 -> low nibbles of ql[l], ql[l+32]; quarters 2,3 -> high nibbles.
    uint8_t& q = b.ql[64 * c + l + (quarter & 1) * 32];
    q |= uint8_t(quarter < 2 ? (level(e) & 15) : (level(e) & 15) << 4);
    b.qh[32 * c + l] |= uint8_t((level(e) >> 4) << (2 * quarter));
  }
  float y[256];
  dequantize_row(DType::Q6_K, &b, y, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_FLOAT_EQ(y[e], 0.5f * b.scales[e / 16] * (level(e) - 32)) << e;
  }
}

// ------------------------------------------------------------------ reference quantizers

TEST(Quantize, Q8_0MatchesReference) {
  std::vector<float> x(32, 0.f);
  x[0] = 127.f;   // amax 127 -> d = 1, id = 1
  x[1] = 2.5f;    // roundf: away from zero
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -126.5f;
  const auto q = quantize(DType::Q8_0, x);
  BlockQ8_0 b;
  std::memcpy(&b, q.data(), sizeof b);
  EXPECT_EQ(b.d, h(1.f));
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[4], -127);
  // All-zero block: d = 0, no NaN.
  const auto z = dequantize(DType::Q8_0, quantize(DType::Q8_0, std::vector<float>(32, 0.f)), 32);
  for (float v : z) EXPECT_EQ(v, 0.f);
}

TEST(Quantize, Q4_0MatchesReference) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j - 12);  // max |x| = 19 (positive)
  const auto q = quantize(DType::Q4_0, x);
  BlockQ4_0 b;
  std::memcpy(&b, q.data(), sizeof b);
  const float d = 19.f / -8.f;
  EXPECT_EQ(b.d, h(d));
  for (int j = 0; j < 32; ++j) {
    const int expect = std::min(15, int(x[j] * (1.f / d) + 8.5f));
    const int got = j < 16 ? (b.qs[j] & 15) : (b.qs[j - 16] >> 4);
    EXPECT_EQ(got, expect) << j;
  }
  EXPECT_EQ(b.qs[15] >> 4, 0);  // x = 19 -> -8 -> code 0
}

TEST(Quantize, Q8_KMatchesReference) {
  auto x = gaussian(512, 3);
  x[17] = 5.f;  // positive max of block 0 -> -127, d < 0
  x[300] = -6.f;  // negative max of block 1 -> also -127, and d > 0
  const auto q = quantize(DType::Q8_K, x);
  const auto* b = reinterpret_cast<const BlockQ8_K*>(q.data());
  EXPECT_EQ(b[0].qs[17], -127);
  EXPECT_FLOAT_EQ(b[0].d, 1.f / (-127.f / 5.f));
  EXPECT_EQ(b[1].qs[300 - 256], -127);
  EXPECT_FLOAT_EQ(b[1].d, 1.f / (127.f / 6.f));
  EXPECT_GT(b[1].d, 0.f);
  EXPECT_LT(b[0].d, 0.f);
  for (int i = 0; i < 2; ++i) {
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b[i].qs[16 * g + l];
      EXPECT_EQ(b[i].bsums[g], s);
    }
    for (int j = 0; j < 256; ++j) {
      // nearest_int: round half to even
      const float v = (-127.f / (i == 0 ? 5.f : -6.f)) * x[256 * i + j];
      EXPECT_EQ(b[i].qs[j], int(std::nearbyint(v))) << j;
    }
  }
}

// ------------------------------------------------------------------ round trips

struct RoundTrip {
  DType type;
  double max_gauss;    // bound on the relative RMS error for gaussian weights
  double max_outlier;  // ... for small offset weights with rare 8x outliers
};

void PrintTo(const RoundTrip& r, std::ostream* os) { *os << dtype_name(r.type); }

class QuantRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(QuantRoundTrip, ErrorBound) {
  const auto p = GetParam();
  const size_t n = 4096;
  const auto gauss = gaussian(n, 11);
  auto outlier = gaussian(n, 12, 0.02f, 0.01f);
  for (size_t i = 0; i < n; i += 97) outlier[i] *= 8.f;
  const std::vector<std::pair<const std::vector<float>*, double>> cases = {
      {&gauss, p.max_gauss}, {&outlier, p.max_outlier}};
  for (const auto& [x, bound] : cases) {
    const auto y = dequantize(p.type, quantize(p.type, *x), n);
    const double e = rel_rms(*x, y);
    EXPECT_LT(e, bound) << dtype_name(p.type);
    // A quantizer must not be exact on random data (catches a no-op round trip).
    if (p.type != DType::F32) {
      EXPECT_GT(e, 0.0);
    }
    if (std::getenv("TESSERA_PRINT_ERRORS"))
      std::printf("%s %.3g\n", std::string(dtype_name(p.type)).c_str(), e);
  }
  // All zeros stay zeros (no NaN from 0/0 scales).
  const auto z = dequantize(p.type, quantize(p.type, std::vector<float>(n, 0.f)), n);
  for (float v : z) ASSERT_EQ(v, 0.f) << dtype_name(p.type);
}

// Measured (gaussian / outliers): F16 2.1e-4 / 2.2e-4, BF16 1.7e-3 / 1.7e-3,
// Q8_0 5.2e-3 / 8.6e-3, Q8_K 6.7e-3 / 1.9e-2, Q6_K 1.8e-2 / 2.6e-2,
// Q5_K 3.6e-2 / 4.2e-2, Q4_K 7.2e-2 / 8.3e-2, Q4_0 8.5e-2 / 1.4e-1; in line with
// ggml's reference quantizers. Bounds leave ~25% headroom; a broken layout is >50%.
INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantRoundTrip,
    ::testing::Values(RoundTrip{DType::F32, 1e-9, 1e-9}, RoundTrip{DType::F16, 3e-4, 3e-4},
                      RoundTrip{DType::BF16, 2.5e-3, 2.5e-3}, RoundTrip{DType::Q8_0, 7e-3, 1.1e-2},
                      RoundTrip{DType::Q8_K, 9e-3, 2.5e-2}, RoundTrip{DType::Q6_K, 2.3e-2, 3.3e-2},
                      RoundTrip{DType::Q5_K, 4.5e-2, 5.3e-2}, RoundTrip{DType::Q4_K, 9e-2, 1.05e-1},
                      RoundTrip{DType::Q4_0, 1.07e-1, 1.75e-1}),
    [](const auto& info) { return std::string(dtype_name(info.param.type)); });

// ------------------------------------------------------------------ dot products

TEST(VecDot, Types) {
  EXPECT_EQ(vec_dot_type(DType::F32), DType::F32);
  EXPECT_EQ(vec_dot_type(DType::F16), DType::F16);
  EXPECT_EQ(vec_dot_type(DType::BF16), DType::BF16);
  EXPECT_EQ(vec_dot_type(DType::Q4_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::Q8_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::Q4_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_type(DType::Q5_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_type(DType::Q6_K), DType::Q8_K);
  EXPECT_THROW(vec_dot_type(DType::I32), Error);
  EXPECT_THROW(vec_dot_type(DType::Q8_K), Error);
}

class VecDot : public ::testing::TestWithParam<DType> {};

// The dot on integers must equal the float dot of the dequantized rows (up to
// float rounding of the per-block scaling).
TEST_P(VecDot, MatchesDequantizedDot) {
  const DType wt = GetParam();
  const DType at = vec_dot_type(wt);
  const size_t n = 2048;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const auto w = gaussian(n, 100 + seed, 0.05f, seed == 3 ? 0.02f : 0.f);
    const auto a = gaussian(n, 200 + seed, 2.f, seed == 2 ? -1.f : 0.f);
    const auto qw = quantize(wt, w);
    const auto qa = quantize(at, a);
    const auto dw = dequantize(wt, qw, n);
    const auto da = dequantize(at, qa, n);
    double ref = 0, mag = 0;
    for (size_t i = 0; i < n; ++i) {
      ref += double(dw[i]) * double(da[i]);
      mag += std::fabs(double(dw[i]) * double(da[i]));
    }
    const float got = vec_dot(wt, int64_t(n), qw.data(), qa.data());
    EXPECT_NEAR(got, ref, 1e-5 * mag + 1e-30) << dtype_name(wt) << " seed " << seed;
    // And it approximates the exact float dot within the quantization error.
    double exact = 0;
    for (size_t i = 0; i < n; ++i) exact += double(w[i]) * double(a[i]);
    EXPECT_NEAR(got, exact, 0.1 * mag) << dtype_name(wt);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, VecDot,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                           DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(VecDot, F16RoundsActivations) {
  // 1 + 2^-12 is not an f16: the activation row is rounded before the product.
  const uint16_t w[1] = {h(1.f)};
  const uint16_t a[1] = {h(1.f + std::ldexp(1.f, -12))};
  EXPECT_EQ(vec_dot(DType::F16, 1, w, a), 1.f);
}

TEST(Errors, UnsupportedTypes) {
  float x[32] = {};
  int32_t y[32];
  EXPECT_THROW(dequantize_row(DType::I32, y, x, 32), Error);
  EXPECT_THROW(quantize_row(DType::I32, x, y, 32), Error);
  EXPECT_THROW(quantize_row(DType::Q4_K, x, y, 32), Error);  // not a multiple of 256
  EXPECT_THROW(dtype_traits(static_cast<DType>(3)), Error);
  try {
    (void)dtype_traits(static_cast<DType>(3));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_1"), std::string::npos);
  }
}

// ------------------------------------------------------------------ real ggml data

namespace {

// Just enough GGUF to find tensors: (type, dims, bytes) by name.
struct MiniGguf {
  struct Tensor {
    uint32_t type;
    std::vector<uint64_t> dims;
    const uint8_t* data = nullptr;
  };
  std::vector<uint8_t> buf;
  std::map<std::string, Tensor> tensors;

  explicit MiniGguf(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    buf.assign(std::istreambuf_iterator<char>(f), {});
    size_t pos = 0;
    auto rd = [&](void* d, size_t n) {
      if (pos + n > buf.size()) throw std::runtime_error("truncated gguf");
      std::memcpy(d, buf.data() + pos, n);
      pos += n;
    };
    auto u32 = [&] { uint32_t v; rd(&v, 4); return v; };
    auto u64 = [&] { uint64_t v; rd(&v, 8); return v; };
    auto str = [&] { std::string s(u64(), '\0'); rd(s.data(), s.size()); return s; };
    if (u32() != 0x46554747) throw std::runtime_error("not gguf");
    u32();
    const uint64_t n_tensors = u64(), n_kv = u64();
    uint32_t align = 32;
    std::function<void(uint32_t)> skip = [&](uint32_t ty) {
      static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
      if (ty == 8) {
        str();
      } else if (ty == 9) {
        const uint32_t et = u32();
        const uint64_t n = u64();
        for (uint64_t i = 0; i < n; ++i) skip(et);
      } else {
        pos += size[ty];
      }
    };
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t ty = u32();
      if (key == "general.alignment" && ty == 4) align = u32();
      else skip(ty);
    }
    std::vector<std::pair<std::string, uint64_t>> offsets;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const std::string name = str();
      Tensor t;
      t.dims.resize(u32());
      for (auto& d : t.dims) d = u64();
      t.type = u32();
      offsets.emplace_back(name, u64());
      tensors[name] = t;
    }
    const size_t data = (pos + align - 1) / align * align;
    for (auto& [name, off] : offsets) tensors[name].data = buf.data() + data + off;
  }
};

std::string fixture(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/models/" + name;
}

}  // namespace

// The fixture models were quantized by ggml's reference quantizers from the same
// f32 weights as llama-f32.gguf: our quantizers must reproduce them byte for byte,
// and our dequantization must land within the quantization error of the f32 data.
TEST(Fixtures, QuantizersReproduceGgmlFiles) {
  const std::string f32_path = fixture("llama-f32.gguf");
  if (!std::filesystem::exists(f32_path)) GTEST_SKIP() << "no fixtures at " << f32_path;
  const MiniGguf ref(f32_path);
  std::map<DType, int> tensors_checked;
  for (const char* file : {"llama-q4_k_m.gguf", "llama-q6_k.gguf", "llama-q4_0.gguf",
                           "llama-q8_0.gguf", "llama-f16.gguf", "llama-bf16.gguf"}) {
    const MiniGguf q(fixture(file));
    for (const auto& [name, t] : q.tensors) {
      const auto it = ref.tensors.find(name);
      ASSERT_NE(it, ref.tensors.end()) << name;
      const auto* traits = dtype_traits(t.type);
      ASSERT_NE(traits, nullptr) << file << " " << name << " " << ggml_type_name(t.type);
      if (traits->type == DType::F32) continue;
      const DType dt = traits->type;
      const int64_t row = int64_t(t.dims[0]);
      int64_t nrows = 1;
      for (size_t d = 1; d < t.dims.size(); ++d) nrows *= int64_t(t.dims[d]);
      const size_t qrb = row_bytes(dt, row);
      const auto* src = reinterpret_cast<const float*>(it->second.data);
      std::vector<uint8_t> mine(qrb);
      std::vector<float> deq(static_cast<size_t>(row));
      double num = 0, den = 0;
      for (int64_t r = 0; r < nrows; ++r) {
        quantize_row(dt, src + r * row, mine.data(), row);
        ASSERT_EQ(std::memcmp(mine.data(), t.data + r * qrb, qrb), 0)
            << file << " " << name << " row " << r;
        dequantize_row(dt, t.data + r * qrb, deq.data(), row);
        for (int64_t j = 0; j < row; ++j) {
          const double e = double(deq[j]) - double(src[r * row + j]);
          num += e * e;
          den += double(src[r * row + j]) * double(src[r * row + j]);
        }
      }
      // Measured: Q4_0 8.6e-2, Q4_K 7.1e-2, Q6_K 1.8e-2, Q8_0 5.4e-3, BF16 1.7e-3, F16 2.1e-4.
      const double bound = dt == DType::Q4_0 ? 0.1 : dt == DType::Q4_K ? 0.085
                           : dt == DType::Q6_K ? 0.022 : dt == DType::Q8_0 ? 0.007 : 0.0025;
      EXPECT_LT(std::sqrt(num / den), bound) << file << " " << name;
      ++tensors_checked[dt];
    }
  }
  for (DType dt : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16})
    EXPECT_GT(tensors_checked[dt], 0) << dtype_name(dt);
}

// Q5_K only appears in the MoE fixtures, which have no f32 twin: check the
// dequantized Q5_K tensors against the f16 model built from the same weights.
TEST(Fixtures, Q5_KDequantizesToF16Weights) {
  const std::string qpath = fixture("qwen35moe-q4_k_m.gguf");
  const std::string fpath = fixture("qwen35moe-f16.gguf");
  if (!std::filesystem::exists(qpath) || !std::filesystem::exists(fpath))
    GTEST_SKIP() << "no fixtures";
  const MiniGguf q(qpath), f(fpath);
  int checked = 0;
  for (const auto& [name, t] : q.tensors) {
    if (t.type != uint32_t(DType::Q5_K)) continue;
    const auto& ft = f.tensors.at(name);
    ASSERT_EQ(ft.type, uint32_t(DType::F16));
    int64_t n = 1;
    for (auto d : t.dims) n *= int64_t(d);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::Q5_K, t.data, a.data(), n);
    dequantize_row(DType::F16, ft.data, b.data(), n);
    EXPECT_LT(rel_rms(b, a), 0.045) << name;  // measured 3.6e-2
    // And the integer dot agrees with the float dot on real ggml blocks.
    const int64_t row = int64_t(t.dims[0]);
    const auto act = gaussian(size_t(row), 9);
    const auto qa = quantize(DType::Q8_K, act);
    const auto da = dequantize(DType::Q8_K, qa, size_t(row));
    double ref = 0, mag = 0;
    for (int64_t j = 0; j < row; ++j) {
      ref += double(a[j]) * da[j];
      mag += std::fabs(double(a[j]) * da[j]);
    }
    EXPECT_NEAR(vec_dot(DType::Q5_K, row, t.data, qa.data()), ref, 1e-5 * mag);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}
