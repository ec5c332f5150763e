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

#include "gguf_reader.h"
#include "gguf_writer.h"
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
  EXPECT_EQ(dtype_traits(16u), nullptr);  // iq2_xxs: not supported
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
  EXPECT_FALSE(dtype_from_name("iq2_xxs").has_value());
  EXPECT_EQ(dtype_from_name("q4_1"), DType::Q4_1);
  EXPECT_EQ(dtype_from_name("Q5_0"), DType::Q5_0);
  EXPECT_EQ(dtype_from_name("q5_1"), DType::Q5_1);
  EXPECT_EQ(dtype_from_name("q2_k"), DType::Q2_K);
  EXPECT_EQ(dtype_from_name("Q3_K"), DType::Q3_K);
  EXPECT_EQ(dtype_from_name("IQ4_NL"), DType::IQ4_NL);
  EXPECT_EQ(dtype_from_name("iq4_xs"), DType::IQ4_XS);
  EXPECT_EQ(dtype_from_name("mxfp4"), DType::MXFP4);
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
                      RoundTrip{DType::Q4_0, 1.07e-1, 1.75e-1}, RoundTrip{DType::Q8_1, 7e-3, 1.1e-2},
                      RoundTrip{DType::Q4_1, 1.2e-1, 2.5e-1}, RoundTrip{DType::Q5_0, 6e-2, 9e-2},
                      RoundTrip{DType::Q5_1, 6e-2, 1.2e-1}, RoundTrip{DType::IQ4_NL, 1.1e-1, 1.75e-1},
                      RoundTrip{DType::MXFP4, 2.2e-1, 2.5e-1}),
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
  EXPECT_EQ(vec_dot_type(DType::Q5_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::IQ4_NL), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::MXFP4), DType::Q8_0);
  EXPECT_EQ(vec_dot_type(DType::Q4_1), DType::Q8_1);
  EXPECT_EQ(vec_dot_type(DType::Q5_1), DType::Q8_1);
  EXPECT_EQ(vec_dot_type(DType::Q2_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_type(DType::Q3_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_type(DType::IQ4_XS), DType::Q8_K);
  EXPECT_THROW(vec_dot_type(DType::I32), Error);
  EXPECT_THROW(vec_dot_type(DType::Q8_K), Error);
  EXPECT_THROW(vec_dot_type(DType::Q8_1), Error);
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
                                           DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                           DType::Q5_0, DType::IQ4_NL, DType::MXFP4),
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
  EXPECT_THROW(dtype_traits(static_cast<DType>(16)), Error);
  try {
    (void)dtype_traits(static_cast<DType>(16));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos);
  }
  // Formats read from files only: no quantizer, a clear error.
  std::vector<float> big(256, 0.f);
  std::vector<uint8_t> out(1024);
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS}) {
    try {
      quantize_row(t, big.data(), out.data(), 256);
      ADD_FAILURE() << dtype_name(t);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(dtype_name(t))), std::string::npos) << e.what();
    }
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

// ------------------------------------------------------------------ formats of issue #20
// Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, IQ4_XS (and Q8_1 activations).

