// Unit tests of the cpu_avx512 backend against the cpu_scalar oracle: every op, every
// weight dtype of MatMul over odd row counts, several row lengths and token counts
// (decode and prefill tiles), NMSE limits, 1-thread vs 2-thread bit identity, guard
// bytes after every output, attention over the paged KV cache, and the plugin's
// probe/create. Skipped (with the reason) on CPUs without the needed AVX-512 subsets.
// Speed is measured by bench/ (tessera_bench_kernels BM_MatVec/BM_MatMul), not here.
#include <dlfcn.h>
#include <immintrin.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_avx512_backend.h"
#include "cpu_scalar_backend.h"
#include "kernels.h"
#include "support/paged_nodes.h"
#include "tessera/backend.h"
#include "tessera/conformance.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/graph.h"
#include "tessera/hwprobe.h"
#include "tessera/kv_cache.h"
#include "tessera/op_schema.h"
#include "tessera/plugin_abi.h"
#include "tessera/quant.h"
#include "tessera/scheduler.h"

using namespace tessera;

namespace {

#define SKIP_WITHOUT_AVX512()                                              \
  do {                                                                     \
    std::string _why;                                                      \
    if (!cpu_avx512::usable(&_why)) GTEST_SKIP() << "no AVX-512: " << _why; \
  } while (0)

std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}


Node node(Op op, int32_t dst, int32_t s0, int32_t s1 = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src[0] = s0;
  n.src[1] = s1;
  return n;
}

// Every node accepted by supports(), then the whole graph through
// execute_validated(), as Scheduler::run() executes it (execute() itself, which
// validates again, is what the conformance suite and the error tests call).
void run(Backend& be, Graph& g) {
  for (const Node& n : g.nodes()) {
    OpSupport s = be.supports(g, n);
    ASSERT_TRUE(s.supported) << s.reason;
  }
  be.execute_validated(g, 0, g.nodes().size());
}

constexpr size_t kGuard = 64;  // floats of guard after each output
constexpr uint32_t kGuardBits = 0x7fc0dead;

// An output buffer of n floats followed by guard floats.
struct Out {
  std::vector<float> v;
  size_t n;
  explicit Out(size_t n_) : v(n_ + kGuard), n(n_) {
    for (auto& f : v) std::memcpy(&f, &kGuardBits, 4);
  }
  float* data() { return v.data(); }
  bool guard_ok() const {
    for (size_t i = n; i < v.size(); ++i)
      if (std::memcmp(&v[i], &kGuardBits, 4) != 0) return false;
    return true;
  }
};

// Random but valid blocks of an issue-#20 format (every code, every scale bit pattern
// the format's bytes allow, F16 scales and MXFP4 exponents set to finite values of a
// useful range): Q2_K, Q3_K and IQ4_XS have no quantizer (they are read from files
// only). `tiny_e`: MXFP4 exponents 0..3 only (2^-128..2^-125, F32 subnormals among them).
std::vector<uint8_t> random_blocks(DType t, int64_t K, int64_t N, uint32_t seed, bool tiny_e = false) {
  const size_t rb = row_bytes(t, K), bs = dtype_traits(t).block_bytes;
  std::vector<uint8_t> q(rb * size_t(N));
  std::mt19937 rng(seed);
  for (auto& b : q) b = uint8_t(rng());
  std::uniform_real_distribution<float> mag(0.25f, 1.0f);
  auto f16 = [&](uint8_t* p, float scale, bool any_sign) {
    const float v = mag(rng) * scale * (any_sign && (rng() & 1) ? -1.0f : 1.0f);
    const uint16_t h = quant::fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  };
  for (size_t o = 0; o < q.size(); o += bs) {
    uint8_t* b = q.data() + o;
    switch (t) {
      case DType::Q4_1: case DType::Q5_1: f16(b, 0.05f, true), f16(b + 2, 0.5f, true); break;
      case DType::Q5_0: case DType::IQ4_NL: f16(b, 0.05f, true); break;
      case DType::MXFP4: b[0] = tiny_e ? uint8_t(rng() % 4) : uint8_t(118 + rng() % 16); break;
      case DType::Q2_K: f16(b + 80, 0.05f, true), f16(b + 82, 0.05f, true); break;
      case DType::Q3_K: f16(b + 108, 0.05f, true); break;
      case DType::IQ4_XS: f16(b, 0.01f, true); break;
      default: ADD_FAILURE() << "random_blocks: " << dtype_name(t); break;
    }
  }
  return q;
}

bool has_quantizer(DType t) { return t != DType::Q2_K && t != DType::Q3_K && t != DType::IQ4_XS; }

// The rows of w quantized to t (types without a quantizer: random valid blocks, seeded
// by the floats).
std::vector<uint8_t> quantize_matrix(DType t, const std::vector<float>& w, int64_t K, int64_t N) {
  if (!has_quantizer(t)) {
    uint32_t seed;
    std::memcpy(&seed, w.data(), 4);
    return random_blocks(t, K, N, seed);
  }
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> q(rb * size_t(N));
  for (int64_t r = 0; r < N; ++r) quant::quantize_row(t, w.data() + r * K, q.data() + size_t(r) * rb, K);
  return q;
}

// dst = W x, on backend `be`.
Out matmul(Backend& be, DType wt, std::vector<uint8_t>& w, int64_t K, int64_t N, std::vector<float>& x, int64_t M,
           bool prepare = false) {
  Out out(size_t(N * M));
  Graph g;
  Tensor wt_t = Tensor::contiguous(wt, {K, N}, w.data());
  if (prepare) be.prepare_weight(wt_t);  // may keep a repacked copy (Q4_0 / Q8_0)
  const int tw = g.add_tensor(wt_t);
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
  const int to = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, out.data()));
  g.add_node(node(Op::MatMul, to, tw, tx));
  run(be, g);
  return out;
}

class Avx512 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cpu_avx512::usable(&why)) GTEST_SKIP() << "no AVX-512: " << why;
    pool = std::make_unique<FastPool>(2);
    ref = cpu_scalar::make_backend(nullptr);
    be1 = cpu_avx512::make_backend(nullptr);
    be2 = cpu_avx512::make_backend(pool.get());
  }
  std::unique_ptr<FastPool> pool;
  std::unique_ptr<Backend> ref, be1, be2;
};

}  // namespace

TEST_F(Avx512, Name) { EXPECT_EQ(be1->name(), "cpu_avx512"); }

// --- MatMul: every weight dtype ------------------------------------------------

struct MatMulCase {
  DType wt;
  std::vector<int64_t> Ks;
};

class Avx512MatMul : public Avx512, public ::testing::WithParamInterface<MatMulCase> {};

TEST_P(Avx512MatMul, AgreesWithScalarAndThreadCountIndependent) {
  const MatMulCase& c = GetParam();
  uint32_t seed = 1;
  for (int64_t K : c.Ks) {
    // Repacked decode takes 4 tiles of 16 rows per call while 4 are left, then one: N = 120
    // ends in a partial tile inside a call of 4; 257 is 4 calls of 4 and one of 1.
    for (int64_t N : {1, 7, 33, 120, 257}) {
      std::vector<float> wf = randn(size_t(K * N), seed++, 0.5f);
      std::vector<uint8_t> w = c.wt == DType::F32 ? std::vector<uint8_t>(reinterpret_cast<uint8_t*>(wf.data()),
                                                                         reinterpret_cast<uint8_t*>(wf.data() + wf.size()))
                                                  : quantize_matrix(c.wt, wf, K, N);
      for (int64_t M : {1, 3, 16, 33}) {
        if (N >= 120 && K > 512 && M > 16) continue;  // keep the scalar oracle's time down
        std::vector<float> x = randn(size_t(K * M), seed++);
        Out r = matmul(*ref, c.wt, w, K, N, x, M);
        Out a = matmul(*be1, c.wt, w, K, N, x, M);
        Out b = matmul(*be2, c.wt, w, K, N, x, M);
        // Repacked weights (prepare_weight), 1 and 2 threads.
        Out pa = matmul(*be1, c.wt, w, K, N, x, M, true);
        Out pb = matmul(*be2, c.wt, w, K, N, x, M, true);
        const double ep = tessera::nmse(r.data(), pa.data(), size_t(N * M));
        EXPECT_LE(ep, 1e-6) << "repacked nmse " << ep;
        if (c.wt == DType::Q4_0 || c.wt == DType::Q8_0) {  // repacked: the reference's exact rounding
          EXPECT_EQ(std::memcmp(pa.data(), r.data(), sizeof(float) * size_t(N * M)), 0) << "repacked not bit-identical";
        }
        EXPECT_EQ(std::memcmp(pa.data(), pb.data(), sizeof(float) * size_t(N * M)), 0) << "repacked: 1 vs 2 threads differ";
        EXPECT_TRUE(pa.guard_ok());
        EXPECT_TRUE(pb.guard_ok());
        const double e = tessera::nmse(r.data(), a.data(), size_t(N * M));
        SCOPED_TRACE(std::string(dtype_name(c.wt)) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                     " M=" + std::to_string(M));
        EXPECT_LE(e, 1e-6) << "nmse " << e;  // the integer sums are exact: float rounding only
        // Blocks of 32 of the row kernels: the reference's scaling and summation order.
        if (c.wt == DType::Q4_0 || c.wt == DType::Q8_0 || c.wt == DType::Q4_1 || c.wt == DType::Q5_0 ||
            c.wt == DType::Q5_1 || c.wt == DType::IQ4_NL || c.wt == DType::MXFP4) {
          EXPECT_EQ(std::memcmp(a.data(), r.data(), sizeof(float) * size_t(N * M)), 0) << "not bit-identical";
        }
        // A weight computes the same bits repacked or not (streamed experts are not).
        if (cpu_avx512::kern::repack_supported(c.wt)) {
          EXPECT_EQ(std::memcmp(a.data(), pa.data(), sizeof(float) * size_t(N * M)), 0) << "rows differ from repacked";
        }
        EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(N * M)), 0) << "1 vs 2 threads differ";
        EXPECT_TRUE(a.guard_ok());
        EXPECT_TRUE(b.guard_ok());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllWeightTypes, Avx512MatMul,
    ::testing::Values(MatMulCase{DType::F32, {1, 37, 96, 512}}, MatMulCase{DType::F16, {5, 48, 96, 1000}},
                      MatMulCase{DType::BF16, {3, 48, 96, 1000}}, MatMulCase{DType::Q8_0, {32, 64, 96, 608, 2048}},
                      MatMulCase{DType::Q4_0, {32, 64, 96, 608, 2048}}, MatMulCase{DType::Q4_K, {256, 512, 2048}},
                      MatMulCase{DType::Q5_K, {256, 512, 2048}}, MatMulCase{DType::Q6_K, {256, 512, 2048}},
                      // Issue #20's formats (row kernels only): 1, 3, 5, 19 and 64 blocks of 32
                      // (partial groups of 4 and of 16 blocks), 1, 2, 3 and 8 blocks of 256.
                      MatMulCase{DType::Q4_1, {32, 96, 160, 608, 2048}}, MatMulCase{DType::Q5_0, {32, 96, 160, 608, 2048}},
                      MatMulCase{DType::Q5_1, {32, 96, 160, 608, 2048}},
                      MatMulCase{DType::IQ4_NL, {32, 96, 160, 608, 2048}},
                      MatMulCase{DType::MXFP4, {32, 96, 160, 608, 2048}}, MatMulCase{DType::Q2_K, {256, 512, 768, 2048}},
                      MatMulCase{DType::Q3_K, {256, 512, 768, 2048}}, MatMulCase{DType::IQ4_XS, {256, 512, 768, 2048}}),
    [](const ::testing::TestParamInfo<MatMulCase>& i) { return std::string(dtype_name(i.param.wt)); });

// Issue #20's formats from random valid blocks (every code and bit pattern, not only
// what a quantizer produces; MXFP4 also with the smallest exponents, whose scales are
// F32 subnormals), decode and prefill column counts, on 1 and 2 executors. The
// integer sums are exact, so the row kernels differ from the reference by float
// rounding only.
TEST_F(Avx512, NewFormatsFromRandomBlocksAgreeWithScalar) {
  uint32_t seed = 2000;
  for (DType wt : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                   DType::IQ4_XS})
    for (bool tiny_e : {false, true}) {
      if (tiny_e && wt != DType::MXFP4) continue;
      for (int64_t K : {256, 2304})
        for (int64_t N : {1, 33})
          for (int64_t M : {1, 4, 5}) {
            SCOPED_TRACE(std::string(dtype_name(wt)) + (tiny_e ? " tiny exponents" : "") + " K=" + std::to_string(K) +
                         " N=" + std::to_string(N) + " M=" + std::to_string(M));
            std::vector<uint8_t> w = random_blocks(wt, K, N, seed++, tiny_e);
            std::vector<float> x = randn(size_t(K * M), seed++);
            Out r = matmul(*ref, wt, w, K, N, x, M);
            Out a = matmul(*be1, wt, w, K, N, x, M), b = matmul(*be2, wt, w, K, N, x, M);
            const double e = tessera::nmse(r.data(), a.data(), r.n);
            EXPECT_LE(e, 1e-6) << "nmse " << e;
            EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * r.n), 0) << "1 vs 2 threads differ";
            EXPECT_TRUE(a.guard_ok() && b.guard_ok());
            if (N > 1 && M == 1) {
              // Decode may compute rows in pairs: each row equals the row computed alone
              // (rows 0-2 as a product of 3: a pair and a lone row; here rows 2 pairs with 3).
              std::vector<uint8_t> w3(w.begin(), w.begin() + ptrdiff_t(3 * row_bytes(wt, K)));
              Out a3 = matmul(*be1, wt, w3, K, 3, x, 1);
              EXPECT_EQ(std::memcmp(a3.data(), a.data(), sizeof(float) * 3), 0) << "rows alone and paired differ";
            }
          }
    }
}

