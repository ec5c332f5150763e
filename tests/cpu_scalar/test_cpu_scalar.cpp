// Unit tests of the cpu_scalar reference backend: hand-checkable cases per op,
// matrix products for every weight dtype against a double-precision reference,
// thread-count independence, RoPE against the direct formula, attention over a
// paged KV cache (GQA, batched prefill == token-at-a-time), and clear errors.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu_scalar_backend.h"
#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/plugin_abi.h"
#include "tessera/op_schema.h"
#include "tessera/quant.h"
#include "tessera/scheduler.h"
#include "support/paged_nodes.h"

using namespace tessera;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return num / den;
}

// Registers caller-owned storage in a graph.
template <typename T>
int32_t add(Graph& g, DType t, std::initializer_list<int64_t> shape, std::vector<T>& storage) {
  return g.add_tensor(Tensor::contiguous(t, shape, storage.data()));
}

Node node(Op op, int32_t dst, int32_t s0, int32_t s1 = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src[0] = s0;
  n.src[1] = s1;
  return n;
}

void run(Backend& be, Graph& g) {
  for (const Node& n : g.nodes()) {
    OpSupport s = be.supports(g, n);
    ASSERT_TRUE(s.supported) << s.reason;
  }
  be.execute(g, 0, g.nodes().size());
}

float f16r(float x) { return quant::fp16_to_fp32(quant::fp32_to_fp16(x)); }

class CpuScalar : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = cpu_scalar::make_backend(nullptr);
};

}  // namespace

TEST_F(CpuScalar, Name) { EXPECT_EQ(be->name(), "cpu_scalar"); }

// --- GetRows ---------------------------------------------------------------

TEST_F(CpuScalar, GetRowsF32) {
  std::vector<float> table = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23};  // [4, 3]
  std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(12, -1.0f);
  Graph g;
  int tt = add(g, DType::F32, {4, 3}, table), ti = add(g, DType::I32, {3}, ids), to = add(g, DType::F32, {4, 3}, out);
  g.add_node(node(Op::GetRows, to, tt, ti));
  run(*be, g);
  EXPECT_EQ(out, (std::vector<float>{20, 21, 22, 23, 0, 1, 2, 3, 20, 21, 22, 23}));
}

TEST_F(CpuScalar, GetRowsQ8_0) {
  const int64_t K = 64, V = 5;
  auto src = randn(size_t(K * V), 1);
  const size_t rb = row_bytes(DType::Q8_0, K);
  std::vector<uint8_t> table(rb * V);
  for (int64_t r = 0; r < V; ++r) quant::quantize_row(DType::Q8_0, &src[size_t(r * K)], &table[size_t(r) * rb], K);
  std::vector<int32_t> ids = {3, 1};
  std::vector<float> out(static_cast<size_t>(K * 2));
  Graph g;
  int tt = add(g, DType::Q8_0, {K, V}, table), ti = add(g, DType::I32, {2}, ids), to = add(g, DType::F32, {K, 2}, out);
  g.add_node(node(Op::GetRows, to, tt, ti));
  run(*be, g);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> ref(static_cast<size_t>(K));
    quant::dequantize_row(DType::Q8_0, &table[size_t(ids[size_t(i)]) * rb], ref.data(), K);
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(out[size_t(i * K + k)], ref[size_t(k)]);
      EXPECT_NEAR(out[size_t(i * K + k)], src[size_t(ids[size_t(i)] * K + k)], 0.05f);  // quantization error
    }
  }
}

TEST_F(CpuScalar, GetRowsOutOfRangeThrows) {
  std::vector<float> table(8), out(4);
  std::vector<int32_t> ids = {2};
  Graph g;
  int tt = add(g, DType::F32, {4, 2}, table), ti = add(g, DType::I32, {1}, ids), to = add(g, DType::F32, {4, 1}, out);
  g.add_node(node(Op::GetRows, to, tt, ti));
  try {
    be->execute(g, 0, 1);
    FAIL() << "expected tessera::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("node 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  }
  ids[0] = -1;
  EXPECT_THROW(be->execute(g, 0, 1), Error);
}

// --- RmsNorm ---------------------------------------------------------------