TEST(NewFormats, TraitsAndRowBytes) {
  struct G {
    DType t;
    uint32_t id;
    int64_t elems;
    size_t bytes;
    const char* name;
  };
  for (const G& g : {G{DType::Q4_1, 3, 32, 20, "q4_1"}, G{DType::Q5_0, 6, 32, 22, "q5_0"},
                     G{DType::Q5_1, 7, 32, 24, "q5_1"}, G{DType::Q8_1, 9, 32, 36, "q8_1"},
                     G{DType::Q2_K, 10, 256, 84, "q2_K"}, G{DType::Q3_K, 11, 256, 110, "q3_K"},
                     G{DType::IQ4_NL, 20, 32, 18, "iq4_nl"}, G{DType::IQ4_XS, 23, 256, 136, "iq4_xs"},
                     G{DType::MXFP4, 39, 32, 17, "mxfp4"}}) {
    ASSERT_NE(dtype_traits(g.id), nullptr) << g.name;
    EXPECT_EQ(dtype_traits(g.id)->type, g.t);
    EXPECT_EQ(uint32_t(g.t), g.id);
    EXPECT_EQ(dtype_traits(g.t).block_elems, g.elems) << g.name;
    EXPECT_EQ(dtype_traits(g.t).block_bytes, g.bytes) << g.name;
    EXPECT_TRUE(dtype_traits(g.t).quantized);
    EXPECT_EQ(dtype_name(g.t), g.name);
    EXPECT_EQ(ggml_type_name(g.id), g.name);
    // A row is blocks x block bytes; a partial block is refused.
    for (int64_t blocks : {1, 3, 16}) EXPECT_EQ(row_bytes(g.t, blocks * g.elems), size_t(blocks) * g.bytes);
    EXPECT_THROW(row_bytes(g.t, g.elems + 16), Error);
  }
  EXPECT_EQ(sizeof(BlockQ4_1), 20u);
  EXPECT_EQ(sizeof(BlockQ5_0), 22u);
  EXPECT_EQ(sizeof(BlockQ5_1), 24u);
  EXPECT_EQ(sizeof(BlockQ8_1), 36u);
  EXPECT_EQ(sizeof(BlockQ2_K), 84u);
  EXPECT_EQ(sizeof(BlockQ3_K), 110u);
  EXPECT_EQ(sizeof(BlockIQ4_NL), 18u);
  EXPECT_EQ(sizeof(BlockIQ4_XS), 136u);
  EXPECT_EQ(sizeof(BlockMXFP4), 17u);
}

namespace {
// The IQ4_NL grid and the E2M1 values, written out (not taken from the library).
constexpr float kNl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr float kE2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
}  // namespace

TEST(NewFormats, Q4_1Layout) {
  BlockQ4_1 b{};
  b.d = h(0.5f);
  b.m = h(-1.f);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_1, &b, y, 32);
  EXPECT_EQ(y[0], -1.f);     // 0.5*0 - 1
  EXPECT_EQ(y[3], 0.5f);     // 0.5*3 - 1
  EXPECT_EQ(y[15], 6.5f);    // 0.5*15 - 1
  EXPECT_EQ(y[16], 6.5f);    // high nibble of byte 0: 15
  EXPECT_EQ(y[31], -1.f);    // high nibble of byte 15: 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 1.f);
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 1.f);
  }
}

TEST(NewFormats, Q5_0Layout) {
  BlockQ5_0 b{};
  b.d = h(0.25f);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  // Fifth bit set for elements 0..15 (qh bits 0..15), clear for 16..31.
  b.qh[0] = 0xFF;
  b.qh[1] = 0xFF;
  float y[32];
  dequantize_row(DType::Q5_0, &b, y, 32);
  EXPECT_EQ(y[0], 0.f);       // (0|16) - 16
  EXPECT_EQ(y[5], 1.25f);     // (5|16) - 16 = 5
  EXPECT_EQ(y[16], -0.25f);   // 15 - 16
  EXPECT_EQ(y[31], -4.f);     // 0 - 16
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * j);
    EXPECT_EQ(y[j + 16], 0.25f * (-1 - j));
  }
  // One bit of the second half: qh bit 16 + 3 -> element 19.
  b.qh[2] = 0x08;
  dequantize_row(DType::Q5_0, &b, y, 32);
  EXPECT_EQ(y[19], 0.25f * (12 + 16 - 16));
}

TEST(NewFormats, Q5_1Layout) {
  BlockQ5_1 b{};
  b.d = h(0.5f);
  b.m = h(2.f);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  b.qh[2] = 0xFF;  // fifth bit set for elements 16..31
  b.qh[3] = 0xFF;
  float y[32];
  dequantize_row(DType::Q5_1, &b, y, 32);
  EXPECT_EQ(y[0], 2.f);
  EXPECT_EQ(y[16], 17.5f);  // 0.5 * 31 + 2
  EXPECT_EQ(y[31], 10.f);   // 0.5 * 16 + 2
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j + 2.f);
    EXPECT_EQ(y[j + 16], 0.5f * (31 - j) + 2.f);
  }
}

