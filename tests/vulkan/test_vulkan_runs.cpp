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

#include "support/paged_nodes.h"
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

// KV pages in vulkan's device memory (allocated through the backend, as the engine
// does): KvWrite and Attention run there over several steps (prefill, decodes, a second
// sequence sharing a prefix page), against cpu_scalar over host pages. The rows read
// back are identical, the outputs agree to float rounding, and a step moves only its
// inputs and outputs: never the cache. Over host pages vulkan declines both ops, and a
// scheduler sends them to the CPU backend after it.
TEST_F(VulkanRuns, KvPagesInDeviceMemory) {
  const int64_t hd = 64, n_kv = 2, n_head = 4;
  KvCacheConfig kc;
  kc.n_layers = 2;
  kc.n_kv_heads = int(n_kv);
  kc.head_dim = int(hd);
  kc.page_tokens = 4;
  kc.n_pages = 16;
  KvCache ref_kv(kc), got_kv(kc, [&](size_t bytes) { return vk_->alloc_buffer(bytes, BufferUsage::Kv); });
  ASSERT_EQ(got_kv.k_storage(1).data, nullptr);  // device memory: no host address
  ASSERT_NE(got_kv.k_storage(1).buffer, nullptr);
  const KvCache::SeqId rs = ref_kv.create_sequence(), gs = got_kv.create_sequence();
  int64_t pos = 0;
  uint32_t seed = 10;
  for (int64_t T : {int64_t(5), int64_t(3), int64_t(1), int64_t(1), int64_t(6)}) {
    ASSERT_TRUE(ref_kv.reserve(rs, pos + T));
    ASSERT_TRUE(got_kv.reserve(gs, pos + T));
    std::vector<float> k = randn(size_t(hd * n_kv * T), seed++), v = randn(size_t(hd * n_kv * T), seed++),
                       q = randn(size_t(hd * n_head * T), seed++);
    auto run_step = [&](KvCache& kv, KvCache::SeqId seq, Backend& be) {
      std::vector<float> out(size_t(hd * n_head * T));
      Graph g;
      const int kt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, k.data()));
      const int vt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, T}, v.data()));
      const int qt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, T}, q.data()));
      const int ot = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, T}, out.data()));
      test::PagedStep ps;
      test::add_paged_inputs(g, kv, 1, seq, pos, T, ps);
      g.add_node(test::kv_write_node(ps, false, kt));
      g.add_node(test::kv_write_node(ps, true, vt));
      g.add_node(test::attention_node(ps, qt, ot, 0.125f));
      for (const Node& n : g.nodes()) EXPECT_TRUE(be.supports(g, n).supported) << be.supports(g, n).reason;
      be.execute(g, 0, 3);
      return out;
    };
    const TransferStats before = vk_->transfers();
    const std::vector<float> want = run_step(ref_kv, rs, *ref_), got = run_step(got_kv, gs, *vk_);
    const TransferStats after = vk_->transfers();
    // Uploads: k, v, q, the slots and the sequence table; downloads: the output.
    const uint64_t inputs = uint64_t(hd * (2 * n_kv + n_head) * T) * 4 + uint64_t(T) * 4 + 4 * 4 * 2;
    EXPECT_LE(after.upload_bytes - before.upload_bytes, inputs + 256) << "step ending at " << pos + T;
    EXPECT_EQ(after.download_bytes - before.download_bytes, uint64_t(hd * n_head * T) * 4);
    pos += T;
    ref_kv.set_length(rs, pos);
    got_kv.set_length(gs, pos);
    EXPECT_LT(nmse(want, got), 1e-7) << "step ending at position " << pos;
  }
  std::vector<uint16_t> a(size_t(hd * n_kv)), b(a.size());
  for (int64_t p = 0; p < pos; ++p)
    for (int kvsel = 0; kvsel < 2; ++kvsel) {
      ref_kv.read_row(1, rs, p, kvsel, a.data());
      got_kv.read_row(1, gs, p, kvsel, b.data());
      ASSERT_EQ(a, b) << (kvsel ? "V" : "K") << " row " << p;
    }
  // A fork shares the first pages; its own write copies the shared page on the device.
  const KvCache::SeqId fork = got_kv.fork_sequence(gs, 6);
  ASSERT_TRUE(got_kv.reserve(fork, 7));
  EXPECT_NE(got_kv.block_table(fork)[1], got_kv.block_table(gs)[1]);  // copied on write
  for (int64_t p = 0; p < 6; ++p) {
    got_kv.read_row(1, gs, p, 0, a.data());
    got_kv.read_row(1, fork, p, 0, b.data());
    ASSERT_EQ(a, b) << "K row " << p << " of the fork";
  }

  // Host pages: declined with the reason; a scheduler places the KV nodes on cpu_scalar.
  KvCache host_kv(kc);
  const KvCache::SeqId hs = host_kv.create_sequence();
  ASSERT_TRUE(host_kv.reserve(hs, 2));
  std::vector<float> k = randn(size_t(hd * n_kv * 2), 40), q = randn(size_t(hd * n_head * 2), 41), out(q.size());
  Graph g;
  const int kt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_kv, 2}, k.data()));
  const int qt = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, 2}, q.data()));
  const int ot = g.add_tensor(Tensor::contiguous(DType::F32, {hd, n_head, 2}, out.data()));
  test::PagedStep ps;
  test::add_paged_inputs(g, host_kv, 0, hs, 0, 2, ps);
  g.add_node(test::kv_write_node(ps, false, kt));
  g.add_node(test::kv_write_node(ps, true, kt));
  g.add_node(test::attention_node(ps, qt, ot, 0.125f));
  for (const Node& n : g.nodes()) {
    const OpSupport s = vk_->supports(g, n);
    EXPECT_FALSE(s.supported);
    EXPECT_NE(s.reason.find("not in this backend's device memory"), std::string::npos) << s.reason;
  }
  Scheduler sched({vk_, ref_});
  sched.run(g);
  EXPECT_EQ(sched.usage()[1].placed, 3u);
}

// execute_validated() skips what the scheduler validated but keeps the one check()
// that reads data addresses (a Rope's positions must not be computed inside the graph,
// which the scheduler's signature does not see).
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
}

}  // namespace