TEST_F(CpuScalar, RmsNorm) {
  const int64_t K = 96, n = 3;
  auto x = randn(size_t(K * n), 2, 3.0f);
  auto w = randn(size_t(K), 3);
  std::vector<float> y1(x.size()), y2(x.size());
  const float eps = 1e-5f;
  Graph g;
  int tx = add(g, DType::F32, {K, n}, x), tw = add(g, DType::F32, {K}, w);
  int t1 = add(g, DType::F32, {K, n}, y1), t2 = add(g, DType::F32, {K, n}, y2);
  Node a = node(Op::RmsNorm, t1, tx);
  a.f[0] = eps;
  Node b = node(Op::RmsNorm, t2, tx, tw);
  b.f[0] = eps;
  g.add_node(a);
  g.add_node(b);
  run(*be, g);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += double(x[size_t(r * K + k)]) * x[size_t(r * K + k)];
    const double scale = 1.0 / std::sqrt(ss / K + eps);
    double ms = 0;
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = size_t(r * K + k);
      EXPECT_NEAR(y1[i], x[i] * scale, 1e-5 * std::abs(x[i] * scale) + 1e-7);
      EXPECT_NEAR(y2[i], x[i] * scale * w[size_t(k)], 1e-5 * std::abs(x[i] * scale * w[size_t(k)]) + 1e-7);
      ms += double(y1[i]) * y1[i];
    }
    EXPECT_NEAR(ms / K, 1.0, 1e-4);  // unit root-mean-square
  }
}

// --- MatMul ----------------------------------------------------------------

struct MatMulCase {
  DType type;
  double limit;
};

class CpuScalarMatMul : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(CpuScalarMatMul, AgainstDoubleReference) {
  const MatMulCase c = GetParam();
  const int64_t K = 512, N = 24, M = 3;
  auto wf = randn(size_t(K * N), 10 + uint32_t(c.type));
  auto x = randn(size_t(K * M), 20);
  const size_t rb = row_bytes(c.type, K);
  std::vector<uint8_t> w(rb * N);
  std::vector<float> wdq(static_cast<size_t>(K * N));
  for (int64_t n = 0; n < N; ++n) {
    quant::quantize_row(c.type, &wf[size_t(n * K)], &w[size_t(n) * rb], K);
    quant::dequantize_row(c.type, &w[size_t(n) * rb], &wdq[size_t(n * K)], K);
  }
  std::vector<double> ref(static_cast<size_t>(N * M));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(wdq[size_t(n * K + k)]) * x[size_t(m * K + k)];
      ref[size_t(m * N + n)] = s;
    }

  std::vector<float> out(size_t(N * M), NAN);
  auto be = cpu_scalar::make_backend(nullptr);
  Graph g;
  int tw = add(g, c.type, {K, N}, w), tx = add(g, DType::F32, {K, M}, x), to = add(g, DType::F32, {N, M}, out);
  g.add_node(node(Op::MatMul, to, tw, tx));
  run(*be, g);
  const double e = nmse(out, ref);
  EXPECT_LT(e, c.limit) << dtype_name(c.type);
  EXPECT_GE(e, 0.0);

  // Same result from a strided view of x (rows 2K floats apart).
  std::vector<float> xs(size_t(2 * K * M), 1e30f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xs[size_t(2 * K * m + k)] = x[size_t(m * K + k)];
  Tensor xv = Tensor::contiguous(DType::F32, {K, M}, xs.data());
  xv.nb[1] = size_t(2 * K) * sizeof(float);
  xv.nb[2] = xv.nb[3] = xv.nb[1] * size_t(M);
  std::vector<float> out2(out.size(), NAN);
  Graph g2;
  int tw2 = add(g2, c.type, {K, N}, w), tx2 = g2.add_tensor(xv), to2 = add(g2, DType::F32, {N, M}, out2);
  g2.add_node(node(Op::MatMul, to2, tw2, tx2));
  run(*be, g2);
  EXPECT_EQ(out, out2);
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, CpuScalarMatMul,
                         ::testing::Values(MatMulCase{DType::F32, 1e-6}, MatMulCase{DType::F16, 1e-5},
                                           MatMulCase{DType::BF16, 1e-5}, MatMulCase{DType::Q8_0, 1e-3},
                                           MatMulCase{DType::Q4_0, 1e-3}, MatMulCase{DType::Q4_K, 1e-3},
                                           MatMulCase{DType::Q5_K, 1e-3}, MatMulCase{DType::Q6_K, 1e-3},
                                           MatMulCase{DType::Q4_1, 1e-3}, MatMulCase{DType::Q5_0, 1e-3},
                                           MatMulCase{DType::Q5_1, 1e-3}, MatMulCase{DType::IQ4_NL, 1e-3},
                                           MatMulCase{DType::MXFP4, 1e-3}),
                         [](const auto& info) { return std::string(dtype_name(info.param.type)); });