// The activations of issue #20's formats are quantized as the reference does (Q8_0 and
// Q8_1: halves rounded away from zero, Q8_1's sum through F16; Q8_K: halves to even):
// a column of exact halves at a scale of 1 (every value a tie: rounding them the other
// way moves the integer sums by about 1% of the result, NMSE ~1e-4), tiny and zero blocks.
TEST_F(Avx512, NewFormatsQuantizeActivationsAsTheReference) {
  uint32_t seed = 3000;
  for (DType wt : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                   DType::IQ4_XS}) {
    const int64_t K = 512, N = 19;
    std::vector<uint8_t> w = has_quantizer(wt) ? quantize_matrix(wt, randn(size_t(K * N), seed++, 0.5f), K, N)
                                               : random_blocks(wt, K, N, seed++);
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(std::string(dtype_name(wt)) + " variant " + std::to_string(variant));
      std::vector<float> x;
      if (variant == 0) {
        // Every 32-block (and 256-block) has a maximum of exactly 127: scale 1, and
        // every other value an exact half, so every rounding is a tie.
        x.resize(size_t(K));
        std::mt19937 rng(seed++);
        for (int64_t k = 0; k < K; ++k) x[size_t(k)] = float(int(rng() % 254) - 127) + 0.5f;
        for (int64_t b = 0; b < K; b += 32) x[size_t(b + (b / 32) % 32)] = (b / 32) % 2 ? 127.0f : -127.0f;
      } else {
        x = randn(size_t(K), seed++, variant == 1 ? 1e-4f : 3e-6f);
        std::fill(x.begin() + 256, x.begin() + 320, 0.0f);  // two blocks of 32 zeros
      }
      Out r = matmul(*ref, wt, w, K, N, x, 1);
      Out a = matmul(*be1, wt, w, K, N, x, 1), b = matmul(*be2, wt, w, K, N, x, 1);
      EXPECT_LE(tessera::nmse(r.data(), a.data(), r.n), 1e-6);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * r.n), 0);
    }
  }
}

// Repacked Q4_0 / Q8_0 decode walks 1, 2 or 4 tiles per call (make_backend's
// decode_tiles; the default depends on the CPU, so each is tested here): every one is
// bit-identical to the reference, on 1 and 2 executors, whatever tiles are left over
// (N = 120: a partial tile inside a call; 257: calls of G and a tail).
TEST_F(Avx512, RepackedDecodeEveryTileGroupSizeIsExact) {
  uint32_t seed = 77;
  for (int g : {1, 2, 4}) {
    auto one = cpu_avx512::make_backend(nullptr, true, g), two = cpu_avx512::make_backend(pool.get(), true, g);
    for (DType wt : {DType::Q4_0, DType::Q8_0})
      for (int64_t K : {64, 608})
        for (int64_t N : {1, 7, 33, 120, 257}) {
          SCOPED_TRACE(std::string(dtype_name(wt)) + " G=" + std::to_string(g) + " K=" + std::to_string(K) +
                       " N=" + std::to_string(N));
          std::vector<uint8_t> w = quantize_matrix(wt, randn(size_t(K * N), seed++, 0.5f), K, N);
          std::vector<float> x = randn(size_t(K), seed++);
          Out r = matmul(*ref, wt, w, K, N, x, 1);
          Out a = matmul(*one, wt, w, K, N, x, 1, true), b = matmul(*two, wt, w, K, N, x, 1, true);
          EXPECT_EQ(std::memcmp(a.data(), r.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_EQ(std::memcmp(b.data(), r.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_TRUE(a.guard_ok());
          EXPECT_TRUE(b.guard_ok());
        }
  }
  EXPECT_THROW(cpu_avx512::make_backend(nullptr, true, 3), Error);
  const int d = cpu_avx512::default_decode_tiles();
  EXPECT_TRUE(d == 1 || d == 4) << d;
}

// Activations so small that their Q8 block scales (amax / 127, stored as F16) are F16
// subnormals, and blocks of zeros (scale 0): the scales are rounded to F16 in
// registers, which must equal quant::fp32_to_fp16 there too: repacked Q4_0 / Q8_0
// stay bit-identical to the reference on 1 and 2 executors; the row kernels (which
// sum in another order) stay within float rounding of it.
TEST_F(Avx512, TinyAndZeroActivationBlocksQuantizeAsTheReference) {
  uint32_t seed = 123;
  for (bool repack : {true, false}) {
    auto one = cpu_avx512::make_backend(nullptr, repack), two = cpu_avx512::make_backend(pool.get(), repack);
    for (DType wt : {DType::Q4_0, DType::Q8_0})
      for (float scale : {1e-4f, 3e-6f}) {
        SCOPED_TRACE(std::string(dtype_name(wt)) + (repack ? " repacked" : " rows") + " scale " + std::to_string(scale));
        const int64_t K = 608, N = 37;
        std::vector<uint8_t> w = quantize_matrix(wt, randn(size_t(K * N), seed++, 0.5f), K, N);
        std::vector<float> x = randn(size_t(K), seed++, scale);
        std::fill(x.begin() + 64, x.begin() + 128, 0.0f);  // two blocks of zeros
        Out r = matmul(*ref, wt, w, K, N, x, 1);
        Out a = matmul(*one, wt, w, K, N, x, 1, repack), b = matmul(*two, wt, w, K, N, x, 1, repack);
        if (repack) {
          EXPECT_EQ(std::memcmp(a.data(), r.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_EQ(std::memcmp(b.data(), r.data(), sizeof(float) * size_t(N)), 0);
        } else {
          EXPECT_LE(tessera::nmse(r.data(), a.data(), size_t(N)), 1e-6);
          EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(N)), 0);
        }
      }
  }
}

// Software prefetch of the weight stream in decode (make_backend's decode_prefetch; the
// default depends on the CPU) only changes when bytes arrive: with and without it every
// weight dtype computes the same bits, repacked or read by the row kernels, on 1 and 2
// executors.
TEST_F(Avx512, DecodeWithAndWithoutPrefetchIsTheSame) {
  uint32_t seed = 91;
  for (bool repack : {true, false}) {
    auto on1 = cpu_avx512::make_backend(nullptr, repack, 0, 1), on2 = cpu_avx512::make_backend(pool.get(), repack, 0, 1);
    auto off1 = cpu_avx512::make_backend(nullptr, repack, 0, 0), off2 = cpu_avx512::make_backend(pool.get(), repack, 0, 0);
    for (DType wt : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
      for (int64_t K : {256, 2048})
        for (int64_t N : {1, 33, 257}) {
          SCOPED_TRACE(std::string(dtype_name(wt)) + (repack ? " repacked" : " rows") + " K=" + std::to_string(K) +
                       " N=" + std::to_string(N));
          std::vector<uint8_t> w = quantize_matrix(wt, randn(size_t(K * N), seed++, 0.5f), K, N);
          std::vector<float> x = randn(size_t(K), seed++);
          Out r = matmul(*ref, wt, w, K, N, x, 1);
          Out a = matmul(*on1, wt, w, K, N, x, 1, repack), b = matmul(*on2, wt, w, K, N, x, 1, repack);
          Out c = matmul(*off1, wt, w, K, N, x, 1, repack), d = matmul(*off2, wt, w, K, N, x, 1, repack);
          EXPECT_EQ(std::memcmp(a.data(), c.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_EQ(std::memcmp(b.data(), d.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * size_t(N)), 0);
          EXPECT_LE(tessera::nmse(r.data(), c.data(), size_t(N)), 1e-6);  // float rounding only, as above
          EXPECT_TRUE(c.guard_ok() && d.guard_ok());
        }
  }
  EXPECT_THROW(cpu_avx512::make_backend(nullptr, true, 0, 2), Error);
}

// A strided x (a view with padded rows) and a batched 3-D x.
TEST_F(Avx512, MatMulStridedAnd3DActivations) {
  const int64_t K = 256, N = 9;
  std::vector<float> wf = randn(size_t(K * N), 7);
  std::vector<uint8_t> w = quantize_matrix(DType::Q4_K, wf, K, N);
  std::vector<float> x = randn(size_t(K * 6), 8);
  Out r(size_t(N * 6)), a(size_t(N * 6));
  for (Backend* be : {ref.get(), be2.get()}) {
    Graph g;
    const int tw = g.add_tensor(Tensor::contiguous(DType::Q4_K, {K, N}, w.data()));
    const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, 3, 2}, x.data()));
    const int to = g.add_tensor(Tensor::contiguous(DType::F32, {N, 3, 2}, (be == ref.get() ? r : a).data()));
    g.add_node(node(Op::MatMul, to, tw, tx));
    run(*be, g);
  }
  EXPECT_LE(tessera::nmse(r.data(), a.data(), a.n), 1e-6);
  EXPECT_TRUE(a.guard_ok());
}

// A repacked copy is only used while the original bytes still match: a weight buffer
// whose contents change (or whose address is reused by another tensor) is read afresh.
TEST_F(Avx512, RepackedCopyIsNotUsedWhenTheWeightChanges) {
  const int64_t K = 256, N = 40, M = 2;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + ", " + std::to_string(threads) + " executor(s)");
      Backend& be = threads == 1 ? *be1 : *be2;
      std::vector<uint8_t> w = quantize_matrix(t, randn(size_t(K * N), 21), K, N);
      std::vector<float> x = randn(size_t(K * M), 22);
      for (int64_t m : {int64_t(1), M}) {  // decode (guided claims) and prefill
        std::vector<float> xm(x.begin(), x.begin() + K * m);
        Out a = matmul(be, t, w, K, N, xm, m, true);
        Out ra = matmul(*ref, t, w, K, N, xm, m);
        EXPECT_LE(tessera::nmse(ra.data(), a.data(), ra.n), 1e-6);
      }
      // New contents at the same address, no prepare_weight.
      const std::vector<uint8_t> changed = quantize_matrix(t, randn(size_t(K * N), 23), K, N);
      std::copy(changed.begin(), changed.end(), w.begin());
      Out r = matmul(*ref, t, w, K, N, x, M);
      Out b = matmul(be, t, w, K, N, x, M);
      EXPECT_LE(tessera::nmse(r.data(), b.data(), r.n), 1e-6);
      // A view of the first rows of a repacked weight (same address, fewer rows) reads
      // the tensor itself, and the full weight keeps its repacked copy.
      Out full1 = matmul(be, t, w, K, N, x, M, true);
      Out part = matmul(be, t, w, K, N / 2, x, M);
      Out partr = matmul(*ref, t, w, K, N / 2, x, M);
      EXPECT_LE(tessera::nmse(partr.data(), part.data(), partr.n), 1e-6);
      Out full2 = matmul(be, t, w, K, N, x, M);
      EXPECT_EQ(std::memcmp(full1.data(), full2.data(), sizeof(float) * full1.n), 0);
    }
  }
}

// The same inside a group of products over one x (q/k/v): only the product whose
// weight changed is computed afresh, the others keep their repacked copies.
TEST_F(Avx512, GroupedProductSeesItsWeightChange) {
  const int64_t K = 256, N = 48;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " executor(s)");
    Backend& be = threads == 1 ? *be1 : *be2;
    std::vector<uint8_t> w1 = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 81), K, N);
    std::vector<uint8_t> w2 = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 82), K, N);
    std::vector<float> x = randn(size_t(K), 83);
    Tensor t1 = Tensor::contiguous(DType::Q4_0, {K, N}, w1.data()), t2 = Tensor::contiguous(DType::Q4_0, {K, N}, w2.data());
    be.prepare_weight(t1);
    be.prepare_weight(t2);
    Out y1{size_t(N)}, y2{size_t(N)};
    Graph g;
    const int xi = g.add_tensor(Tensor::contiguous(DType::F32, {K, 1}, x.data()));
    g.add_node(node(Op::MatMul, g.add_tensor(Tensor::contiguous(DType::F32, {N, 1}, y1.data())), g.add_tensor(t1), xi));
    g.add_node(node(Op::MatMul, g.add_tensor(Tensor::contiguous(DType::F32, {N, 1}, y2.data())), g.add_tensor(t2), xi));
    run(be, g);
    const std::vector<uint8_t> changed = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 84), K, N);
    std::copy(changed.begin(), changed.end(), w2.begin());  // new bytes at the same address
    std::fill(y1.data(), y1.data() + N, NAN);  // both products must be computed again
    std::fill(y2.data(), y2.data() + N, NAN);
    run(be, g);
    Out r1 = matmul(*ref, DType::Q4_0, w1, K, N, x, 1), r2 = matmul(*ref, DType::Q4_0, w2, K, N, x, 1);
    EXPECT_EQ(std::memcmp(r1.data(), y1.data(), sizeof(float) * r1.n), 0);  // repacked Q4_0: the reference's rounding
    EXPECT_LE(tessera::nmse(r2.data(), y2.data(), r2.n), 1e-6);
    EXPECT_TRUE(y1.guard_ok());
    EXPECT_TRUE(y2.guard_ok());
  }
}