TEST(NewFormats, IQ4_NLLayout) {
  BlockIQ4_NL b{};
  b.d = h(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::IQ4_NL, &b, y, 32);
  EXPECT_EQ(y[0], -63.5f);
  EXPECT_EQ(y[8], 0.5f);
  EXPECT_EQ(y[16], 56.5f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * kNl[j]);
    EXPECT_EQ(y[j + 16], 0.5f * kNl[15 - j]);
  }
}

TEST(NewFormats, MXFP4Layout) {
  BlockMXFP4 b{};
  b.e = 127;  // scale 2^0
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::MXFP4, &b, y, 32);
  EXPECT_EQ(y[7], 6.f);
  EXPECT_EQ(y[15], -6.f);
  EXPECT_EQ(y[16], -6.f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], kE2M1[j]);
    EXPECT_EQ(y[j + 16], kE2M1[15 - j]);
  }
  b.e = 130;  // scale 2^3
  dequantize_row(DType::MXFP4, &b, y, 32);
  EXPECT_EQ(y[5], 24.f);
  b.e = 0;    // scale 2^-127 (subnormal half-scale path)
  dequantize_row(DType::MXFP4, &b, y, 32);
  EXPECT_EQ(y[1], std::ldexp(0.5f, -127));
  b.e = 1;
  dequantize_row(DType::MXFP4, &b, y, 32);
  EXPECT_EQ(y[7], std::ldexp(6.f, -126));
}

TEST(NewFormats, Q2_KLayout) {
  BlockQ2_K b{};
  b.d = h(0.5f);
  b.dmin = h(0.25f);
  for (int s = 0; s < 16; ++s) b.scales[s] = uint8_t((s % 16) | ((s % 4) << 4));
  // Byte 0 of the first 128-chunk: bit pairs (from low) 1, 2, 3, 0 -> elements 0, 32, 64, 96.
  b.qs[0] = uint8_t(1 | (2 << 2) | (3 << 4) | (0 << 6));
  // Byte 17 of the second chunk (qs[32 + 17]): pair 2 (bits 4-5) = 3 -> element 128 + 64 + 17.
  b.qs[32 + 17] = uint8_t(3 << 4);
  float y[256];
  dequantize_row(DType::Q2_K, &b, y, 256);
  // element e: sub-block e/16 with scale s%16 and min s%4.
  EXPECT_EQ(y[0], 0.5f * 0 * 1 - 0.25f * 0);    // sub-block 0: scale 0
  EXPECT_EQ(y[32], 0.5f * 2 * 2 - 0.25f * 2);   // sub-block 2: scale 2, min 2
  EXPECT_EQ(y[64], 0.5f * 4 * 3 - 0.25f * 0);   // sub-block 4: scale 4, min 0
  EXPECT_EQ(y[96], 0.5f * 6 * 0 - 0.25f * 2);   // sub-block 6
  EXPECT_EQ(y[209], 0.5f * 13 * 3 - 0.25f * 1);  // sub-block 13: scale 13, min 1
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[17], -0.25f);                      // sub-block 1: q 0, min 1
  int nonzero_q = 0;
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    const float base = -0.25f * float(s % 4);
    if (y[e] != base) ++nonzero_q;
  }
  EXPECT_EQ(nonzero_q, 3);  // elements 32, 64, 209 (element 0 has scale 0)
}