TEST(CpuScalarThreads, MatMulAndAttentionBitIdenticalAcrossThreadCounts) {
  FastPool pool(2);
  auto be1 = cpu_scalar::make_backend(nullptr);
  auto be2 = cpu_scalar::make_backend(&pool);
  for (DType t : {DType::F32, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const int64_t K = 256, N = 37, M = 5;
    auto wf = randn(size_t(K * N), 30);
    auto x = randn(size_t(K * M), 31);
    const size_t rb = row_bytes(t, K);
    std::vector<uint8_t> w(rb * N);
    for (int64_t n = 0; n < N; ++n) quant::quantize_row(t, &wf[size_t(n * K)], &w[size_t(n) * rb], K);
    std::vector<float> o1(static_cast<size_t>(N * M)), o2(static_cast<size_t>(N * M));
    for (int pass = 0; pass < 2; ++pass) {
      Graph g;
      auto& o = pass ? o2 : o1;
      int tw = add(g, t, {K, N}, w), tx = add(g, DType::F32, {K, M}, x), to = add(g, DType::F32, {N, M}, o);
      g.add_node(node(Op::MatMul, to, tw, tx));
      run(pass ? *be2 : *be1, g);
    }
    EXPECT_EQ(o1, o2) << dtype_name(t);
  }
}

// --- Rope ------------------------------------------------------------------

namespace {
void rope_check(int mode) {
  auto be = cpu_scalar::make_backend(nullptr);
  const int64_t hd = 16, heads = 3, n_dims = 12;
  std::vector<int32_t> pos = {0, 1, 7, 100};
  const int64_t T = int64_t(pos.size());
  const float base = 10000.0f, fscale = 0.5f;
  auto x = randn(size_t(hd * heads * T), 40);
  std::vector<float> y(x.size());
  Graph g;
  int tx = add(g, DType::F32, {hd, heads, T}, x), tp = add(g, DType::I32, {T}, pos);
  int ty = add(g, DType::F32, {hd, heads, T}, y);
  Node n = node(Op::Rope, ty, tx, tp);
  n.i[0] = int32_t(n_dims);
  n.i[1] = mode;
  n.f[0] = base;
  n.f[1] = fscale;
  g.add_node(n);
  run(*be, g);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* xs = &x[size_t((t * heads + h) * hd)];
      const float* ys = &y[size_t((t * heads + h) * hd)];
      for (int64_t i = 0; i < n_dims / 2; ++i) {
        const int64_t a = mode == kRopeNeox ? i : 2 * i;
        const int64_t b = mode == kRopeNeox ? i + n_dims / 2 : 2 * i + 1;
        const double theta = double(pos[size_t(t)]) * fscale * std::pow(double(base), -2.0 * double(i) / n_dims);
        const double ya = xs[a] * std::cos(theta) - xs[b] * std::sin(theta);
        const double yb = xs[a] * std::sin(theta) + xs[b] * std::cos(theta);
        EXPECT_NEAR(ys[a], ya, 2e-5) << "t=" << t << " h=" << h << " i=" << i;
        EXPECT_NEAR(ys[b], yb, 2e-5) << "t=" << t << " h=" << h << " i=" << i;
        // A rotation preserves the pair's norm.
        EXPECT_NEAR(std::hypot(ys[a], ys[b]), std::hypot(xs[a], xs[b]), 1e-5);
      }
      for (int64_t i = n_dims; i < hd; ++i) EXPECT_EQ(ys[i], xs[i]);  // beyond n_dims: copied
      if (pos[size_t(t)] == 0) {
        for (int64_t i = 0; i < hd; ++i) EXPECT_EQ(ys[i], xs[i]);  // position 0: identity
      }
    }
}
}  // namespace