// gate and up products followed by the SwiGlu of their outputs run as one dispatch
// (the SwiGlu rows computed with each tile pair): every output equals the reference,
// on 1 and 2 executors, with a partial last tile, several tokens, either product
// first in the graph, and again after the gate weight changed in place (its stale
// copy dropped, the SwiGlu redone).
TEST_F(Avx512, GateUpProductsWithTheirSwiGluEqualTheReference) {
  const int64_t K = 256;
  for (int threads : {1, 2})
    for (int64_t N : {48, 40})
      for (int64_t M : {1, 3})
        for (bool up_first : {false, true}) {
          SCOPED_TRACE(std::to_string(threads) + " executor(s), N=" + std::to_string(N) + " M=" + std::to_string(M) +
                       (up_first ? ", up's product first" : ""));
          Backend& be = threads == 1 ? *be1 : *be2;
          std::vector<uint8_t> wg = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 91), K, N);
          std::vector<uint8_t> wu = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 92), K, N);
          std::vector<float> x = randn(size_t(K * M), 93);
          Tensor tg = Tensor::contiguous(DType::Q4_0, {K, N}, wg.data()), tu = Tensor::contiguous(DType::Q4_0, {K, N}, wu.data());
          be.prepare_weight(tg);
          be.prepare_weight(tu);
          auto build = [&](Graph& g, Out& og, Out& ou, Out& oy) {
            const int xi = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
            const int gi = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, og.data()));
            const int ui = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, ou.data()));
            const Node gate_product = node(Op::MatMul, gi, g.add_tensor(tg), xi);
            const Node up_product = node(Op::MatMul, ui, g.add_tensor(tu), xi);
            g.add_node(up_first ? up_product : gate_product);
            g.add_node(up_first ? gate_product : up_product);
            g.add_node(node(Op::SwiGlu, g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, oy.data())), gi, ui));
          };
          Out g_out{size_t(N * M)}, u_out{size_t(N * M)}, y_out{size_t(N * M)};
          Graph g;
          build(g, g_out, u_out, y_out);
          for (int round = 0; round < 2; ++round) {
            if (round == 1) {  // new gate bytes at the same address
              const std::vector<uint8_t> changed = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 94), K, N);
              std::copy(changed.begin(), changed.end(), wg.begin());
            }
            for (Out* o : {&g_out, &u_out, &y_out}) std::fill(o->data(), o->data() + o->n, NAN);
            run(be, g);
            Out rg{size_t(N * M)}, ru{size_t(N * M)}, ry{size_t(N * M)};
            Graph rgraph;
            build(rgraph, rg, ru, ry);
            run(*ref, rgraph);
            if (round == 0) {  // repacked Q4_0 and the vector SwiGlu: the reference's rounding
              EXPECT_EQ(std::memcmp(rg.data(), g_out.data(), sizeof(float) * rg.n), 0);
              EXPECT_EQ(std::memcmp(ry.data(), y_out.data(), sizeof(float) * ry.n), 0);
            } else {  // the gate from the tensor's rows: float rounding only
              EXPECT_LE(tessera::nmse(rg.data(), g_out.data(), rg.n), 1e-6);
              EXPECT_LE(tessera::nmse(ry.data(), y_out.data(), ry.n), 1e-6);
            }
            EXPECT_EQ(std::memcmp(ru.data(), u_out.data(), sizeof(float) * ru.n), 0) << "round " << round;
            EXPECT_TRUE(g_out.guard_ok() && u_out.guard_ok() && y_out.guard_ok());
          }
        }
}

// weight_bytes() names what a product streams: the repacked copy while it is valid,
// else the tensor's own bytes (what `tessera bench` reads for its in-place roofline).
TEST_F(Avx512, WeightBytesAreTheRepackedCopyWhileItIsUsed) {
  const int64_t K = 256, N = 40;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<uint8_t> w = quantize_matrix(t, randn(size_t(K * N), 31), K, N);
    Tensor wt = Tensor::contiguous(t, {K, N}, w.data());
    wt.name = "w";
    auto be = cpu_avx512::make_backend(pool.get());
    auto own = be->weight_bytes(wt);
    EXPECT_EQ(static_cast<const void*>(own.data()), static_cast<const void*>(w.data()));
    EXPECT_EQ(own.size(), w.size());
    be->prepare_weight(wt);
    auto sp = be->weight_bytes(wt);
    if (cpu_avx512::kern::repack_supported(t)) {
      EXPECT_NE(static_cast<const void*>(sp.data()), static_cast<const void*>(w.data()));
      EXPECT_EQ(sp.size(), cpu_avx512::kern::repacked_bytes(t, K, N));  // 40 rows: 3 tiles of 16, the last padded
      const std::vector<uint8_t> w2 = quantize_matrix(t, randn(size_t(K * N), 32), K, N);
      std::memcpy(w.data(), w2.data(), w.size());  // new contents at the same address: the copy is stale
      EXPECT_EQ(static_cast<const void*>(be->weight_bytes(wt).data()), static_cast<const void*>(w.data()));
    } else {
      EXPECT_EQ(static_cast<const void*>(sp.data()), static_cast<const void*>(w.data()));
    }
  }
}

// A matrix the kernels read in its own layout gets an identical copy in huge pages,
// and the tensor points at it: the same bytes, the same products, the original left
// intact (its pages are only handed back); weight_bytes() names the copy. A vector, a
// 3-D expert tensor, and everything with repacking off keep their memory.
TEST_F(Avx512, RowLayoutMatricesAreCopiedIntoStreamedPages) {
  const int64_t K = 256, N = 40, M = 3;
  std::vector<float> x = randn(size_t(K * M), 7);
  for (DType t : {DType::IQ4_XS, DType::Q3_K, DType::Q5_0, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<uint8_t> w = quantize_matrix(t, randn(size_t(K * N), 41), K, N);
    const std::vector<uint8_t> before = w;
    Out plain = matmul(*be2, t, w, K, N, x, M);
    auto be = cpu_avx512::make_backend(pool.get());
    Tensor wt = Tensor::contiguous(t, {K, N}, w.data());
    be->prepare_weight(wt);
    ASSERT_NE(wt.data, static_cast<void*>(w.data()));
    EXPECT_EQ(std::memcmp(wt.data, w.data(), w.size()), 0);
    EXPECT_EQ(w, before);
    EXPECT_EQ(static_cast<const void*>(be->weight_bytes(wt).data()), wt.data);
    Out copied(size_t(N * M));
    Graph g;
    const int tw = g.add_tensor(wt);
    const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
    const int to = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, copied.data()));
    g.add_node(node(Op::MatMul, to, tw, tx));
    run(*be, g);
    for (size_t i = 0; i < size_t(N * M); ++i) ASSERT_EQ(copied.data()[i], plain.data()[i]) << i;

    auto no_repack = cpu_avx512::make_backend(pool.get(), false);
    Tensor kept = Tensor::contiguous(t, {K, N}, w.data());
    no_repack->prepare_weight(kept);
    EXPECT_EQ(kept.data, static_cast<void*>(w.data()));
    Tensor experts = Tensor::contiguous(t, {K, N / 2, 2}, w.data());
    be->prepare_weight(experts);
    EXPECT_EQ(experts.data, static_cast<void*>(w.data()));
  }
  std::vector<float> v = randn(size_t(K), 9);
  Tensor vec = Tensor::contiguous(DType::F32, {K}, v.data());
  be2->prepare_weight(vec);
  EXPECT_EQ(vec.data, static_cast<void*>(v.data()));
}

