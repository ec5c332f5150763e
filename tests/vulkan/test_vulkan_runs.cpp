// The host-mirroring contract of the vulkan backend across several execute() calls:
// runs split by a node on another backend, inputs that touch in memory, intermediates
// kept on the device, outputs read by later runs, a weight and a view of its first rows
// in one run. Each result must match cpu_scalar running the whole graph. Needs a usable
// Vulkan device (on lavapipe: TESSERA_VULKAN_ALLOW_CPU=1, as scripts/test.sh sets).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/plugin_registry.h"
#include "tessera/quant.h"
#include "tessera/scheduler.h"

namespace {

using namespace tessera;

Node node(Op op, int32_t dst, int32_t s0, int32_t s1 = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src[0] = s0;
  n.src[1] = s1;
  return n;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += double(ref[i] - got[i]) * double(ref[i] - got[i]);
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? num / den : num;
}

class VulkanRuns : public testing::Test {
 protected:
  void SetUp() override {
    PluginConfig cfg;
    cfg.paths = {TESSERA_PLUGIN_DIR};
    reg_ = std::make_unique<PluginRegistry>(cfg);
    const PluginRecord* r = reg_->find("vulkan");
    if (!r || !r->usable) GTEST_SKIP() << "vulkan is not usable here: " << (r ? r->reason : std::string("no plugin"));
    vk_ = reg_->create_backend("vulkan", nullptr);
    ref_ = reg_->create_backend("cpu_scalar", nullptr);
  }
  std::unique_ptr<PluginRegistry> reg_;
  std::shared_ptr<Backend> vk_, ref_;
};

TEST_F(VulkanRuns, SplitRunsMatchTheReference) {
  const int64_t K = 256, M = 3, N = 40;
  // Weight (Q8_0 [K, N]) shared by a product and by a view of its first N/2 rows.
  std::vector<float> wf = randn(size_t(K * N), 1);
  std::vector<uint8_t> wq(row_bytes(DType::Q8_0, K) * size_t(N));
  for (int64_t r = 0; r < N; ++r) quant::quantize_row(DType::Q8_0, &wf[size_t(r * K)], &wq[size_t(r) * row_bytes(DType::Q8_0, K)], K);

  struct Out {
    std::vector<float> ab, d, e, p1, p2, s;
  };
  auto build_and_run = [&](bool on_vulkan) {
    Out o;
    o.ab = randn(size_t(2 * K * M), 2);  // a and b touch: b starts where a ends
    std::vector<float> c(size_t(K * M)), f(size_t(K * M));
    o.d.assign(size_t(K * M), 0.0f);
    o.e.assign(size_t(K * M), 0.0f);
    o.p1.assign(size_t(N * M), 0.0f);
    o.p2.assign(size_t(N / 2 * M), 0.0f);
    o.s.assign(size_t(N * M), 0.0f);
    Graph g;
    const int a = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, o.ab.data()));
    const int b = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, o.ab.data() + K * M));
    const int ct = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, c.data()));
    const int dt = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, o.d.data()));
    const int et = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, o.e.data()));
    const int ft = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, f.data()));
    const int w = g.add_tensor(Tensor::contiguous(DType::Q8_0, {K, N}, wq.data()));
    const int wv = g.view_rows(w, 0, N / 2);
    const int p1 = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, o.p1.data()));
    const int p2 = g.add_tensor(Tensor::contiguous(DType::F32, {N / 2, M}, o.p2.data()));
    const int s = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, o.s.data()));
    g.add_node(node(Op::Add, ct, a, b));       // 0 vulkan: inputs touching in memory
    g.add_node(node(Op::Silu, dt, ct));        // 1 vulkan: c stays on the device
    g.add_node(node(Op::Mul, et, dt, a));      // 2 cpu_scalar: reads d from the host
    g.add_node(node(Op::Add, ft, et, b));      // 3 vulkan: e computed elsewhere
    g.add_node(node(Op::MatMul, p1, w, ft));   // 4 vulkan: the weight
    g.add_node(node(Op::MatMul, p2, wv, ft));  // 5 vulkan: a view of its first rows
    g.add_node(node(Op::Softmax, s, p1));      // 6 vulkan
    if (on_vulkan) {
      vk_->prepare_weight(g.tensor(w));
      vk_->execute(g, 0, 2);
      ref_->execute(g, 2, 1);
      vk_->execute(g, 3, 4);
    } else {
      ref_->execute(g, 0, g.nodes().size());
    }
    return o;
  };
  Out ref = build_and_run(false);
  Out got = build_and_run(true);
  EXPECT_EQ(got.ab, ref.ab) << "an input was modified";
  // d is read by the next run's backend: it must be on the host after the first run.
  EXPECT_LT(nmse(ref.d, got.d), 1e-12);
  EXPECT_LT(nmse(ref.e, got.e), 1e-12);
  // p1 is read only by node 6 of the same run: it stays on the device (not compared);
  // p2 and s are read by no node (graph outputs): copied back.
  EXPECT_LT(nmse(ref.p2, got.p2), 1e-10);
  EXPECT_LT(nmse(ref.s, got.s), 1e-10);
  for (float v : got.s) ASSERT_TRUE(std::isfinite(v));
}