TEST(CpuScalarRope, Normal) { rope_check(kRopeNormal); }
TEST(CpuScalarRope, Neox) { rope_check(kRopeNeox); }

TEST_F(CpuScalar, RopeInPlace) {
  std::vector<float> x = {1, 0, 0, 1}, y;
  std::vector<int32_t> pos = {1};
  Graph g;
  int tx = add(g, DType::F32, {4, 1, 1}, x), tp = add(g, DType::I32, {1}, pos);
  Node n = node(Op::Rope, tx, tx, tp);
  n.i[0] = 4;
  n.f[0] = 10000.0f;
  n.f[1] = 1.0f;
  g.add_node(n);
  run(*be, g);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.01), 1e-6);
}

// --- KvWrite + Attention ---------------------------------------------------

namespace {

struct AttnFixture {
  static constexpr int64_t hd = 8, n_head = 4, n_kv = 2;
  KvCacheConfig cfg{2, int(n_kv), int(hd), 4, 16, {}};
  KvCache kv{cfg};
  std::unique_ptr<Backend> be;

  explicit AttnFixture(FastPool* pool = nullptr) : be(cpu_scalar::make_backend(pool)) {}

  // KvWrite of n tokens at p0, then Attention of q over them; returns [hd, n_head, n].
  std::vector<float> step(KvCache::SeqId seq, int layer, int64_t p0, int64_t n, std::vector<float> k,
                          std::vector<float> v, std::vector<float> q, float scale) {
    EXPECT_TRUE(kv.reserve(seq, p0 + n));
    std::vector<float> out(size_t(hd * n_head * n), NAN);
    Graph g;
    int tk = add(g, DType::F32, {hd, n_kv, n}, k), tv = add(g, DType::F32, {hd, n_kv, n}, v);
    int tq = add(g, DType::F32, {hd, n_head, n}, q), to = add(g, DType::F32, {hd, n_head, n}, out);
    test::PagedStep ps;
    test::add_paged_inputs(g, kv, layer, seq, p0, n, ps);
    g.add_node(test::kv_write_node(ps, false, tk));
    g.add_node(test::kv_write_node(ps, true, tv));
    g.add_node(test::attention_node(ps, tq, to, scale));
    run(*be, g);
    EXPECT_EQ(kv.length(seq), p0);  // the kernels leave the length to the caller (the engine)
    kv.set_length(seq, p0 + n);
    return out;
  }
};

// Direct attention over all tokens (K, V, q rounded to F16), in double.
std::vector<double> attention_ref(const std::vector<float>& K, const std::vector<float>& V,
                                  const std::vector<float>& Q, int64_t hd, int64_t n_head, int64_t n_kv,
                                  int64_t T, float scale) {
  std::vector<double> out(static_cast<size_t>(hd * n_head * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kh = h / (n_head / n_kv);
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += double(f16r(Q[size_t((t * n_head + h) * hd + i)])) * f16r(K[size_t((j * n_kv + kh) * hd + i)]);
        s[size_t(j)] = d * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = 0; j <= t; ++j) acc += s[size_t(j)] / sum * f16r(V[size_t((j * n_kv + kh) * hd + i)]);
        out[size_t((t * n_head + h) * hd + i)] = acc;
      }
    }
  return out;
}

std::vector<float> slice(const std::vector<float>& v, int64_t row, int64_t rows, int64_t row_elems) {
  return std::vector<float>(v.begin() + row * row_elems, v.begin() + (row + rows) * row_elems);
}

}  // namespace