// Consecutive MatMuls over the same x reuse its quantized activation (q/k/v,
// gate/up); a different weight dtype, an op in between that rewrites x, or a
// product whose dst overlaps x must not see a stale one. Each result must equal the
// same MatMul run alone.
TEST_F(Avx512, ConsecutiveMatMulsShareTheActivationSafely) {
  const int64_t K = 256, N = 48, M = 3;
  for (bool prepare : {false, true}) {
    SCOPED_TRACE(prepare ? "repacked" : "plain");
    auto be = cpu_avx512::make_backend(pool.get());
    std::vector<uint8_t> w1 = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 61), K, N);
    std::vector<uint8_t> w2 = quantize_matrix(DType::Q4_0, randn(size_t(K * N), 62), K, N);
    std::vector<uint8_t> w3 = quantize_matrix(DType::Q8_0, randn(size_t(K * N), 63), K, N);
    Tensor t1 = Tensor::contiguous(DType::Q4_0, {K, N}, w1.data()), t2 = Tensor::contiguous(DType::Q4_0, {K, N}, w2.data()),
           t3 = Tensor::contiguous(DType::Q8_0, {K, N}, w3.data());
    if (prepare) be->prepare_weight(t1), be->prepare_weight(t2), be->prepare_weight(t3);
    // buf: x [K, M] followed by room; y4 overlaps the end of x.
    std::vector<float> buf(size_t(K * M + N * M + 64), 0.0f);
    std::vector<float> x0 = randn(size_t(K * M), 64);
    std::copy(x0.begin(), x0.end(), buf.begin());
    Out y1(size_t(N * M)), y2(size_t(N * M)), y3(size_t(N * M)), y5(size_t(N * M));
    Graph g;
    const int w1i = g.add_tensor(t1), w2i = g.add_tensor(t2), w3i = g.add_tensor(t3);
    const int xi = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, buf.data()));
    const int o1 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, y1.data()));
    const int o2 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, y2.data()));
    const int o3 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, y3.data()));
    const int o4 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, buf.data() + K * M - 16));  // overlaps x
    const int o5 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, y5.data()));
    g.add_node(node(Op::MatMul, o1, w1i, xi));
    g.add_node(node(Op::MatMul, o2, w2i, xi));  // same x, same dtype: reused
    g.add_node(node(Op::MatMul, o3, w3i, xi));  // other dtype: prepared again
    g.add_node(node(Op::MatMul, o4, w1i, xi));  // writes over the end of x
    g.add_node(node(Op::MatMul, o5, w2i, xi));  // must see the new x
    run(*be, g);
    // References: each product alone (fresh backend, no reuse possible).
    auto alone = [&](std::vector<uint8_t>& w, DType t, std::vector<float> x) {
      auto fresh = cpu_avx512::make_backend(pool.get());
      return matmul(*fresh, t, w, K, N, x, M, prepare);
    };
    std::vector<float> x1(buf.begin(), buf.begin() + K * M);  // x after node 4
    Out r1 = alone(w1, DType::Q4_0, x0), r2 = alone(w2, DType::Q4_0, x0), r3 = alone(w3, DType::Q8_0, x0);
    Out r5 = alone(w2, DType::Q4_0, x1);
    EXPECT_NE(std::memcmp(x1.data(), x0.data(), sizeof(float) * x0.size()), 0);  // node 4 did change x
    EXPECT_EQ(std::memcmp(r1.data(), y1.data(), sizeof(float) * r1.n), 0);
    EXPECT_EQ(std::memcmp(r2.data(), y2.data(), sizeof(float) * r2.n), 0);
    EXPECT_EQ(std::memcmp(r3.data(), y3.data(), sizeof(float) * r3.n), 0);
    EXPECT_EQ(std::memcmp(r5.data(), y5.data(), sizeof(float) * r5.n), 0);
    // An in-place op between two MatMuls over the same x.
    Out z1(size_t(N * M)), z2(size_t(N * M));
    std::vector<float> x2 = x0;
    Graph h;
    const int a1 = h.add_tensor(t1), a2 = h.add_tensor(t2);
    const int hx = h.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x2.data()));
    const int h1 = h.add_tensor(Tensor::contiguous(DType::F32, {N, M}, z1.data()));
    const int h2 = h.add_tensor(Tensor::contiguous(DType::F32, {N, M}, z2.data()));
    h.add_node(node(Op::MatMul, h1, a1, hx));
    h.add_node(node(Op::Add, hx, hx, hx));  // x = 2x in place
    h.add_node(node(Op::MatMul, h2, a2, hx));
    run(*be, h);
    std::vector<float> xx = x0;
    for (float& v : xx) v = v + v;
    Out q2 = alone(w2, DType::Q4_0, xx);
    EXPECT_EQ(std::memcmp(q2.data(), z2.data(), sizeof(float) * q2.n), 0);
  }
}

// Consecutive MatMuls over one x with repacked weights of one dtype and K run as one
// dispatch (up to 4 products: q/k/v, gate/up). Each result must equal the product
// run alone, on 1 and 2 executors; a product writing the dst of an earlier one ends
// the group, so the later write still wins.
TEST_F(Avx512, GroupedMatMulsEqualEachProductAlone) {
  const int64_t K = 256;
  const std::vector<int64_t> Ns = {40, 16, 16, 72, 24, 16};
  // Issue #20's formats are grouped too (row kernels on the GGUF layout, one dispatch).
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::IQ4_XS, DType::Q3_K, DType::Q4_1}) {
    for (int64_t M : {int64_t(1), int64_t(5)}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M));
      std::vector<std::vector<uint8_t>> ws;
      for (size_t i = 0; i < Ns.size() + 1; ++i)
        ws.push_back(quantize_matrix(t, randn(size_t(K * Ns[std::min(i, Ns.size() - 1)]), uint32_t(70 + i)), K,
                                     Ns[std::min(i, Ns.size() - 1)]));
      std::vector<float> x = randn(size_t(K * M), 69);
      for (Backend* b : {be1.get(), be2.get()}) {
        std::vector<Tensor> wt;
        for (size_t i = 0; i < ws.size(); ++i) {
          wt.push_back(Tensor::contiguous(t, {K, Ns[std::min(i, Ns.size() - 1)]}, ws[i].data()));
          b->prepare_weight(wt.back());
        }
        std::vector<Out> ys;
        for (int64_t N : Ns) ys.emplace_back(size_t(N * M));
        Graph g;
        const int xi = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
        for (size_t i = 0; i < ws.size(); ++i) {
          const size_t o = std::min(i, Ns.size() - 1);  // the last two write the same dst
          const int wi = g.add_tensor(wt[i]);
          const int di = g.add_tensor(Tensor::contiguous(DType::F32, {Ns[o], M}, ys[o].data()));
          g.add_node(node(Op::MatMul, di, wi, xi));
        }
        run(*b, g);
        for (size_t o = 0; o < Ns.size(); ++o) {
          auto fresh = cpu_avx512::make_backend(pool.get());
          const size_t wsrc = o + 1 == Ns.size() ? o + 1 : o;
          Out r = matmul(*fresh, t, ws[wsrc], K, Ns[o], x, M, true);
          EXPECT_EQ(std::memcmp(r.data(), ys[o].data(), sizeof(float) * r.n), 0) << "product " << o;
          EXPECT_TRUE(ys[o].guard_ok());
        }
      }
    }
  }
}