TEST(NewFormats, Q3_KLayout) {
  BlockQ3_K b{};
  b.d = h(0.5f);
  // Scales: byte 0 = 0x21 -> low nibbles of scales 0 (1) and 8 (2); byte 8 = 0xE4 -> high
  // bit pairs of scales 0, 4, 8, 12 = 0, 1, 2, 3. So scale0 = 1, scale4 = 16,
  // scale8 = 34, scale12 = 48, others 0; the value uses scale - 32.
  b.scales[0] = 0x21;
  b.scales[8] = 0xE4;
  std::memset(b.hmask, 0xFF, sizeof(b.hmask));  // high bit set: no -4
  float y[256];
  dequantize_row(DType::Q3_K, &b, y, 256);
  for (float v : y) EXPECT_EQ(v, 0.f);  // all q = 0
  b.qs[0] = 0xFF;        // elements 0, 32, 64, 96 -> q 3
  b.hmask[0] = 0xFE;     // element 0: high bit clear -> q = 3 - 4 = -1
  b.qs[32 + 16] = 0x0C;  // second chunk, byte 16, pair 1 -> element 128 + 32 + 16 = 176, q 3
  b.hmask[16] = 0xDF;    // bit 5 (chunk 1, pair 1) clear for byte 16 -> element 176: q = -1
  dequantize_row(DType::Q3_K, &b, y, 256);
  EXPECT_EQ(y[0], 0.5f * (1 - 32) * -1);    // sub-block 0
  EXPECT_EQ(y[32], 0.5f * (0 - 32) * 3);    // sub-block 2: scale 0
  EXPECT_EQ(y[64], 0.5f * (16 - 32) * 3);   // sub-block 4
  EXPECT_EQ(y[96], 0.5f * (0 - 32) * 3);    // sub-block 6
  EXPECT_EQ(y[176], 0.5f * (0 - 32) * -1);  // sub-block 11
  EXPECT_EQ(y[1], 0.f);
  // A clear high bit alone gives q = -4: element 128 + 16 (sub-block 9, scale 0), and
  // element 128 (sub-block 8, scale 34) with hmask byte 0 bit 4 clear.
  b.hmask[16] = 0xEF;
  b.hmask[0] = 0xEE;
  b.qs[32 + 16] = 0;
  dequantize_row(DType::Q3_K, &b, y, 256);
  EXPECT_EQ(y[144], 0.5f * (0 - 32) * -4);
  EXPECT_EQ(y[128], 0.5f * (34 - 32) * -4);
  EXPECT_EQ(y[176], 0.f);
}

TEST(NewFormats, IQ4_XSLayout) {
  BlockIQ4_XS b{};
  b.d = h(0.25f);
  // Sub-block ib scale: low 4 bits = nibble ib%2 of scales_l[ib/2], high 2 = bits 2ib of scales_h.
  b.scales_l[0] = 0x21;      // ib0 lo 1, ib1 lo 2
  b.scales_l[3] = 0xF0;      // ib6 lo 0, ib7 lo 15
  b.scales_h = uint16_t(2u | (3u << 2) | (1u << 14));  // ib0 hi 2, ib1 hi 3, ib7 hi 1
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = uint8_t(j | ((15 - j) << 4));         // sub-block 0
    b.qs[16 + j] = 0x98;                              // sub-block 1: lo 8 (1), hi 9 (13)
    b.qs[7 * 16 + j] = 0x0F;                          // sub-block 7: lo 15 (113), hi 0 (-127)
  }
  float y[256];
  dequantize_row(DType::IQ4_XS, &b, y, 256);
  // ib0: ls = 1 | 2<<4 = 33 -> dl = 0.25; ib1: 2 | 48 = 50 -> 4.5; ib7: 15 | 16 = 31 -> -0.25.
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * kNl[j]);
    EXPECT_EQ(y[16 + j], 0.25f * kNl[15 - j]);
    EXPECT_EQ(y[32 + j], 4.5f * 1);
    EXPECT_EQ(y[48 + j], 4.5f * 13);
    EXPECT_EQ(y[224 + j], -0.25f * 113);
    EXPECT_EQ(y[240 + j], -0.25f * -127);
  }
  // ib2..ib6: scale 0 - 32, all nibbles 0 -> -8 * -127.
  EXPECT_EQ(y[64], 0.25f * -32 * -127);
  EXPECT_EQ(y[223], 0.25f * -32 * -127);
}