TEST(CpuScalarAttention, GqaPrefillThenDecodeMatchesDirectAndTokenByToken) {
  constexpr int64_t hd = AttnFixture::hd, n_head = AttnFixture::n_head, n_kv = AttnFixture::n_kv;
  const int64_t P = 6, T = P + 1;  // prefill of 6 (pages of 4: spans 2 pages), then one decode token
  const float scale = 1.0f / std::sqrt(float(hd));
  auto K = randn(size_t(hd * n_kv * T), 50, 2.0f);
  auto V = randn(size_t(hd * n_kv * T), 51);
  auto Q = randn(size_t(hd * n_head * T), 52, 2.0f);
  const auto ref = attention_ref(K, V, Q, hd, n_head, n_kv, T, scale);

  AttnFixture f;
  // Batched: prefill positions 0..5, then decode position 6.
  const KvCache::SeqId a = f.kv.create_sequence();
  auto pre = f.step(a, 1, 0, P, slice(K, 0, P, hd * n_kv), slice(V, 0, P, hd * n_kv), slice(Q, 0, P, hd * n_head), scale);
  auto dec = f.step(a, 1, P, 1, slice(K, P, 1, hd * n_kv), slice(V, P, 1, hd * n_kv), slice(Q, P, 1, hd * n_head), scale);
  EXPECT_GE(f.kv.block_table(a).size(), 2u);  // spans several pages
  std::vector<float> batched = pre;
  batched.insert(batched.end(), dec.begin(), dec.end());
  std::vector<double> r(ref.begin(), ref.end());
  // The V weighted sum is stored in F16 between steps (the reference's convention), so
  // each of the T accumulation steps may round by half an F16 ulp (2^-11 relative):
  // bound |error| by T ulps of max(1, |ref|) against the double-precision formula.
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(batched[i], ref[i], double(T) * 0x1p-11 * std::max(1.0, std::abs(double(ref[i])))) << i;
  EXPECT_LT(nmse(batched, r), 1e-6);

  // One token at a time on another sequence: bit-identical.
  const KvCache::SeqId b = f.kv.create_sequence();
  for (int64_t t = 0; t < T; ++t) {
    auto o = f.step(b, 1, t, 1, slice(K, t, 1, hd * n_kv), slice(V, t, 1, hd * n_kv), slice(Q, t, 1, hd * n_head), scale);
    for (int64_t i = 0; i < hd * n_head; ++i)
      EXPECT_EQ(o[size_t(i)], batched[size_t(t * hd * n_head + i)]) << "t=" << t << " i=" << i;
  }

  // The cache holds F16 K/V rows: head h of position j at h * head_dim.
  EXPECT_EQ(f.kv.k_row(1, a, 5)[hd + 3], quant::fp32_to_fp16(K[size_t((5 * n_kv + 1) * hd + 3)]));
  EXPECT_EQ(f.kv.v_row(1, b, 6)[2], quant::fp32_to_fp16(V[size_t((6 * n_kv + 0) * hd + 2)]));

  // With a pool: bit-identical too.
  FastPool pool(2);
  AttnFixture f2(&pool);
  const KvCache::SeqId c = f2.kv.create_sequence();
  auto pre2 = f2.step(c, 0, 0, P, slice(K, 0, P, hd * n_kv), slice(V, 0, P, hd * n_kv), slice(Q, 0, P, hd * n_head), scale);
  EXPECT_EQ(pre2, pre);
}