// execute_validated() (what Scheduler::run calls) computes exactly what execute()
// does on a decode/prefill-like graph: grouped repacked products with the fused
// SwiGlu, small ops, KvWrite + Attention and a router op (TopK); the run-time checks
// (slots and pages inside the storage, the sequence table, data pointers) are the core's, made
// by execute() and by Scheduler::run() before the backend sees the node, and the ids
// a kernel reads are checked by the kernel.
TEST_F(Avx512, ExecuteValidatedEqualsExecuteAndKeepsRunTimeChecks) {
  const int64_t K = 256, F = 128, M = 3, hd = 64, nh = 4, nkv = 2;
  std::vector<uint8_t> wg = quantize_matrix(DType::Q4_0, randn(size_t(K * F), 81), K, F);
  std::vector<uint8_t> wu = quantize_matrix(DType::Q4_0, randn(size_t(K * F), 82), K, F);
  std::vector<uint8_t> wd = quantize_matrix(DType::Q8_0, randn(size_t(F * K), 83), F, K);
  const std::vector<float> x0 = randn(size_t(K * M), 84), norm_w = randn(size_t(K), 85);
  const std::vector<float> k0 = randn(size_t(hd * nkv * M), 86), v0 = randn(size_t(hd * nkv * M), 87);
  const std::vector<float> q0 = randn(size_t(hd * nh * M), 88);
  const KvCacheConfig cfg{1, int(nkv), int(hd), 4, 8, {}};
  struct Result {
    std::vector<float> y, attn;
    std::vector<int32_t> top;
    std::vector<uint16_t> krow;
  };
  auto go = [&](bool validated) {
    auto be = cpu_avx512::make_backend(pool.get());
    KvCache kv(cfg);
    const KvCache::SeqId seq = kv.create_sequence();
    EXPECT_TRUE(kv.reserve(seq, 2 + M));
    for (int64_t p = 0; p < 2; ++p) {  // a history of two positions before this step
      std::memset(kv.k_row(0, seq, p), 0, size_t(hd * nkv) * 2);
      std::memset(kv.v_row(0, seq, p), 0, size_t(hd * nkv) * 2);
    }
    kv.set_length(seq, 2);
    std::vector<float> x = x0, nw = norm_w, k = k0, v = v0, q = q0;
    std::vector<float> xn(size_t(K * M)), gt(size_t(F * M)), ut(size_t(F * M)), h(size_t(F * M)), d(size_t(K * M));
    Result r;
    r.y.assign(size_t(K * M), 0.0f);
    r.attn.assign(size_t(hd * nh * M), 0.0f);
    r.top.assign(size_t(2 * M), -1);
    Tensor tg = Tensor::contiguous(DType::Q4_0, {K, F}, wg.data()), tu = Tensor::contiguous(DType::Q4_0, {K, F}, wu.data()),
           td = Tensor::contiguous(DType::Q8_0, {F, K}, wd.data());
    be->prepare_weight(tg), be->prepare_weight(tu), be->prepare_weight(td);
    Graph g;
    const int ix = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
    const int inw = g.add_tensor(Tensor::contiguous(DType::F32, {K}, nw.data()));
    const int ixn = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, xn.data()));
    const int ig = g.add_tensor(tg), iu = g.add_tensor(tu), id = g.add_tensor(td);
    const int igt = g.add_tensor(Tensor::contiguous(DType::F32, {F, M}, gt.data()));
    const int iut = g.add_tensor(Tensor::contiguous(DType::F32, {F, M}, ut.data()));
    const int ih = g.add_tensor(Tensor::contiguous(DType::F32, {F, M}, h.data()));
    const int idt = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, d.data()));
    const int iy = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, r.y.data()));
    const int itop = g.add_tensor(Tensor::contiguous(DType::I32, {2, M}, r.top.data()));
    const int ik = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nkv, M}, k.data()));
    const int iv = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nkv, M}, v.data()));
    const int iq = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nh, M}, q.data()));
    const int io = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nh, M}, r.attn.data()));
    Node rn = node(Op::RmsNorm, ixn, ix, inw);
    rn.f[0] = 1e-5f;
    g.add_node(rn);
    g.add_node(node(Op::MatMul, igt, ig, ixn));
    g.add_node(node(Op::MatMul, iut, iu, ixn));
    g.add_node(node(Op::SwiGlu, ih, igt, iut));  // fused into the two products (M > 1)
    g.add_node(node(Op::MatMul, idt, id, ih));
    g.add_node(node(Op::Add, iy, idt, ix));
    g.add_node(node(Op::TopK, itop, iy));  // the reference's formula, run here
    test::PagedStep ps;
    test::add_paged_inputs(g, kv, 0, seq, 2, M, ps);
    g.add_node(test::kv_write_node(ps, false, ik));
    g.add_node(test::kv_write_node(ps, true, iv));
    g.add_node(test::attention_node(ps, iq, io, 0.125f));
    for (const Node& n : g.nodes()) EXPECT_TRUE(be->supports(g, n).supported) << op_name(n.op);
    for (int rep = 0; rep < 2; ++rep) {  // twice: the second call reuses the backend's state
      if (validated)
        be->execute_validated(g, 0, g.nodes().size());
      else
        be->execute(g, 0, g.nodes().size());
    }
    EXPECT_EQ(kv.length(seq), 2);  // the engine's to set
    const uint16_t* kr = kv.k_row(0, seq, 3);
    r.krow.assign(kr, kr + hd * nkv);
    return r;
  };
  const Result plain = go(false), fast = go(true);
  EXPECT_EQ(plain.y, fast.y);
  EXPECT_EQ(plain.attn, fast.attn);
  EXPECT_EQ(plain.top, fast.top);
  EXPECT_EQ(plain.krow, fast.krow);
  for (float f : fast.attn) ASSERT_TRUE(std::isfinite(f));

  // Run-time checks: execute() and the scheduler make them; ids are the kernel's, so
  // execute_validated() keeps those.
  KvCache kv(cfg);
  const KvCache::SeqId seq = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(seq, 4));
  std::vector<float> k = k0, v = v0, q = q0, out(q.size());
  std::shared_ptr<Backend> shared(std::move(be2));
  Scheduler sched({shared});
  auto expect_error = [&](Graph& g, const char* what, bool ids = false) {
    for (int how = 0; how < (ids ? 3 : 2); ++how) {
      try {
        if (how == 0) shared->execute(g, 0, g.nodes().size());
        if (how == 1) sched.run(g);
        if (how == 2) shared->execute_validated(g, 0, g.nodes().size());
        ADD_FAILURE() << "expected tessera::Error containing '" << what << "' (" << how << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    }
  };
  test::PagedStep ps;  // the graphs below share its inputs (the slots and table data)
  auto kv_graph = [&](Graph& g, bool attention) {
    const int ik = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nkv, M}, k.data()));
    const int iv = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nkv, M}, v.data()));
    const int iq = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nh, M}, q.data()));
    const int io = g.add_tensor(Tensor::contiguous(DType::F32, {hd, nh, M}, out.data()));
    test::add_paged_inputs(g, kv, 0, seq, 0, M, ps);
    g.add_node(attention ? test::attention_node(ps, iq, io, 0.125f) : test::kv_write_node(ps, false, ik));
    (void)iv;
  };
  {
    Graph g;
    kv_graph(g, false);
    ps.data.slots[2] = 8 * 4;  // 8 pages of 4
    expect_error(g, "outside the storage's [0, 32)");
  }
  {
    Graph g;
    kv_graph(g, true);
    ps.data.table[kSeqTableHeader] = 8;
    expect_error(g, "outside the storage's [0, 8)");
  }
  {
    Graph g;
    kv_graph(g, true);
    ps.data.table[kSeqPos0] = -1;
    expect_error(g, "negative");
  }
  {
    std::vector<float> table(size_t(16 * 3), 1.0f), rows(size_t(16 * 2));
    std::vector<int32_t> ids = {0, 3};
    Graph g;
    const int it = g.add_tensor(Tensor::contiguous(DType::F32, {16, 3}, table.data()));
    const int ii = g.add_tensor(Tensor::contiguous(DType::I32, {2}, ids.data()));
    const int ir = g.add_tensor(Tensor::contiguous(DType::F32, {16, 2}, rows.data()));
    g.add_node(node(Op::GetRows, ir, it, ii));
    expect_error(g, "out of range", true);
    Graph h;
    const int ix = h.add_tensor(Tensor::contiguous(DType::F32, {16}, nullptr));
    const int iy = h.add_tensor(Tensor::contiguous(DType::F32, {16}, rows.data()));
    h.add_node(node(Op::Silu, iy, ix));
    expect_error(h, "has no data");
  }
}

TEST_F(Avx512, UnsupportedIsDeclinedWithReason) {
  std::vector<float> x(8), y(8);
  std::vector<int32_t> ids(1);
  Graph g;
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {8}, x.data()));
  const int ti = g.add_tensor(Tensor::contiguous(DType::I32, {1}, ids.data()));
  const int ty = g.add_tensor(Tensor::contiguous(DType::F32, {8}, y.data()));
  g.add_node(node(Op::Add, ty, tx, ti));  // I32 operand: breaks the op schema
  EXPECT_NE(op_schema::check(g, g.nodes()[0]).find("src1 must be f32"), std::string::npos);
  try {
    be1->execute(g, 0, 1);
    ADD_FAILURE() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_avx512: node 0 (add): add: src1 must be f32, got i32[1]"), std::string::npos)
        << e.what();
  }

  // What the backend itself declines is a valid node its kernels do not take (a
  // weighted sum over more than 64 experts); the scheduler runs it on the next backend.
  const int64_t N = 4, k = 65;
  std::vector<float> e = randn(size_t(N * k), 7), w = randn(size_t(k), 8);
  std::vector<float> out(static_cast<size_t>(N)), want(static_cast<size_t>(N));
  auto moe = [&](Graph& h, float* dst) {
    const int te = h.add_tensor(Tensor::contiguous(DType::F32, {N, k, 1}, e.data()));
    const int tw = h.add_tensor(Tensor::contiguous(DType::F32, {k, 1}, w.data()));
    const int td = h.add_tensor(Tensor::contiguous(DType::F32, {N, 1}, dst));
    h.add_node(node(Op::MoeCombine, td, te, tw));
  };
  Graph h, r;
  moe(h, out.data());
  moe(r, want.data());
  EXPECT_TRUE(op_schema::check(h, h.nodes()[0]).empty());
  const OpSupport s = be1->supports(h, h.nodes()[0]);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("64 experts"), std::string::npos) << s.reason;
  Scheduler sched({cpu_avx512::make_backend(nullptr), cpu_scalar::make_backend(nullptr)});
  EXPECT_EQ(sched.place(h), std::vector<int>{1});
  sched.run(h);
  ref->execute(r, 0, 1);
  EXPECT_EQ(out, want);
}

// --- Elementwise ops -------------------------------------------------------------

namespace {

// Runs a one-node graph with the given F32 inputs on both backends; returns NMSE.
struct ElemCase {
  Op op;
  int64_t K, rows;
  bool with_src1;
  int64_t src1_rows;  // for Mul/Add broadcast
  float f0 = 0.0f;
};

}  // namespace

TEST_F(Avx512, ElementwiseOpsAgree) {
  const std::vector<ElemCase> cases = {
      {Op::RmsNorm, 256, 5, true, 1, 1e-5f}, {Op::RmsNorm, 37, 3, false, 0, 1e-6f}, {Op::Softmax, 1024, 3, false, 0},
      {Op::Softmax, 17, 4, false, 0},        {Op::Silu, 1000, 2, false, 0},         {Op::SwiGlu, 5632, 3, true, 3},
      {Op::SwiGlu, 9, 1, true, 1},           {Op::Add, 256, 7, true, 7},            {Op::Add, 33, 4, true, 1},
      {Op::Mul, 256, 7, true, 7},            {Op::Mul, 256, 7, true, 1},            {Op::Mul, 19, 2, true, 1},
      // Above the pool-split thresholds: split by elements (one long row) or by rows.
      {Op::Add, 40001, 1, true, 1},          {Op::Mul, 2048, 33, true, 33},         {Op::Mul, 2048, 33, true, 1},
      {Op::Silu, 5003, 1, false, 0},         {Op::SwiGlu, 2048, 17, true, 17},      {Op::RmsNorm, 2048, 33, true, 1, 1e-6f},
      {Op::Softmax, 1000, 9, false, 0},
  };
  uint32_t seed = 100;
  for (const ElemCase& c : cases) {
    SCOPED_TRACE(std::string(op_name(c.op)) + " K=" + std::to_string(c.K) + " rows=" + std::to_string(c.rows));
    std::vector<float> a = randn(size_t(c.K * c.rows), seed++, c.op == Op::Softmax ? 4.0f : 2.0f);
    std::vector<float> b = randn(size_t(c.K * std::max<int64_t>(1, c.src1_rows)), seed++);
    Out r(a.size()), o1(a.size()), o2(a.size());
    for (int which = 0; which < 3; ++which) {
      Backend& be = which == 0 ? *ref : which == 1 ? *be1 : *be2;
      Out& o = which == 0 ? r : which == 1 ? o1 : o2;
      Graph g;
      const int ta = g.add_tensor(Tensor::contiguous(DType::F32, {c.K, c.rows}, a.data()));
      int tb = -1;
      if (c.with_src1)
        tb = c.op == Op::RmsNorm ? g.add_tensor(Tensor::contiguous(DType::F32, {c.K}, b.data()))
                                 : g.add_tensor(Tensor::contiguous(DType::F32, {c.K, c.src1_rows}, b.data()));
      const int to = g.add_tensor(Tensor::contiguous(DType::F32, {c.K, c.rows}, o.data()));
      Node n = node(c.op, to, ta, tb);
      n.f[0] = c.f0;
      g.add_node(n);
      run(be, g);
    }
    const double e = tessera::nmse(r.data(), o1.data(), r.n);
    EXPECT_LE(e, 1e-7) << "nmse " << e;
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), sizeof(float) * r.n), 0);
    // The exp-based ops do the reference's float operations with libm's expf (exp16).
    if (c.op == Op::Silu || c.op == Op::SwiGlu || c.op == Op::Softmax) {
      EXPECT_EQ(std::memcmp(r.data(), o1.data(), sizeof(float) * r.n), 0) << "not bit for bit";
    }
    EXPECT_TRUE(o1.guard_ok());
    EXPECT_TRUE(o2.guard_ok());
  }
}

// exp16 must equal the C library's expf bit for bit (kernels_exp.h). By default every
// 331st bit pattern over all floats (13 million: both signs, subnormals, the
// overflow/underflow edges, inf and NaN) plus the edges themselves;
// TESSERA_EXP_EVERY_FLOAT=1 checks all 2^32 (about 20 s).
TEST_F(Avx512, ExpMatchesLibmBitForBit) {
  const char* every = std::getenv("TESSERA_EXP_EVERY_FLOAT");
  const uint64_t step = every && *every == '1' ? 1 : 331;
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<float> x, y;
  size_t bad = 0, checked = 0;
  auto check = [&] {
    y.assign(x.size() + 3, 7.0f);
    cpu_avx512::kern::exp_row(x.data(), y.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float r = std::exp(x[i]);
      if (std::isnan(r) ? !std::isnan(y[i]) : std::memcmp(&r, &y[i], 4) != 0) {
        if (++bad <= 5) ADD_FAILURE() << "expf(" << x[i] << "): libm " << r << ", exp16 " << y[i];
      }
    }
    for (size_t i = x.size(); i < y.size(); ++i) EXPECT_EQ(y[i], 7.0f) << "wrote past the end";
    checked += x.size();
    x.clear();
  };
  for (float f : {0.0f, -0.0f, 88.0f, -88.0f, 0x1.62e42ep6f, 0x1.62e430p6f, -0x1.9fe368p6f, -0x1.9fe36ap6f,
                  -0x1.9d1d9ep6f, -0x1.9d1da0p6f, -103.0f, 87.99999f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f})
    x.push_back(f);
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += step) {
    const uint32_t u = uint32_t(b);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
    if (x.size() == kChunk) check();
  }
  check();
  EXPECT_EQ(bad, 0u) << "of " << checked;
}