TEST(NewFormats, Q8_1Activations) {
  // Q8_0's quantization plus s = d * sum(q) in fp16.
  const auto x = gaussian(256, 77, 3.f, 0.5f);
  const auto q1 = quantize(DType::Q8_1, x);
  const auto q0 = quantize(DType::Q8_0, x);
  const auto* b1 = reinterpret_cast<const BlockQ8_1*>(q1.data());
  const auto* b0 = reinterpret_cast<const BlockQ8_0*>(q0.data());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(b1[i].d, b0[i].d);
    EXPECT_EQ(std::memcmp(b1[i].qs, b0[i].qs, 32), 0);
    int sum = 0;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) {
      sum += b1[i].qs[j];
      amax = std::max(amax, std::fabs(x[size_t(32 * i + j)]));
    }
    EXPECT_EQ(b1[i].s, h(float(sum) * (amax / 127.f)));
  }
  EXPECT_EQ(dequantize(DType::Q8_1, q1, 256), dequantize(DType::Q8_0, q0, 256));
}

namespace {

// Random bytes with sane scales: a valid block of any layout (every bit pattern of the
// quant fields is a valid level).
std::vector<uint8_t> random_blocks(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> q(row_bytes(t, n));
  for (auto& b : q) b = uint8_t(rng());
  std::uniform_real_distribution<float> u(0.001f, 0.05f);
  std::uniform_int_distribution<int> sign(0, 1);
  auto hs = [&](bool signed_) { return h((signed_ && sign(rng)) ? -u(rng) : u(rng)); };
  const size_t bb = dtype_traits(t).block_bytes;
  for (size_t off = 0; off < q.size(); off += bb) {
    uint8_t* p = q.data() + off;
    auto put = [&](size_t at, uint16_t v) { std::memcpy(p + at, &v, 2); };
    switch (t) {
      case DType::Q4_1: put(0, hs(true)); put(2, hs(true)); break;
      case DType::Q5_1: put(0, hs(true)); put(2, hs(true)); break;
      case DType::Q5_0:
      case DType::IQ4_NL:
      case DType::IQ4_XS: put(0, hs(true)); break;
      case DType::MXFP4: p[0] = uint8_t(118 + rng() % 12); break;
      case DType::Q2_K: put(80, hs(false)); put(82, hs(false)); break;
      case DType::Q3_K: put(108, hs(true)); break;
      default: ADD_FAILURE() << "no random blocks for " << dtype_name(t);
    }
  }
  return q;
}

}  // namespace

class NewFormatDot : public ::testing::TestWithParam<DType> {};