TEST(CpuScalarAttention, ErrorsAreClear) {
  AttnFixture f;
  const KvCache::SeqId s = f.kv.create_sequence();
  ASSERT_TRUE(f.kv.reserve(s, 4));
  const int64_t hd = AttnFixture::hd, nh = AttnFixture::n_head;
  std::vector<float> q(static_cast<size_t>(hd * nh * 2)), out(q.size());
  Graph g;
  int tq = add(g, DType::F32, {hd, nh, 2}, q);
  int to = add(g, DType::F32, {hd, nh, 2}, out);
  test::PagedStep ps;
  test::add_paged_inputs(g, f.kv, 0, s, 0, 2, ps);
  const Node a = test::attention_node(ps, tq, to, 0.5f);
  g.add_node(a);
  EXPECT_TRUE(f.be->supports(g, a).supported);
  // Positions [0, 2) are in the table's pages: attention over them runs (length() is
  // the engine's, set after the step; the kernels do not read it).
  EXPECT_NO_THROW(f.be->execute(g, 0, 1));
  EXPECT_EQ(f.kv.length(s), 0);
  // Run-time errors, from execute() and from the scheduler's run-time check alike.
  auto expect_run_error = [&](const char* what) {
    for (bool validated : {false, true}) {
      try {
        if (validated)
          throw Error(op_schema::check_run_state(g, g.nodes()[0]));
        else
          f.be->execute(g, 0, 1);
        ADD_FAILURE() << "expected tessera::Error containing '" << what << "'";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    }
  };
  int32_t* col = ps.data.table.data();
  col[kSeqTableHeader] = f.kv.total_pages();  // a page the storage does not have
  expect_run_error("outside the storage's [0, 16)");
  col[kSeqTableHeader] = f.kv.block_table(s)[0];
  col[kSeqPos0] = 5;  // positions [0, 7) need 2 pages, the table has 1
  expect_run_error("need 2 pages, the table has 1");
  col[kSeqPos0] = 0;
  col[kSeqCount] = 1;  // token row 1 belongs to no sequence
  expect_run_error("covers 1 of q's 2 token rows");
  col[kSeqCount] = 2;
  col[kSeqFirst] = 1;  // rows [1, 3) of 2
  expect_run_error("outside q's 2");
  col[kSeqFirst] = 0;
  EXPECT_NO_THROW(f.be->execute(g, 0, 1));
  // 3 heads with 2 KV heads: not a multiple.
  std::vector<float> q3(static_cast<size_t>(hd * 3 * 2));
  int tq3 = add(g, DType::F32, {hd, 3, 2}, q3);
  Node b = a;
  b.src[0] = tq3;
  OpSupport sb = f.be->supports(g, b);
  EXPECT_FALSE(sb.supported);
  EXPECT_NE(sb.reason.find("KV heads"), std::string::npos) << sb.reason;
  Node c = a;
  c.src[3] = -1;  // no sequence table
  EXPECT_FALSE(f.be->supports(g, c).supported);
  Node d = a;
  d.src[1] = tq;  // q as the K storage: not F16 rows of whole heads
  EXPECT_FALSE(f.be->supports(g, d).supported);
}

// --- Softmax, Silu, SwiGlu, Add, Mul, Argmax -------------------------------

// execute_validated() checks nothing the scheduler validated (the op schema once per
// plan, the run-time state before each run): execute() and Scheduler::run() make the
// run-time checks, and the kernels still check the ids they read.
TEST(CpuScalarValidated, SkipsShapeChecksKeepsRunTimeChecks) {
  AttnFixture f;
  const KvCache::SeqId s = f.kv.create_sequence();
  ASSERT_TRUE(f.kv.reserve(s, 4));
  const int64_t hd = AttnFixture::hd, nh = AttnFixture::n_head, nkv = AttnFixture::n_kv;
  std::shared_ptr<Backend> shared = cpu_scalar::make_backend(nullptr);
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
  std::vector<float> k(size_t(hd * nkv * 2), 0.5f), v = k, q(size_t(hd * nh * 2), 0.25f), out(q.size());
  test::PagedStep ps;  // the graphs below share its inputs (the slots and table data)
  auto kv_graph = [&](Graph& g, bool attention) {
    const int tk = add(g, DType::F32, {hd, nkv, 2}, k), tv = add(g, DType::F32, {hd, nkv, 2}, v);
    const int tq = add(g, DType::F32, {hd, nh, 2}, q), to = add(g, DType::F32, {hd, nh, 2}, out);
    test::add_paged_inputs(g, f.kv, 0, s, 0, 2, ps);
    g.add_node(test::kv_write_node(ps, false, tk));
    g.add_node(test::kv_write_node(ps, true, tv));
    if (attention) g.add_node(test::attention_node(ps, tq, to, 0.5f));
  };
  {  // Runs like execute(), which leaves the length alone.
    Graph g;
    kv_graph(g, true);
    f.be->execute_validated(g, 0, 3);
    EXPECT_EQ(f.kv.length(s), 0);
    EXPECT_EQ(f.kv.k_row(0, s, 1)[3], quant::fp32_to_fp16(0.5f));
  }
  {  // A slot outside the storage (16 pages of 4).
    Graph g;
    kv_graph(g, false);
    ps.data.slots[1] = 64;
    expect_error(g, "slot 64 (token 1) outside the storage's [0, 64)");
  }
  {  // A negative first position (the signature leaves the table's data out): still checked.
    Graph g;
    kv_graph(g, true);
    ps.data.table[kSeqPos0] = -1;
    expect_error(g, "negative");
  }
  {  // Data pointers and ids inside tensors.
    std::vector<float> table(8 * 3, 1.0f), rows(8 * 2);
    std::vector<int32_t> ids = {1, 3};
    Graph g;
    const int tt = add(g, DType::F32, {8, 3}, table), ti = add(g, DType::I32, {2}, ids);
    const int tr = add(g, DType::F32, {8, 2}, rows);
    g.add_node(node(Op::GetRows, tr, tt, ti));
    expect_error(g, "out of range", true);
    Graph h;
    const int tx = h.add_tensor(Tensor::contiguous(DType::F32, {8}, nullptr));
    const int ty = add(h, DType::F32, {8}, rows);
    h.add_node(node(Op::Silu, ty, tx));
    expect_error(h, "has no data");
  }
  {  // A shape/parameter check is skipped: a node supports() refuses (a negative eps,
     // harmless here) runs. Outside callers use execute(), which refuses it.
    std::vector<float> x(8, 2.0f), y(8);
    Graph g;
    const int tx = add(g, DType::F32, {8}, x), ty = add(g, DType::F32, {8}, y);
    Node n = node(Op::RmsNorm, ty, tx);
    n.f[0] = -1e-30f;
    g.add_node(n);
    EXPECT_FALSE(f.be->supports(g, n).supported);
    EXPECT_THROW(f.be->execute(g, 0, 1), Error);
    EXPECT_NO_THROW(f.be->execute_validated(g, 0, 1));
    EXPECT_FLOAT_EQ(y[0], 1.0f);
  }
}

TEST_F(CpuScalar, Softmax) {
  std::vector<float> x = {1, 2, 3, 4, 1000, 1000, -1000, 0}, y(8);
  Graph g;
  int tx = add(g, DType::F32, {4, 2}, x), ty = add(g, DType::F32, {4, 2}, y);
  g.add_node(node(Op::Softmax, ty, tx));
  run(*be, g);
  for (int r = 0; r < 2; ++r) {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += y[size_t(r * 4 + i)];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  EXPECT_NEAR(y[0], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(y[3], std::exp(4.0) / z, 1e-7);
  EXPECT_NEAR(y[4], 0.5, 1e-7);  // large values: no overflow (max subtracted)
  EXPECT_EQ(y[6], 0.0f);
}

TEST_F(CpuScalar, SiluSwiGluAddMul) {
  std::vector<float> a = {-2, -1, 0, 1, 2, 3}, b = {1, 2, 3, 4, 5, 6}, row = {10, 20, 30};
  std::vector<float> silu(6), sw(6), sum(6), prod(6), bprod(6);
  Graph g;
  int ta = add(g, DType::F32, {3, 2}, a), tb = add(g, DType::F32, {3, 2}, b), tr = add(g, DType::F32, {3}, row);
  int t1 = add(g, DType::F32, {3, 2}, silu), t2 = add(g, DType::F32, {3, 2}, sw), t3 = add(g, DType::F32, {3, 2}, sum);
  int t4 = add(g, DType::F32, {3, 2}, prod), t5 = add(g, DType::F32, {3, 2}, bprod);
  g.add_node(node(Op::Silu, t1, ta));
  g.add_node(node(Op::SwiGlu, t2, ta, tb));
  g.add_node(node(Op::Add, t3, ta, tb));
  g.add_node(node(Op::Mul, t4, ta, tb));
  g.add_node(node(Op::Mul, t5, ta, tr));  // one row broadcast over the rows
  run(*be, g);
  for (size_t i = 0; i < 6; ++i) {
    const double s = a[i] / (1.0 + std::exp(-double(a[i])));
    EXPECT_NEAR(silu[i], s, 1e-6);
    EXPECT_NEAR(sw[i], s * b[i], 1e-5);
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(prod[i], a[i] * b[i]);
    EXPECT_EQ(bprod[i], a[i] * row[i % 3]);
  }
  EXPECT_EQ(silu[2], 0.0f);
}

TEST_F(CpuScalar, AddInPlace) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  Graph g;
  int ta = add(g, DType::F32, {3}, a), tb = add(g, DType::F32, {3}, b);
  g.add_node(node(Op::Add, ta, ta, tb));
  run(*be, g);
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
}

TEST_F(CpuScalar, Argmax) {
  std::vector<float> x = {1, 5, 5, 2, -3, -1, -2, -1, 0, 0, 0, 0};
  std::vector<int32_t> out(3, -7);
  Graph g;
  int tx = add(g, DType::F32, {4, 3}, x), to = add(g, DType::I32, {3}, out);
  g.add_node(node(Op::Argmax, to, tx));
  run(*be, g);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 0}));  // first maximum on ties
}