TEST_F(Avx512, ArgmaxFirstMaximum) {
  const int64_t V = 1003, n = 4;
  std::vector<float> x = randn(size_t(V * n), 5);
  x[size_t(1 * V + 17)] = 100.0f;
  x[size_t(1 * V + 900)] = 100.0f;  // tie: first wins
  x[size_t(2 * V + V - 1)] = 50.0f;
  std::vector<int32_t> r(n + 4, -7), a(n + 4, -7);
  for (Backend* be : {ref.get(), be1.get()}) {
    Graph g;
    const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {V, n}, x.data()));
    const int to = g.add_tensor(Tensor::contiguous(DType::I32, {n}, (be == ref.get() ? r : a).data()));
    g.add_node(node(Op::Argmax, to, tx));
    run(*be, g);
  }
  EXPECT_EQ(a, r);
  EXPECT_EQ(a[1], 17);
  EXPECT_EQ(a[2], V - 1);
  EXPECT_EQ(a[n], -7);
}

TEST_F(Avx512, GetRowsAndRopeAgree) {
  const int64_t K = 256, V = 11;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K,
                  DType::Q3_K, DType::IQ4_XS}) {
    std::vector<float> tf = randn(size_t(K * V), 9);
    std::vector<uint8_t> tab = t == DType::F32 ? std::vector<uint8_t>(reinterpret_cast<uint8_t*>(tf.data()),
                                                                      reinterpret_cast<uint8_t*>(tf.data() + tf.size()))
                                               : quantize_matrix(t, tf, K, V);
    for (int64_t cnt : {int64_t(4), int64_t(160)}) {  // 160 rows: split over the pool
      std::vector<int32_t> ids = {3, 0, 10, 3};
      for (int64_t i = 4; i < cnt; ++i) ids.push_back(int32_t((i * 7) % V));
      Out r(size_t(K * cnt)), a(size_t(K * cnt));
      for (Backend* be : {ref.get(), be2.get()}) {
        Graph g;
        const int tt = g.add_tensor(Tensor::contiguous(t, {K, V}, tab.data()));
        const int ti = g.add_tensor(Tensor::contiguous(DType::I32, {cnt}, ids.data()));
        const int to = g.add_tensor(Tensor::contiguous(DType::F32, {K, cnt}, (be == ref.get() ? r : a).data()));
        g.add_node(node(Op::GetRows, to, tt, ti));
        run(*be, g);
      }
      EXPECT_EQ(std::memcmp(a.data(), r.data(), sizeof(float) * r.n), 0) << dtype_name(t) << " rows " << cnt;
      EXPECT_TRUE(a.guard_ok());
    }
  }
  for (int variant = 0; variant < 4; ++variant) {
    const int mode = variant % 2 ? int(kRopeNeox) : int(kRopeNormal);
    const bool long_prefill = variant >= 2;  // above the pool-split threshold
    const int64_t hd = 64, heads = long_prefill ? 32 : 4, T = long_prefill ? 300 : 5;
    std::vector<float> x = randn(size_t(hd * heads * T), 11);
    std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
    if (long_prefill) {
      pos.resize(size_t(T));
      for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t * 7 + 3);
    }
    Out r(x.size()), a(x.size());
    for (Backend* be : {ref.get(), be2.get()}) {
      Graph g;
      const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, x.data()));
      const int tp = g.add_tensor(Tensor::contiguous(DType::I32, {T}, pos.data()));
      const int to = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, (be == ref.get() ? r : a).data()));
      Node n = node(Op::Rope, to, tx, tp);
      n.i[0] = int32_t(hd);
      n.i[1] = mode;
      n.f[0] = 10000.0f;
      n.f[1] = 1.0f;
      g.add_node(n);
      run(*be, g);
    }
    EXPECT_EQ(std::memcmp(r.data(), a.data(), sizeof(float) * r.n), 0) << "rope variant " << variant;
    EXPECT_TRUE(a.guard_ok());
  }
}

// Rope with frequency factors (src2: Llama 3.1's rope_freqs, pair i's angle divided by
// ff[i]) runs here, normal and NeoX, full and partial rotation, one token and a prefill
// split over the pool, bit for bit as the reference.
TEST_F(Avx512, RopeWithFrequencyFactorsMatchesReferenceBitForBit) {
  for (int variant = 0; variant < 8; ++variant) {
    const int mode = variant % 2 ? int(kRopeNeox) : int(kRopeNormal);
    const bool partial = (variant / 2) % 2, long_prefill = variant >= 4;
    const int64_t hd = 128, heads = long_prefill ? 32 : 4, T = long_prefill ? 300 : 3;
    const int32_t n_dims = partial ? 64 : 128;
    std::vector<float> x = randn(size_t(hd * heads * T), 40 + variant);
    std::vector<int32_t> pos(static_cast<size_t>(T), 0);
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t * 13 + 5);
    std::vector<float> ff(size_t(n_dims / 2));  // Llama 3.1's shape: 1 for high frequencies, up to 8 for low
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 7.0f * float(i) / float(ff.size() - 1);
    Out r(x.size()), a(x.size());
    for (Backend* be : {ref.get(), be2.get()}) {
      Graph g;
      const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, x.data()));
      const int tp = g.add_tensor(Tensor::contiguous(DType::I32, {T}, pos.data()));
      const int tf = g.add_tensor(Tensor::contiguous(DType::F32, {n_dims / 2}, ff.data()));
      const int to = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, (be == ref.get() ? r : a).data()));
      Node n = node(Op::Rope, to, tx, tp);
      n.src[2] = tf;
      n.i[0] = n_dims;
      n.i[1] = mode;
      n.f[0] = 500000.0f;
      n.f[1] = variant == 3 ? 0.25f : 1.0f;
      g.add_node(n);
      run(*be, g);  // asserts that this backend supports it
    }
    EXPECT_EQ(std::memcmp(r.data(), a.data(), sizeof(float) * r.n), 0) << "rope variant " << variant;
    EXPECT_TRUE(a.guard_ok());
  }
}

// KvWrite converts exactly like the reference (round to nearest even, F16 subnormals,
// overflow to inf, every NaN to the quiet NaN with its sign), one token and a prefill
// long enough to be split over the pool.
TEST_F(Avx512, KvWriteMatchesReferenceBitForBit) {
  const int64_t hd = 64, n_kv = 4;
  for (int64_t T : {int64_t(1), int64_t(200)}) {
    std::vector<float> k = randn(size_t(hd * n_kv * T), 41, 3.0f), v = randn(size_t(hd * n_kv * T), 42, 3.0f);
    const float specials[] = {65504.0f, 65520.0f, -70000.0f, 1e-7f, -3e-8f, 6.1e-5f, 0.0f, -0.0f,
                              INFINITY, -INFINITY, std::nanf(""), -std::nanf("0x123")};
    for (size_t i = 0; i < std::size(specials); ++i) k[i * 5] = specials[i], v[v.size() - 1 - i] = specials[i];
    KvCacheConfig cfg{2, int(n_kv), int(hd), 16, 256, {}};
    KvCache kr(cfg), ka(cfg);
    const KvCache::SeqId sr = kr.create_sequence(), sa = ka.create_sequence();
    ASSERT_TRUE(kr.reserve(sr, 3 + T));
    ASSERT_TRUE(ka.reserve(sa, 3 + T));
    for (auto [be, kv, seq] : {std::tuple<Backend*, KvCache*, KvCache::SeqId>{ref.get(), &kr, sr}, {be2.get(), &ka, sa}}) {
      Graph g;
      const int tk = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, k.data()));
      const int tv = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, v.data()));
      test::PagedStep ps;
      test::add_paged_inputs(g, *kv, 1, seq, 3, T, ps);
      g.add_node(test::kv_write_node(ps, false, tk));
      g.add_node(test::kv_write_node(ps, true, tv));
      run(*be, g);
    }
    // The kernels leave the length to the caller (the engine sets it after the step).
    EXPECT_EQ(ka.length(sa), 0);
    EXPECT_EQ(kr.length(sr), 0);
    for (int64_t p = 3; p < 3 + T; ++p) {
      EXPECT_EQ(std::memcmp(kr.k_row(1, sr, p), ka.k_row(1, sa, p), size_t(hd * n_kv) * 2), 0) << "K at " << p;
      EXPECT_EQ(std::memcmp(kr.v_row(1, sr, p), ka.v_row(1, sa, p), size_t(hd * n_kv) * 2), 0) << "V at " << p;
    }
  }
}

// --- KvWrite + Attention over the paged cache ---------------------------------------

namespace {

struct KvRun {
  KvCache kv;
  KvCache::SeqId seq;
  explicit KvRun(const KvCacheConfig& c) : kv(c), seq(kv.create_sequence()) {}

  // KvWrite n tokens at p0 then Attention of q over them.
  Out step(Backend& be, int layer, int64_t p0, int64_t n, int64_t hd, int64_t n_head, int64_t n_kv,
           std::vector<float>& k, std::vector<float>& v, std::vector<float>& q, float scale) {
    EXPECT_TRUE(kv.reserve(seq, p0 + n));
    Out out(size_t(hd * n_head * n));
    Graph g;
    const int tk = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, n}, k.data()));
    const int tv = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, n}, v.data()));
    const int tq = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, n}, q.data()));
    const int to = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, n}, out.data()));
    test::PagedStep ps;
    test::add_paged_inputs(g, kv, layer, seq, p0, n, ps);
    g.add_node(test::kv_write_node(ps, false, tk));
    g.add_node(test::kv_write_node(ps, true, tv));
    g.add_node(test::attention_node(ps, tq, to, scale));
    run(be, g);
    EXPECT_EQ(kv.length(seq), p0);  // the kernels leave the length to the caller
    kv.set_length(seq, p0 + n);     // as the engine does after the step
    return out;
  }
};

}  // namespace