// The integer dot product equals the float dot of the dequantized weights with the
// dequantized activations, up to float rounding (and, for Q8_1 partners, the fp16
// rounding of the activation block sums s the reference also stores).
TEST_P(NewFormatDot, MatchesDequantizedDot) {
  const DType wt = GetParam();
  const DType at = vec_dot_type(wt);
  const int64_t n = 2048;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    const auto qw = random_blocks(wt, n, 300 + seed);
    const auto a = gaussian(size_t(n), 400 + seed, 2.f, seed == 2 ? -1.f : 0.f);
    const auto qa = quantize(at, a);
    const auto dw = dequantize(wt, qw, size_t(n));
    const auto da = dequantize(at, qa, size_t(n));
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(dw[size_t(i)]) * double(da[size_t(i)]);
      mag += std::fabs(double(dw[size_t(i)]) * double(da[size_t(i)]));
    }
    double tol = 1e-5 * mag + 1e-30;
    if (at == DType::Q8_1) {
      // m * s with s = fp16(d * sum q): half an fp16 ulp of s per block.
      const auto* ab = reinterpret_cast<const BlockQ8_1*>(qa.data());
      const size_t bb = dtype_traits(wt).block_bytes;
      for (int64_t b = 0; b < n / 32; ++b) {
        uint16_t m;
        std::memcpy(&m, qw.data() + size_t(b) * bb + 2, 2);
        tol += std::fabs(double(fp16_to_fp32(m)) * double(fp16_to_fp32(ab[b].s))) * std::ldexp(1.0, -11);
      }
    }
    const float got = vec_dot(wt, n, qw.data(), qa.data());
    EXPECT_NEAR(got, ref, tol) << dtype_name(wt) << " seed " << seed;
    EXPECT_GT(mag, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllNewTypes, NewFormatDot,
                         ::testing::Values(DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL,
                                           DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::IQ4_XS),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The weights of the fixture files in these formats were quantized by ggml from the
// same f32 weights as llama-f32.gguf: dequantizing them must land within each
// format's quantization error (a wrong layout gives errors of 50% and more).
TEST(Fixtures, NewFormatsDequantizeToF32Weights) {
  const std::string f32_path = fixture("llama-f32.gguf");
  if (!std::filesystem::exists(f32_path)) GTEST_SKIP() << "no fixtures at " << f32_path;
  const MiniGguf ref(f32_path);
  std::map<DType, int> checked;
  for (const char* file : {"llama-q4_1.gguf", "llama-q5_0.gguf", "llama-q5_1.gguf", "llama-iq4_nl.gguf",
                           "llama-q2_k.gguf", "llama-q3_k_m.gguf", "llama-iq4_xs.gguf"}) {
    if (!std::filesystem::exists(fixture(file))) continue;
    const MiniGguf q(fixture(file));
    for (const auto& [name, t] : q.tensors) {
      const auto* traits = dtype_traits(t.type);
      ASSERT_NE(traits, nullptr) << file << " " << name << " " << ggml_type_name(t.type);
      const DType dt = traits->type;
      if (!(dt == DType::Q4_1 || dt == DType::Q5_0 || dt == DType::Q5_1 || dt == DType::IQ4_NL ||
            dt == DType::Q2_K || dt == DType::Q3_K || dt == DType::IQ4_XS))
        continue;
      const auto& rt = ref.tensors.at(name);
      int64_t n = 1;
      for (auto d : t.dims) n *= int64_t(d);
      std::vector<float> got(static_cast<size_t>(n));
      dequantize_row(dt, t.data, got.data(), n);
      std::vector<float> want(reinterpret_cast<const float*>(rt.data), reinterpret_cast<const float*>(rt.data) + n);
      const double e = rel_rms(want, got);
      // Measured: Q2_K 0.30, Q3_K 0.15, Q4_1 0.078, IQ4_NL 0.076, IQ4_XS 0.077, Q5_0 0.042, Q5_1 0.038.
      const double bound = dt == DType::Q2_K ? 0.35 : dt == DType::Q3_K ? 0.18
                           : (dt == DType::Q5_0 || dt == DType::Q5_1) ? 0.05 : 0.09;
      EXPECT_LT(e, bound) << file << " " << name;
      if (std::getenv("TESSERA_PRINT_ERRORS"))
        std::printf("%s %s %s %.3g\n", file, name.c_str(), std::string(dtype_name(dt)).c_str(), e);
      // Integer dot on real ggml blocks == float dot of the dequantized rows.
      const int64_t row = int64_t(t.dims[0]);
      const auto act = gaussian(size_t(row), 11);
      const DType at = vec_dot_type(dt);
      const auto qa = quantize(at, act);
      const auto da = dequantize(at, qa, size_t(row));
      double r = 0, mag = 0;
      for (int64_t j = 0; j < row; ++j) {
        r += double(got[size_t(j)]) * da[size_t(j)];
        mag += std::fabs(double(got[size_t(j)]) * da[size_t(j)]);
      }
      EXPECT_NEAR(vec_dot(dt, row, t.data, qa.data()), r, 1e-3 * mag) << file << " " << name;
      ++checked[dt];
    }
  }
  for (DType dt : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::Q2_K, DType::Q3_K, DType::IQ4_XS})
    EXPECT_GT(checked[dt], 0) << dtype_name(dt);
}