// The KV mirror: KvWrite on one backend, Attention on the other, in separate runs and
// steps (prefill, then decodes), against cpu_scalar doing everything. The cache rows
// must be identical and the attention outputs agree to float rounding.
TEST_F(VulkanRuns, KvCacheSharedWithAnotherBackend) {
  const int64_t hd = 64, n_kv = 2, n_head = 4;
  KvCacheConfig kc;
  kc.n_layers = 2;
  kc.n_kv_heads = int(n_kv);
  kc.head_dim = int(hd);
  kc.page_tokens = 4;
  kc.n_pages = 16;
  KvCache ref_kv(kc), got_kv(kc);
  const KvCache::SeqId rs = ref_kv.create_sequence(), gs = got_kv.create_sequence();
  ASSERT_EQ(rs, gs);
  int64_t pos = 0;
  // Steps: (tokens, who writes K/V, who attends) -- 0 = vulkan, 1 = cpu_scalar.
  const int steps[][3] = {{5, 1, 0}, {3, 0, 1}, {1, 0, 1}, {1, 0, 0}, {3, 1, 0}, {4, 0, 0}, {1, 1, 0}};
  uint32_t seed = 10;
  int step = 0;
  for (const auto& st : steps) {
    // Odd steps through execute_validated() (Scheduler::run's call; supports() is
    // asserted first), even ones through execute().
    const bool validated = step++ % 2 == 1;
    const int64_t T = st[0];
    ASSERT_TRUE(ref_kv.reserve(rs, pos + T));
    ASSERT_TRUE(got_kv.reserve(gs, pos + T));
    std::vector<float> k = randn(size_t(hd * n_kv * T), seed++), v = randn(size_t(hd * n_kv * T), seed++),
                       q = randn(size_t(hd * n_head * T), seed++);
    std::vector<float> out_ref(size_t(hd * n_head * T)), out_got(size_t(hd * n_head * T));
    auto run_step = [&](KvCache& kv, KvCache::SeqId seq, std::vector<float>& out, bool mixed) {
      Graph g;
      const int kt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, k.data()));
      const int vt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, v.data()));
      const int qt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, T}, q.data()));
      const int ot = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, T}, out.data()));
      Node w = node(Op::KvWrite, -1, kt, vt);
      w.i[0] = 1;
      w.i[1] = seq;
      w.i[2] = int32_t(pos);
      w.kv = &kv;
      Node a = node(Op::Attention, ot, qt);
      a.i = w.i;
      a.f[0] = 0.125f;
      a.kv = &kv;
      g.add_node(w);
      g.add_node(a);
      if (!mixed) {
        ref_->execute(g, 0, 2);
        return;
      }
      for (int i = 0; i < 2; ++i) {
        Backend& be = st[1 + i] == 0 ? *vk_ : *ref_;
        ASSERT_TRUE(be.supports(g, g.nodes()[size_t(i)]).supported);
        if (validated)
          be.execute_validated(g, size_t(i), 1);
        else
          be.execute(g, size_t(i), 1);
      }
    };
    run_step(ref_kv, rs, out_ref, false);
    run_step(got_kv, gs, out_got, true);
    // The kernels leave the length alone; the caller (the engine) sets it after the step.
    EXPECT_EQ(got_kv.length(gs), pos);
    EXPECT_EQ(ref_kv.length(rs), pos);
    pos += T;
    ref_kv.set_length(rs, pos);
    got_kv.set_length(gs, pos);
    EXPECT_LT(nmse(out_ref, out_got), 1e-7) << "step ending at position " << pos;
    for (int64_t p = 0; p < pos; ++p) {
      ASSERT_EQ(0, std::memcmp(ref_kv.k_row(1, rs, p), got_kv.k_row(1, gs, p), size_t(hd * n_kv) * 2)) << "K row " << p;
      ASSERT_EQ(0, std::memcmp(ref_kv.v_row(1, rs, p), got_kv.v_row(1, gs, p), size_t(hd * n_kv) * 2)) << "V row " << p;
    }
  }
}