TEST_F(Avx512, AttentionAgreesPrefillThenDecode) {
  struct C { int64_t hd, n_head, n_kv, page, prefill; };
  for (const C& c : {C{64, 4, 2, 16, 33}, C{128, 8, 8, 4, 7}, C{40, 6, 2, 16, 17}}) {
    SCOPED_TRACE("hd=" + std::to_string(c.hd) + " heads=" + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv));
    KvCacheConfig cfg{2, int(c.n_kv), int(c.hd), c.page == 4 ? 4 : 16, 64, {}};
    KvRun r(cfg), a1(cfg), a2(cfg);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    uint32_t seed = 300;
    int64_t p0 = 0;
    for (int64_t n : {c.prefill, int64_t(1), int64_t(1)}) {
      std::vector<float> k = randn(size_t(c.hd * c.n_kv * n), seed++), v = randn(size_t(c.hd * c.n_kv * n), seed++);
      std::vector<float> q = randn(size_t(c.hd * c.n_head * n), seed++, 2.0f);
      Out o = r.step(*ref, 1, p0, n, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      Out x1 = a1.step(*be1, 1, p0, n, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      Out x2 = a2.step(*be2, 1, p0, n, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      const double e = tessera::nmse(o.data(), x1.data(), o.n);
      EXPECT_LE(e, 1e-6) << "nmse " << e << " at p0=" << p0;
      EXPECT_EQ(std::memcmp(x1.data(), x2.data(), sizeof(float) * o.n), 0);
      EXPECT_TRUE(x1.guard_ok());
      EXPECT_TRUE(x2.guard_ok());
      p0 += n;
    }
    for (int64_t j = 0; j < p0; ++j)
      EXPECT_EQ(std::memcmp(r.kv.k_row(1, r.seq, j), a1.kv.k_row(1, a1.seq, j), size_t(c.hd * c.n_kv) * 2), 0);
  }
}

// The tile kernel (query rows = tokens x heads, across the vector lanes) must give
// each row exactly the single-head kernel's result: every row count up to 16 (lanes of
// 16 rows, or 8 or 4 rows x 2 or 4 positions), rows whose lengths differ (a prefill's
// consecutive tokens) and end inside or at the edge of a block of positions, head
// sizes with a lane path (64, 128) and a fallback size (80). Besides random keys:
// keys that grow with the position (a row whose score rises gets a new maximum at
// every position, one whose score falls never after the first) and equal keys (every
// score ties with the maximum), for the running maximum and its new-maximum steps;
// each case also with attention sinks (above every score, below, and near).
TEST_F(Avx512, AttentionTileEqualsTheSingleHeadKernelBitForBit) {
  enum class Keys { Random, Growing, Equal };
  for (Keys keys : {Keys::Random, Keys::Growing, Keys::Equal})
  for (int64_t hd : {int64_t(64), int64_t(128), int64_t(80)}) {
    SCOPED_TRACE("keys=" + std::to_string(int(keys)) + " hd=" + std::to_string(hd));
    // Cache rows of two KV heads; the kernels read the second (off = hd).
    const int64_t L = 200, off = hd;
    std::vector<uint16_t> k(size_t(L * 2 * hd)), v(size_t(L * 2 * hd));
    std::vector<float> kf = randn(k.size(), 21, 1.5f), vf = randn(v.size(), 22);
    for (size_t i = 0; i < k.size(); ++i) {
      const size_t row = i / size_t(2 * hd), col = i % size_t(2 * hd);
      if (keys == Keys::Growing) kf[i] = kf[col] * (1.0f + 0.05f * float(row));
      if (keys == Keys::Equal) kf[i] = kf[col];
      k[i] = quant::fp32_to_fp16(kf[i]), v[i] = quant::fp32_to_fp16(vf[i]);
    }
    std::vector<const uint16_t*> krows(static_cast<size_t>(L)), vrows(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) krows[size_t(j)] = k.data() + j * 2 * hd, vrows[size_t(j)] = v.data() + j * 2 * hd;
    const std::vector<float> q = randn(size_t(hd * 16), 23, 2.0f);
    const float scale = 1.0f / std::sqrt(float(hd));
    // (rows, heads per token, first row's length): tokens of `heads` rows each, one
    // position longer per token.
    struct C { int rows, heads; int64_t len0; };
    for (C c : {C{1, 1, 1}, C{1, 1, 53}, C{16, 8, 1}, C{16, 8, 64}, C{16, 8, 127}, C{16, 4, 61}, C{14, 7, 100},
                C{15, 3, 130}, C{16, 1, 50}, C{16, 16, 185}, C{12, 12, 64}, C{5, 5, 17}, C{8, 8, 199}, C{8, 4, 63},
                C{6, 2, 126}, C{4, 4, 16}, C{4, 2, 63}, C{3, 1, 129}, C{2, 2, 200}}) {
      SCOPED_TRACE("rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) + " len0=" +
                   std::to_string(c.len0));
      std::vector<const float*> qs;
      std::vector<float*> outs;
      std::vector<int64_t> len;
      std::vector<float> tile(size_t(hd * c.rows)), single(size_t(hd * c.rows));
      for (int r = 0; r < c.rows; ++r) {
        qs.push_back(q.data() + r * hd);
        outs.push_back(tile.data() + r * hd);
        len.push_back(std::min(L, c.len0 + r / c.heads));
      }
      // Without sinks, and with sinks above every score (a new maximum), below, and random.
      std::vector<float> sinks = randn(size_t(c.rows), 24, 3.0f);
      for (int r = 0; r < c.rows; ++r) sinks[size_t(r)] += r % 3 == 0 ? 40.0f : r % 3 == 1 ? -20.0f : 0.0f;
      for (const float* sk : {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())}) {
        SCOPED_TRACE(sk ? "sinks" : "no sinks");
        cpu_avx512::kern::attention_tile(qs.data(), outs.data(), len.data(), c.rows, hd, krows.data(), vrows.data(),
                                         off, scale, sk);
        for (int r = 0; r < c.rows; ++r)
          cpu_avx512::kern::attention_item(qs[size_t(r)], hd, krows.data(), vrows.data(), off, len[size_t(r)], scale,
                                           single.data() + r * hd, sk ? sk + r : nullptr);
        for (int r = 0; r < c.rows; ++r)
          EXPECT_EQ(std::memcmp(tile.data() + r * hd, single.data() + r * hd, sizeof(float) * size_t(hd)), 0)
              << "row " << r;
      }
    }
  }
}

// A long prefill through the backend: 300 tokens from position 0, then 300 after
// them, then a decode step; GQA 8:1 and 4:2 (and 7:1, whose tiles have 14 rows), head
// sizes 64 and 128, pages of 4 and 16 positions. Every output equals the single-head
// kernel over the same cache rows bit for bit (so no path of the op changes a
// result), one and two threads agree bit for bit, and cpu_scalar (which sums the dot
// products in another order) agrees to its NMSE limit.
TEST_F(Avx512, AttentionLongPrefillEqualsTheSingleHeadKernelBitForBit) {
  struct C { int64_t hd, n_head, n_kv, page; };
  for (const C& c : {C{64, 8, 1, 16}, C{64, 4, 2, 4}, C{128, 8, 1, 4}, C{128, 4, 2, 16}, C{64, 7, 1, 16}}) {
    SCOPED_TRACE("hd=" + std::to_string(c.hd) + " heads=" + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) +
                 " page=" + std::to_string(c.page));
    KvCacheConfig cfg{2, int(c.n_kv), int(c.hd), int(c.page), int(601 / c.page + 1), {}};
    KvRun r(cfg), a1(cfg), a2(cfg);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const int64_t group = c.n_head / c.n_kv;
    uint32_t seed = 700;
    for (auto [p0, T] : {std::pair<int64_t, int64_t>{0, 300}, {300, 300}, {600, 1}}) {
      SCOPED_TRACE("p0=" + std::to_string(p0));
      std::vector<float> k = randn(size_t(c.hd * c.n_kv * T), seed++), v = randn(size_t(c.hd * c.n_kv * T), seed++);
      std::vector<float> q = randn(size_t(c.hd * c.n_head * T), seed++, 2.0f);
      Out o = r.step(*ref, 1, p0, T, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      Out x1 = a1.step(*be1, 1, p0, T, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      Out x2 = a2.step(*be2, 1, p0, T, c.hd, c.n_head, c.n_kv, k, v, q, scale);
      const double e = tessera::nmse(o.data(), x1.data(), o.n);
      EXPECT_LE(e, 1e-6) << "nmse " << e;
      EXPECT_EQ(std::memcmp(x1.data(), x2.data(), sizeof(float) * o.n), 0);
      EXPECT_TRUE(x1.guard_ok());
      EXPECT_TRUE(x2.guard_ok());
      std::vector<const uint16_t*> krows(size_t(p0 + T)), vrows(size_t(p0 + T));
      a1.kv.rows(1, a1.seq, 0, 0, p0 + T, krows.data());
      a1.kv.rows(1, a1.seq, 1, 0, p0 + T, vrows.data());
      std::vector<float> single(size_t(c.hd));
      int64_t differ = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < c.n_head; ++h) {
          const size_t at = size_t((t * c.n_head + h) * c.hd);
          cpu_avx512::kern::attention_item(q.data() + at, c.hd, krows.data(), vrows.data(), h / group * c.hd,
                                           p0 + t + 1, scale, single.data());
          differ += std::memcmp(single.data(), x1.data() + at, sizeof(float) * size_t(c.hd)) != 0;
        }
      EXPECT_EQ(differ, 0) << "of " << T * c.n_head << " (token, head) outputs";
    }
  }
}

// --- Mixture of experts: MatMulId ---------------------------------------------------

namespace {

// dst [N, k, n] = W[ids] . x over expert weights [K, N, E]; x is [K, b, n].
Out matmul_id(Backend& be, DType wt, std::vector<uint8_t>& w, int64_t K, int64_t N, int64_t E, std::vector<float>& x,
              int64_t b, std::vector<int32_t>& ids, int64_t k, int64_t n, bool prepare = false) {
  Out out(size_t(N * k * n));
  Graph g;
  Tensor wt_t = Tensor::contiguous(wt, {K, N, E}, w.data());
  if (prepare) be.prepare_weight(wt_t);
  const int tw = g.add_tensor(wt_t);
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, b, n}, x.data()));
  const int ti = g.add_tensor(Tensor::contiguous(DType::I32, {k, n}, ids.data()));
  const int to = g.add_tensor(Tensor::contiguous(DType::F32, {N, k, n}, out.data()));
  Node nd = node(Op::MatMulId, to, tw, tx);
  nd.src[2] = ti;
  g.add_node(nd);
  run(be, g);
  return out;
}

std::vector<uint8_t> weight_bytes(DType t, const std::vector<float>& wf, int64_t K, int64_t rows) {
  if (t == DType::F32)
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(wf.data()),
                                reinterpret_cast<const uint8_t*>(wf.data() + wf.size()));
  return quantize_matrix(t, wf, K, rows);
}

// k distinct experts per token (a rotating pattern with a hot expert 0 on odd tokens,
// so some experts get many tokens and some none), or repeats when `dups`.
std::vector<int32_t> expert_ids(int64_t E, int64_t k, int64_t n, uint32_t seed, bool dups = false) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(k * n));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (t % 2) std::iter_swap(perm.begin(), std::find(perm.begin(), perm.end(), 0));
    for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = dups ? perm[size_t(j % 2)] : perm[size_t(j)];
  }
  return ids;
}

struct MoeShape {
  int64_t K, N, E, k, n;
  bool per_slot, dups;
};

}  // namespace

class Avx512MatMulId : public Avx512, public ::testing::WithParamInterface<MatMulCase> {};