// MXFP4 appears only in the MoE fixture: compare with its f32 twin.
TEST(Fixtures, MXFP4DequantizesToF32Weights) {
  const std::string qpath = fixture("qwen3moe-mxfp4_moe.gguf");
  const std::string fpath = fixture("qwen3moe-f32.gguf");
  if (!std::filesystem::exists(qpath) || !std::filesystem::exists(fpath)) GTEST_SKIP() << "no fixtures";
  const MiniGguf q(qpath), f(fpath);
  int checked = 0;
  for (const auto& [name, t] : q.tensors) {
    if (t.type != uint32_t(DType::MXFP4)) continue;
    const auto& ft = f.tensors.at(name);
    ASSERT_EQ(ft.type, uint32_t(DType::F32));
    int64_t n = 1;
    for (auto d : t.dims) n *= int64_t(d);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(DType::MXFP4, t.data, a.data(), n);
    dequantize_row(DType::F32, ft.data, b.data(), n);
    const double e = rel_rms(b, a);
    EXPECT_LT(e, 0.14) << name;  // measured 0.115
    if (std::getenv("TESSERA_PRINT_ERRORS")) std::printf("mxfp4 %s %.3g\n", name.c_str(), e);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// A tensor's byte size follows from its dtype and shape: a file whose data for a tensor
// of one of these formats is shorter than that is refused at load, naming the tensor.
TEST(NewFormats, TensorSizeMismatchRejectedAtLoad) {
  using namespace tessera::gguf;
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K,
                  DType::Q3_K, DType::IQ4_XS}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t K = 512, N = 2;
    const size_t want = row_bytes(t, K) * N;
    // The writer checks sizes itself.
    {
      GgufWriter w;
      std::vector<uint8_t> bytes(want - 1);
      try {
        w.add_tensor("blk.0.ffn_down.weight", t, {K, N}, bytes.data(), bytes.size());
        ADD_FAILURE() << "writer accepted a short tensor";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
      }
    }
    // The right size loads, with nbytes = rows x blocks x block bytes.
    {
      GgufWriter w;
      w.set_string("general.architecture", "llama");
      w.add_tensor_raw("blk.0.ffn_down.weight", uint32_t(t), {K, N}, std::vector<uint8_t>(want, 0));
      auto f = GgufFile::from_bytes(w.to_bytes(), "ok.gguf");
      ASSERT_EQ(f->tensors().size(), 1u);
      EXPECT_EQ(f->tensors()[0].type, t);
      EXPECT_EQ(f->tensors()[0].nbytes, want);
    }
    // Short data: the last tensor runs past the end of the file.
    {
      GgufWriter w;
      w.set_string("general.architecture", "llama");
      w.add_tensor_raw("blk.0.ffn_down.weight", uint32_t(t), {K, N}, std::vector<uint8_t>(want / 2, 0));
      try {
        GgufFile::from_bytes(w.to_bytes(), "bad.gguf");
        ADD_FAILURE() << "accepted a tensor shorter than its shape";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
      }
    }
    // Short data followed by another tensor: the two would overlap.
    {
      GgufWriter w;
      w.set_string("general.architecture", "llama");
      w.add_tensor_raw("blk.0.ffn_up.weight", uint32_t(t), {K, N}, std::vector<uint8_t>(want - row_bytes(t, K), 0));
      w.add_tensor_raw("blk.0.ffn_gate.weight", uint32_t(t), {K, N}, std::vector<uint8_t>(want, 0));
      try {
        GgufFile::from_bytes(w.to_bytes(), "bad.gguf");
        ADD_FAILURE() << "accepted overlapping tensors";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up.weight"), std::string::npos) << e.what();
      }
    }
  }
}