// --- Unsupported / mismatched ----------------------------------------------

TEST_F(CpuScalar, UnsupportedAndMismatchedGiveReasons) {
  std::vector<float> w(64 * 4), x(32 * 2), y(4 * 2);
  std::vector<int32_t> ids(2);
  Graph g;
  int tw = add(g, DType::F32, {64, 4}, w), tx = add(g, DType::F32, {32, 2}, x), ty = add(g, DType::F32, {4, 2}, y);
  int ti = add(g, DType::I32, {2}, ids);

  Node bad = node(Op::Count, ty, tx);
  OpSupport s = be->supports(g, bad);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("unknown op"), std::string::npos) << s.reason;

  Node mm = node(Op::MatMul, ty, tw, tx);  // K 64 vs 32
  s = be->supports(g, mm);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("mat_mul"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("x"), std::string::npos) << s.reason;

  Node gr = node(Op::GetRows, ty, tw, tx);  // F32 ids
  s = be->supports(g, gr);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("ids must be i32"), std::string::npos) << s.reason;

  Node mt = node(Op::MatMul, ty, ti, tx);  // I32 weights
  s = be->supports(g, mt);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("dtype"), std::string::npos) << s.reason;

  Node add_bad = node(Op::Add, ty, tx, tw);
  EXPECT_FALSE(be->supports(g, add_bad).supported);

  Node missing = node(Op::Silu, ty, -1);
  EXPECT_FALSE(be->supports(g, missing).supported);
  Node oob = node(Op::Silu, ty, 999);
  EXPECT_FALSE(be->supports(g, oob).supported);

  std::vector<float> q(8 * 2 * 2);
  int tq = add(g, DType::F32, {8, 2, 2}, q);
  Node rope = node(Op::Rope, tq, tq, ti);
  EXPECT_TRUE(be->supports(g, [&] { Node r = rope; r.i[0] = 8; r.f[0] = 1e4f; r.f[1] = 1.0f; return r; }()).supported);
  rope.i[0] = 3;  // odd n_dims
  rope.f[0] = 10000.0f;
  rope.f[1] = 1.0f;
  s = be->supports(g, rope);
  EXPECT_FALSE(s.supported);
  EXPECT_NE(s.reason.find("n_dims"), std::string::npos) << s.reason;

  // Executing a mismatched node throws an Error naming the node.
  g.add_node(node(Op::Silu, ty, ty));
  g.add_node(mm);
  try {
    be->execute(g, 0, 2);
    FAIL() << "expected tessera::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("node 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mat_mul"), std::string::npos) << msg;
  }
  EXPECT_THROW(be->execute(g, 1, 5), Error);  // range beyond the graph
}