// Every expert dtype, decode (n = 1) and prefill (many tokens per expert), x shared
// or per slot, odd expert counts and row counts (partial 16-row tiles), repeated ids;
// plain and repacked weights, 1 and 2 threads.
TEST_P(Avx512MatMulId, AgreesWithScalarAndThreadCountIndependent) {
  const DType wt = GetParam().wt;
  const int64_t K = GetParam().Ks.back();
  const std::vector<MoeShape> shapes = {
      {K, 33, 4, 2, 1, false, false}, {K, 40, 8, 4, 1, true, false},  {K, 33, 5, 3, 37, false, false},
      {K, 17, 7, 4, 23, true, false}, {K, 48, 3, 2, 9, false, true},   {K, 1, 2, 1, 3, false, false},
      {K, 20, 2, 2, 40, false, false},  // 40 columns per expert: tiles repacked on the fly, K-quants too
  };
  uint32_t seed = 500;
  for (const MoeShape& m : shapes) {
    SCOPED_TRACE(std::string(dtype_name(wt)) + " K=" + std::to_string(m.K) + " N=" + std::to_string(m.N) +
                 " E=" + std::to_string(m.E) + " k=" + std::to_string(m.k) + " n=" + std::to_string(m.n) +
                 (m.per_slot ? " x per slot" : " x shared") + (m.dups ? " repeated ids" : ""));
    const int64_t b = m.per_slot ? m.k : 1;
    std::vector<uint8_t> w = weight_bytes(wt, randn(size_t(m.K * m.N * m.E), seed++, 0.5f), m.K, m.N * m.E);
    std::vector<float> x = randn(size_t(m.K * b * m.n), seed++);
    std::vector<int32_t> ids = expert_ids(m.E, m.k, m.n, seed++, m.dups);
    Out r = matmul_id(*ref, wt, w, m.K, m.N, m.E, x, b, ids, m.k, m.n);
    const size_t cnt = r.n;
    // Plain weights (an expert used by enough columns has its tiles repacked on the fly,
    // as streamed experts do), weights repacked at load, and a backend that never
    // repacks (row kernels only): all three compute the same bits.
    std::vector<Out> outs;
    for (int variant : {0, 1, 2}) {
      const bool prepare = variant == 1, repack = variant != 2;
      SCOPED_TRACE(variant == 0 ? "plain" : variant == 1 ? "repacked at load" : "never repacked");
      auto be1_fresh = cpu_avx512::make_backend(nullptr, repack);
      auto be2_fresh = cpu_avx512::make_backend(pool.get(), repack);
      Out a = matmul_id(*be1_fresh, wt, w, m.K, m.N, m.E, x, b, ids, m.k, m.n, prepare);
      Out c = matmul_id(*be2_fresh, wt, w, m.K, m.N, m.E, x, b, ids, m.k, m.n, prepare);
      const double e = tessera::nmse(r.data(), a.data(), cnt);
      EXPECT_LE(e, 1e-6) << "nmse " << e;
      if (wt == DType::Q4_0 || wt == DType::Q8_0) {
        EXPECT_EQ(std::memcmp(a.data(), r.data(), sizeof(float) * cnt), 0) << "not bit-identical to the reference";
      }
      EXPECT_EQ(std::memcmp(a.data(), c.data(), sizeof(float) * cnt), 0) << "1 vs 2 threads differ";
      EXPECT_TRUE(a.guard_ok());
      EXPECT_TRUE(c.guard_ok());
      if (!outs.empty()) {
        EXPECT_EQ(std::memcmp(a.data(), outs[0].data(), sizeof(float) * cnt), 0) << "differs from plain weights";
      }
      outs.push_back(std::move(a));
    }
    // Each slot equals the dense MatMul of its expert (plain weights: the same kernels).
    if (m.n <= 9) {
      Out a = matmul_id(*be2, wt, w, m.K, m.N, m.E, x, b, ids, m.k, m.n);
      const size_t eb = row_bytes(wt, m.K) * size_t(m.N);
      for (int64_t t = 0; t < m.n; ++t)
        for (int64_t j = 0; j < m.k; ++j) {
          const int32_t ex = ids[size_t(t * m.k + j)];
          std::vector<uint8_t> we(w.begin() + ptrdiff_t(eb * size_t(ex)), w.begin() + ptrdiff_t(eb * size_t(ex + 1)));
          std::vector<float> xc(x.begin() + (t * b + j % b) * m.K, x.begin() + (t * b + j % b + 1) * m.K);
          Out d = matmul(*be2, wt, we, m.K, m.N, xc, 1);
          EXPECT_EQ(std::memcmp(d.data(), a.data() + (t * m.k + j) * m.N, sizeof(float) * size_t(m.N)), 0)
              << "slot " << j << " of token " << t;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllWeightTypes, Avx512MatMulId,
    ::testing::Values(MatMulCase{DType::F32, {96}}, MatMulCase{DType::F16, {96}}, MatMulCase{DType::BF16, {96}},
                      MatMulCase{DType::Q8_0, {512}}, MatMulCase{DType::Q4_0, {512}}, MatMulCase{DType::Q4_K, {512}},
                      MatMulCase{DType::Q5_K, {512}}, MatMulCase{DType::Q6_K, {512}},
                      MatMulCase{DType::Q4_1, {160}}, MatMulCase{DType::Q5_0, {160}}, MatMulCase{DType::Q5_1, {160}},
                      MatMulCase{DType::IQ4_NL, {160}}, MatMulCase{DType::MXFP4, {256}},
                      MatMulCase{DType::Q2_K, {512}}, MatMulCase{DType::Q3_K, {512}}, MatMulCase{DType::IQ4_XS, {512}}),
    [](const ::testing::TestParamInfo<MatMulCase>& i) { return std::string(dtype_name(i.param.wt)); });

// A repacked expert tensor is only used while it still matches: new contents at the
// same address are read afresh, a 2-D view of expert 0 (same address) reads the
// tensor itself, and an out-of-range expert id is an error, not a wild read.
TEST_F(Avx512, MatMulIdRepackedCopyIsNotUsedWhenTheWeightChanges) {
  const int64_t K = 256, N = 24, E = 6, k = 2;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    for (int64_t n : {int64_t(1), int64_t(5)}) {  // decode and prefill
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n) + ", " + std::to_string(threads) +
                     " executor(s)");
        Backend& be = threads == 1 ? *be1 : *be2;
        std::vector<uint8_t> w = quantize_matrix(t, randn(size_t(K * N * E), 31), K, N * E);
        std::vector<float> x = randn(size_t(K * n), 32);
        std::vector<int32_t> ids = expert_ids(E, k, n, 33);
        Out a = matmul_id(be, t, w, K, N, E, x, 1, ids, k, n, true);
        Out ar = matmul_id(*ref, t, w, K, N, E, x, 1, ids, k, n);
        EXPECT_LE(tessera::nmse(ar.data(), a.data(), a.n), 1e-6);
        const std::vector<uint8_t> w2 = quantize_matrix(t, randn(size_t(K * N * E), 34), K, N * E);
        std::memcpy(w.data(), w2.data(), w.size());  // new contents at the same address, no prepare_weight
        Out r = matmul_id(*ref, t, w, K, N, E, x, 1, ids, k, n);
        Out b = matmul_id(be, t, w, K, N, E, x, 1, ids, k, n);
        EXPECT_LE(tessera::nmse(r.data(), b.data(), r.n), 1e-6);
        Out full1 = matmul_id(be, t, w, K, N, E, x, 1, ids, k, n, true);
        Out dense = matmul(be, t, w, K, N, x, 1);  // expert 0 as a 2-D weight at the same address
        Out denser = matmul(*ref, t, w, K, N, x, 1);
        EXPECT_LE(tessera::nmse(denser.data(), dense.data(), dense.n), 1e-6);
        Out full2 = matmul_id(be, t, w, K, N, E, x, 1, ids, k, n);
        EXPECT_EQ(std::memcmp(full1.data(), full2.data(), sizeof(float) * full1.n), 0);
        std::vector<int32_t> bad = ids;
        bad[size_t(k * n - 1)] = int32_t(E);
        EXPECT_THROW(matmul_id(be, t, w, K, N, E, x, 1, bad, k, n), Error);
      }
    }
  }
}

// MoeCombine: the reference's order (products, then the running sum over slots),
// so bit for bit; one token and a prefill split over the pool.
TEST_F(Avx512, MoeCombineMatchesReferenceBitForBit) {
  for (auto [N, k, n] : {std::tuple<int64_t, int64_t, int64_t>{2048, 8, 1}, {33, 3, 5}, {2048, 8, 40}}) {
    std::vector<float> e = randn(size_t(N * k * n), 51), w = randn(size_t(k * n), 52, 0.3f);
    Out r(size_t(N * n)), a(size_t(N * n)), b(size_t(N * n));
    for (int which = 0; which < 3; ++which) {
      Backend& be = which == 0 ? *ref : which == 1 ? *be1 : *be2;
      Graph g;
      const int te = g.add_tensor(Tensor::contiguous(DType::F32, {N, k, n}, e.data()));
      const int tw = g.add_tensor(Tensor::contiguous(DType::F32, {k, n}, w.data()));
      const int to =
          g.add_tensor(Tensor::contiguous(DType::F32, {N, n}, (which == 0 ? r : which == 1 ? a : b).data()));
      g.add_node(node(Op::MoeCombine, to, te, tw));
      run(be, g);
    }
    EXPECT_EQ(std::memcmp(r.data(), a.data(), sizeof(float) * r.n), 0) << "N=" << N << " k=" << k << " n=" << n;
    EXPECT_EQ(std::memcmp(r.data(), b.data(), sizeof(float) * r.n), 0) << "N=" << N << " k=" << k << " n=" << n;
    EXPECT_TRUE(a.guard_ok());
    EXPECT_TRUE(b.guard_ok());
  }
}

// --- Plugin ----------------------------------------------------------------------

TEST(Avx512Plugin, ProbeAndCreate) {
  const std::string path = std::string(TESSERA_PLUGIN_DIR) + "/backend_cpu_avx512.so";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "plugin not built: " << path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto entry = reinterpret_cast<TesseraPluginEntryFn>(dlsym(h, TESSERA_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const TesseraPluginDescriptor* d = entry();
  EXPECT_EQ(d->abi_version, TESSERA_PLUGIN_ABI_VERSION);
  EXPECT_STREQ(d->name, "cpu_avx512");
  EXPECT_EQ(d->kind, uint32_t(TESSERA_PLUGIN_BACKEND));
  char reason[256] = {0};
  const int32_t score = d->probe(reason, sizeof reason);
  EXPECT_NE(reason[0], '\0');
  std::string why;
  if (cpu_avx512::usable(&why)) {
    EXPECT_GT(score, 10) << reason;  // above cpu_scalar
    TesseraCreateArgs args{sizeof(TesseraCreateArgs), nullptr, nullptr, 0, nullptr};
    char err[256] = {0};
    void* inst = d->create(&args, err, sizeof err);
    ASSERT_NE(inst, nullptr) << err;
    ASSERT_NE(d->backend, nullptr);  // only the C table crosses (plugin_abi.h)
    EXPECT_EQ(d->backend->uses_host_memory(inst), 1);
    d->destroy(inst);
    // Options: valid values are taken, invalid ones refused with a reason naming the option.
    struct OptionCase {
      const char *key, *value;
      bool taken;
    };
    for (const OptionCase& c : {OptionCase{"decode_tiles", "2", true}, OptionCase{"repack", "true", true},
                                OptionCase{"decode_tiles", "3", false}, OptionCase{"decode_prefetch", "false", true},
                                OptionCase{"decode_prefetch", "sometimes", false}}) {
      SCOPED_TRACE(std::string(c.key) + " = " + c.value);
      const TesseraOption opt[] = {{c.key, c.value}};
      TesseraCreateArgs with{sizeof(TesseraCreateArgs), nullptr, opt, 1, nullptr};
      err[0] = '\0';
      inst = d->create(&with, err, sizeof err);
      EXPECT_EQ(inst != nullptr, c.taken) << err;
      if (inst) d->destroy(inst);
      else EXPECT_NE(std::string(err).find(c.key), std::string::npos) << err;
    }
  } else {
    EXPECT_EQ(score, 0);
    EXPECT_NE(std::string(reason).find("missing"), std::string::npos) << reason;
  }
  dlclose(h);
}