// execute_validated() skips what the scheduler validated but keeps the one check()
// that reads data addresses (a Rope's positions must not be computed inside the graph,
// which the scheduler's signature does not see). KV positions outside the sequence's
// reserved range are the core's run-time check: execute() and Scheduler::run() refuse
// them before the backend records anything.
TEST_F(VulkanRuns, ValidatedRunsKeepRunTimeChecks) {
  const int64_t hd = 16, heads = 2, T = 3, K = 8;
  std::vector<float> a = randn(size_t(K * T), 30), x = randn(size_t(hd * heads * T), 31), y(x.size());
  std::vector<int32_t> pos = {0, 1, 2};
  Graph g;
  const int at = g.add_tensor(Tensor::contiguous(DType::F32, {K, T}, a.data()));
  const int pt = g.add_tensor(Tensor::contiguous(DType::I32, {T}, pos.data()));
  const int xt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, x.data()));
  const int yt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, heads, T}, y.data()));
  g.add_node(node(Op::Argmax, pt, at));  // the positions come out of the graph
  Node r = node(Op::Rope, yt, xt, pt);
  r.i[0] = int32_t(hd);
  r.f[0] = 10000.0f;
  r.f[1] = 1.0f;
  g.add_node(r);
  EXPECT_FALSE(vk_->supports(g, g.nodes()[1]).supported);
  for (size_t first : {size_t(0), size_t(1)}) {
    try {
      vk_->execute_validated(g, first, 2 - first);
      ADD_FAILURE() << "expected tessera::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("positions computed inside the graph"), std::string::npos) << e.what();
    }
  }

  KvCacheConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = 2;
  kc.head_dim = int(hd);
  kc.page_tokens = 4;
  kc.n_pages = 4;
  KvCache kv(kc);
  const KvCache::SeqId seq = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(seq, 4));
  std::vector<float> k = randn(size_t(hd * 2 * T), 32), q = randn(size_t(hd * 4 * T), 33), o(q.size());
  for (bool attention : {false, true}) {
    Graph h;
    const int kt = h.add_tensor(Tensor::contiguous(DType::F32, {hd, 2, T}, k.data()));
    const int qt = h.add_tensor(Tensor::contiguous(DType::F32, {hd, 4, T}, q.data()));
    const int ot = h.add_tensor(Tensor::contiguous(DType::F32, {hd, 4, T}, o.data()));
    Node n = attention ? node(Op::Attention, ot, qt) : node(Op::KvWrite, -1, kt, kt);
    n.i = {0, seq, 2};  // positions [2, 5): 4 is not reserved
    n.f[0] = 0.25f;
    n.kv = &kv;
    h.add_node(n);
    ASSERT_TRUE(vk_->supports(h, n).supported);
    Scheduler sched({vk_});
    for (bool scheduled : {false, true}) {
      try {
        if (scheduled)
          sched.run(h);
        else
          vk_->execute(h, 0, 1);
        ADD_FAILURE() << "expected tessera::Error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("reserved range"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