// --- The plugin .so ---------------------------------------------------------

TEST(CpuScalarPlugin, DescriptorProbeCreateDestroy) {
  const std::string path = std::string(TESSERA_PLUGIN_DIR) + "/backend_cpu_scalar.so";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "plugin not built: " << path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto entry = reinterpret_cast<TesseraPluginEntryFn>(dlsym(h, TESSERA_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const TesseraPluginDescriptor* d = entry();
  EXPECT_EQ(d->abi_version, TESSERA_PLUGIN_ABI_VERSION);
  EXPECT_EQ(std::string(d->name), "cpu_scalar");
  EXPECT_EQ(d->kind, uint32_t(TESSERA_PLUGIN_BACKEND));
  char reason[128] = {};
  EXPECT_EQ(d->probe(reason, sizeof reason), 10);
  TesseraOption opts[] = {{"threads", "4"}, {"no_such_option", "x"}};
  TesseraCreateArgs args{sizeof(TesseraCreateArgs), nullptr, opts, 2, nullptr};
  char err[256] = {};
  void* inst = d->create(&args, err, sizeof err);
  ASSERT_NE(inst, nullptr) << err;
  ASSERT_NE(d->backend, nullptr);  // only the C table crosses (plugin_abi.h)
  EXPECT_EQ(d->backend->uses_host_memory(inst), 1);
  d->destroy(inst);
  dlclose(h);
}
