// Scheduler placement, fallback down the ranking, grouping of runs, errors, the
// placement cache and per-op profiling.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/paged_nodes.h"
#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/scheduler.h"

using namespace tessera;

namespace {

// Supports a fixed set of ops; records every execute() and execute_validated() call
// (in calls; the latter also in validated_calls).
class FakeBackend final : public Backend {
 public:
  FakeBackend(std::string name, std::set<Op> ops) : name_(std::move(name)), ops_(std::move(ops)) {}
  std::string name() const override { return name_; }
  OpSupport supports(const Graph&, const Node& n) const override {
    ++supports_calls;
    if (ops_.count(n.op)) return OpSupport::yes();
    return OpSupport::no(std::string("no ") + std::string(op_name(n.op)) + " in " + name_);
  }
  void execute(Graph&, size_t first, size_t count) override { calls.emplace_back(first, count); }
  void execute_validated(Graph& g, size_t first, size_t count) override {
    validated_calls.emplace_back(first, count);
    execute(g, first, count);
  }
  std::vector<std::pair<size_t, size_t>> calls, validated_calls;
  mutable size_t supports_calls = 0;

 private:
  std::string name_;
  std::set<Op> ops_;
};

void add(Graph& g, Op op, int32_t dst, int32_t a, int32_t b = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src = {a, b, -1, -1, -1};
  g.add_node(n);
}

}  // namespace

TEST(Scheduler, FallsBackDownTheRanking) {
  auto fast = std::make_shared<FakeBackend>("fast", std::set<Op>{Op::Add});
  auto slow = std::make_shared<FakeBackend>("slow", std::set<Op>{Op::Add, Op::Mul, Op::Silu});
  Scheduler s({fast, slow});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  int32_t y = g.new_tensor(DType::F32, {8}, "y");
  int32_t z = g.new_tensor(DType::F32, {8}, "z");
  add(g, Op::Add, y, x, x);
  add(g, Op::Add, y, y, x);
  add(g, Op::Mul, z, y, x);
  add(g, Op::Silu, z, z);
  add(g, Op::Add, z, z, y);
  g.allocate();  // run() checks that every tensor has data
  EXPECT_EQ(s.place(g), (std::vector<int>{0, 0, 1, 1, 0}));

  s.run(g);
  EXPECT_EQ(fast->calls, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {4, 1}}));
  EXPECT_EQ(slow->calls, (std::vector<std::pair<size_t, size_t>>{{2, 2}}));
  // Every node was validated by place(): run() says so.
  EXPECT_EQ(fast->validated_calls, fast->calls);
  EXPECT_EQ(slow->validated_calls, slow->calls);

  EXPECT_EQ(s.describe(g),
            "0 add y -> fast\n"
            "1 add y -> fast\n"
            "2 mul z -> slow\n"
            "3 silu z -> slow\n"
            "4 add z -> fast\n");
}

TEST(Scheduler, ErrorNamesTheOpAndEveryReason) {
  auto a = std::make_shared<FakeBackend>("alpha", std::set<Op>{Op::Add});
  auto b = std::make_shared<FakeBackend>("beta", std::set<Op>{Op::Mul});
  Scheduler s({a, b});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  int32_t y = g.new_tensor(DType::F32, {8}, "probs");
  add(g, Op::Add, x, x, x);
  add(g, Op::Softmax, y, x);
  try {
    s.place(g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("node 1"), std::string::npos) << m;
    EXPECT_NE(m.find("softmax"), std::string::npos) << m;
    EXPECT_NE(m.find("probs"), std::string::npos) << m;
    EXPECT_NE(m.find("alpha: no softmax in alpha"), std::string::npos) << m;
    EXPECT_NE(m.find("beta: no softmax in beta"), std::string::npos) << m;
  }
  EXPECT_THROW(s.run(g), Error);
  EXPECT_TRUE(a->calls.empty());  // nothing runs when placement fails

  Scheduler none({});
  EXPECT_THROW(none.place(g), Error);
  Graph empty;
  EXPECT_TRUE(none.place(empty).empty());
  EXPECT_EQ(none.describe(empty), "");
}

namespace {

// The FallsBackDownTheRanking graph, with x of n elements.
void five_nodes(Graph& g, int64_t n, const char* prefix = "") {
  int32_t x = g.new_tensor(DType::F32, {n}, std::string(prefix) + "x");
  int32_t y = g.new_tensor(DType::F32, {n}, std::string(prefix) + "y");
  int32_t z = g.new_tensor(DType::F32, {n}, std::string(prefix) + "z");
  add(g, Op::Add, y, x, x);
  add(g, Op::Add, y, y, x);
  add(g, Op::Mul, z, y, x);
  add(g, Op::Silu, z, z);
  add(g, Op::Add, z, z, y);
}

// The slots and sequence tables of the graphs step_graph builds (alive while the tests run).
std::list<test::PagedStep> g_paged;

// A decode-like step: kv_write and attention at position `pos` of sequence `seq` (its
// positions reserved in `kv`), then the recurrent ops of sequence `seq`, over `kv`
// (see step_cache).
void step_graph(Graph& g, int32_t seq, int32_t pos, int32_t layer, float scale, KvCache* kv) {
  int32_t k = g.new_tensor(DType::F32, {8, 2, 1});
  int32_t v = g.new_tensor(DType::F32, {8, 2, 1});
  int32_t q = g.new_tensor(DType::F32, {8, 4, 1});
  int32_t o = g.new_tensor(DType::F32, {8, 4, 1});
  test::PagedStep& ps = g_paged.emplace_back();
  test::add_paged_inputs(g, *kv, layer, seq, pos, 1, ps);
  g.add_node(test::kv_write_node(ps, false, k));
  g.add_node(test::kv_write_node(ps, true, v));
  g.add_node(test::attention_node(ps, q, o, scale));
  int32_t x = g.new_tensor(DType::F32, {16, 1});
  int32_t kern = g.new_tensor(DType::F32, {4, 16});
  int32_t c = g.new_tensor(DType::F32, {16, 1});
  Node conv;
  conv.op = Op::SsmConv;
  conv.dst = c;
  conv.src = {x, kern, -1, -1, -1};
  conv.i[0] = layer;
  conv.i[1] = seq;
  conv.kv = kv;
  g.add_node(conv);
  int32_t gg = g.new_tensor(DType::F32, {2, 1});
  int32_t beta = g.new_tensor(DType::F32, {2, 1});
  int32_t out = g.new_tensor(DType::F32, {4, 2, 1});
  Node dn;
  dn.op = Op::GatedDeltaNet;
  dn.dst = out;
  dn.src = {c, gg, beta, -1, -1};
  dn.i = {layer, seq, 1, 4, 0, 0, 0, 0};
  dn.kv = kv;
  g.add_node(dn);
}

// The cache step_graph's nodes fit (2 layers of 2 KV heads of 8, 2 recurrent layers).
KvCacheConfig step_cache() {
  KvCacheConfig c;
  c.n_layers = 2, c.n_kv_heads = 2, c.head_dim = 8, c.page_tokens = 16, c.n_pages = 16;
  c.recurrent = RecurrentStateConfig{2, 3 * 16, 4 * 4 * 2};
  return c;
}

}  // namespace

TEST(Scheduler, PlacementIsCachedByTopology) {
  auto fast = std::make_shared<FakeBackend>("fast", std::set<Op>{Op::Add});
  auto slow = std::make_shared<FakeBackend>("slow", std::set<Op>{Op::Add, Op::Mul, Op::Silu});
  Scheduler s({fast, slow});
  Graph g;
  five_nodes(g, 8);
  g.allocate();
  const std::vector<int> want{0, 0, 1, 1, 0};
  EXPECT_EQ(s.place(g), want);
  EXPECT_EQ(s.plan_misses(), 1u);
  EXPECT_EQ(s.plan_hits(), 0u);
  const size_t fast_calls = fast->supports_calls, slow_calls = slow->supports_calls;
  EXPECT_EQ(fast_calls, 5u);
  EXPECT_EQ(slow_calls, 2u);

  // The same topology again (the same graph, then another graph with other names): hits,
  // and no backend is asked.
  EXPECT_EQ(s.place(g), want);
  Graph g2;
  five_nodes(g2, 8, "other_");
  g2.allocate();
  EXPECT_EQ(s.place(g2), want);
  s.run(g2);
  EXPECT_EQ(s.plan_misses(), 1u);
  EXPECT_EQ(s.plan_hits(), 3u);
  EXPECT_EQ(fast->supports_calls, fast_calls);
  EXPECT_EQ(slow->supports_calls, slow_calls);
  EXPECT_EQ(fast->calls, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {4, 1}}));
  EXPECT_EQ(slow->calls, (std::vector<std::pair<size_t, size_t>>{{2, 2}}));
  // Validated by the cached placement: execute_validated() without any supports().
  EXPECT_EQ(fast->validated_calls, fast->calls);
  EXPECT_EQ(slow->validated_calls, slow->calls);
  // The placement on a hit is a fresh scheduler's placement.
  Scheduler fresh({fast, slow});
  EXPECT_EQ(fresh.place(g2), s.place(g2));

  // A changed shape, a changed stride or storage that is missing: misses.
  Graph g3;
  five_nodes(g3, 16);
  g3.allocate();
  EXPECT_EQ(s.place(g3), want);
  EXPECT_EQ(s.plan_misses(), 2u);
  EXPECT_GT(fast->supports_calls, fast_calls);
  Graph g4;
  five_nodes(g4, 8);
  g4.allocate();
  g4.tensor(0).nb[1] = 64;
  s.place(g4);
  EXPECT_EQ(s.plan_misses(), 3u);
  Graph g5;
  five_nodes(g5, 8);  // not allocated: data null
  s.place(g5);
  EXPECT_EQ(s.plan_misses(), 4u);
  // describe() uses the cache too.
  const size_t hits = s.plan_hits();
  EXPECT_EQ(s.describe(g), "0 add y -> fast\n1 add y -> fast\n2 mul z -> slow\n3 silu z -> slow\n4 add z -> fast\n");
  EXPECT_EQ(s.plan_hits(), hits + 1);
}

TEST(Scheduler, SignatureIgnoresSequenceAndPosition) {
  KvCache kv(step_cache());
  for (int i = 0; i < 4; ++i) ASSERT_EQ(kv.create_sequence(), i);
  ASSERT_TRUE(kv.reserve(0, 1));
  ASSERT_TRUE(kv.reserve(3, 118));
  Graph a, b, c;
  step_graph(a, 0, 0, 0, 0.125f, &kv);
  step_graph(b, 3, 9, 0, 0.125f, &kv);  // other sequence, other position: the same topology
  a.allocate(), b.allocate();
  EXPECT_EQ(Scheduler::signature(a), Scheduler::signature(b));
  // The sequence table's pages come in powers of two: 5 and 8 pages share a shape.
  Graph p5, p8;
  step_graph(p5, 3, 70, 0, 0.125f, &kv);
  step_graph(p8, 3, 117, 0, 0.125f, &kv);
  p5.allocate(), p8.allocate();
  EXPECT_EQ(Scheduler::signature(p5), Scheduler::signature(p8));
  EXPECT_NE(Scheduler::signature(a), Scheduler::signature(p8));
  step_graph(c, 0, 0, 1, 0.125f, &kv);  // another layer
  c.allocate();
  EXPECT_NE(Scheduler::signature(a), Scheduler::signature(c));
  Graph d;
  step_graph(d, 0, 0, 0, 0.25f, &kv);  // another scale
  d.allocate();
  EXPECT_NE(Scheduler::signature(a), Scheduler::signature(d));
  Graph e;
  step_graph(e, 0, 0, 0, 0.125f, &kv);
  Node extra;  // one node more
  extra.op = Op::Silu;
  extra.dst = 0;
  extra.src[0] = 0;
  e.add_node(extra);
  e.allocate();
  EXPECT_NE(Scheduler::signature(a), Scheduler::signature(e));
  // GatedDeltaNet's i[2] (Hk) is topology, unlike its i[1].
  Graph f, f3;
  step_graph(f, 0, 0, 0, 0.125f, &kv);
  step_graph(f3, 0, 0, 0, 0.125f, &kv);
  Node dn = f.nodes().back();
  f.add_node(dn);
  dn.i[2] = 2;
  f3.add_node(dn);
  EXPECT_NE(Scheduler::signature(f), Scheduler::signature(f3));

  auto be = std::make_shared<FakeBackend>(
      "all", std::set<Op>{Op::KvWrite, Op::Attention, Op::SsmConv, Op::GatedDeltaNet});
  Scheduler s({be});
  s.run(a);
  const size_t asked = be->supports_calls;
  s.run(b);
  EXPECT_EQ(s.plan_misses(), 1u);
  EXPECT_EQ(s.plan_hits(), 1u);
  EXPECT_EQ(be->supports_calls, asked);
  s.run(c);
  EXPECT_EQ(s.plan_misses(), 2u);
}

TEST(Scheduler, ErrorsAreNeverCached) {
  auto a = std::make_shared<FakeBackend>("alpha", std::set<Op>{Op::Add});
  Scheduler s({a});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  int32_t y = g.new_tensor(DType::F32, {8}, "probs");
  add(g, Op::Add, x, x, x);
  add(g, Op::Softmax, y, x);
  EXPECT_THROW(s.place(g), Error);
  const size_t asked = a->supports_calls;
  EXPECT_THROW(s.place(g), Error);
  EXPECT_GT(a->supports_calls, asked);
  EXPECT_THROW(s.run(g), Error);
  EXPECT_EQ(s.plan_hits(), 0u);
  EXPECT_EQ(s.plan_misses(), 3u);
  EXPECT_TRUE(a->calls.empty());
}

TEST(Scheduler, CacheIsClearedWhenFull) {
  auto be = std::make_shared<FakeBackend>("all", std::set<Op>{Op::Add, Op::Mul, Op::Silu});
  Scheduler s({be});
  std::vector<std::unique_ptr<Graph>> graphs;
  for (size_t n = 0; n <= Scheduler::kPlanCacheSize; ++n) {
    graphs.push_back(std::make_unique<Graph>());
    five_nodes(*graphs.back(), int64_t(n + 1));
    EXPECT_EQ(s.place(*graphs.back()), (std::vector<int>{0, 0, 0, 0, 0}));
  }
  EXPECT_EQ(s.plan_misses(), Scheduler::kPlanCacheSize + 1);
  s.place(*graphs.back());  // the latest survives the clear
  EXPECT_EQ(s.plan_hits(), 1u);
  s.place(*graphs.front());  // the first does not
  EXPECT_EQ(s.plan_misses(), Scheduler::kPlanCacheSize + 2);
}

TEST(Scheduler, ProfileTimesEveryNodeOnItsOwn) {
  auto fast = std::make_shared<FakeBackend>("fast", std::set<Op>{Op::Add});
  auto slow = std::make_shared<FakeBackend>("slow", std::set<Op>{Op::Add, Op::Mul, Op::Silu});
  Scheduler s({fast, slow});
  Graph g;
  five_nodes(g, 8);
  g.allocate();
  OpProfile p;
  s.set_profile(&p);
  EXPECT_EQ(s.profile(), &p);
  s.run(g);
  EXPECT_EQ(fast->calls, (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 1}, {4, 1}}));
  EXPECT_EQ(slow->calls, (std::vector<std::pair<size_t, size_t>>{{2, 1}, {3, 1}}));
  EXPECT_EQ(fast->validated_calls, fast->calls);
  EXPECT_EQ(slow->validated_calls, slow->calls);
  EXPECT_EQ(p.nodes("fast", Op::Add), 3u);
  EXPECT_EQ(p.nodes("slow", Op::Mul), 1u);
  EXPECT_EQ(p.nodes("slow", Op::Silu), 1u);
  EXPECT_EQ(p.nodes("slow", Op::Add), 0u);
  EXPECT_EQ(p.stats.size(), 3u);
  s.run(g);
  EXPECT_EQ(p.nodes("fast", Op::Add), 6u);
  EXPECT_EQ(p.total_ns(), p.ns("fast", Op::Add) + p.ns("slow", Op::Mul) + p.ns("slow", Op::Silu));

  const std::string t = p.table();
  EXPECT_NE(t.find("fast"), std::string::npos) << t;
  EXPECT_NE(t.find("add"), std::string::npos) << t;
  EXPECT_NE(t.find("silu"), std::string::npos) << t;
  EXPECT_NE(t.find("total"), std::string::npos) << t;
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 5) << t;  // header, 3 rows, total

  // Sorted by time, largest first.
  OpProfile q;
  q.add("cpu", Op::MatMul, 3'000'000);
  q.add("cpu", Op::MatMul, 3'000'000);
  q.add("cpu", Op::Add, 1'000'000);
  q.add("gpu", Op::Attention, 2'000'000);
  const std::string tq = q.table();
  EXPECT_LT(tq.find("mat_mul"), tq.find("attention")) << tq;
  EXPECT_LT(tq.find("attention"), tq.find("add")) << tq;
  EXPECT_NE(tq.find("6.000"), std::string::npos) << tq;
  EXPECT_NE(tq.find("66.7%"), std::string::npos) << tq;
  EXPECT_NE(tq.find("9.000"), std::string::npos) << tq;  // the total line
  q.clear();
  EXPECT_TRUE(q.stats.empty());

  // Off again: runs are grouped as before.
  s.set_profile(nullptr);
  fast->calls.clear();
  s.run(g);
  EXPECT_EQ(fast->calls, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {4, 1}}));
}

// Host hooks run between nodes, in order, and split a backend's run there.
TEST(Scheduler, HostHooksRunBetweenNodesAndSplitRuns) {
  auto be = std::make_shared<FakeBackend>("be", std::set<Op>{Op::Add});
  Scheduler s({be});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  for (int i = 0; i < 4; ++i) add(g, Op::Add, x, x, x);
  g.allocate();
  std::vector<std::string> log;
  g.add_host_hook(4, [&](Graph&) { log.push_back("after all, calls " + std::to_string(be->calls.size())); });
  g.add_host_hook(2, [&](Graph&) { log.push_back("before 2, calls " + std::to_string(be->calls.size())); });
  g.add_host_hook(2, [&](Graph&) { log.push_back("before 2 again"); });
  s.run(g);
  EXPECT_EQ(be->calls, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 2}}));
  EXPECT_EQ(log, (std::vector<std::string>{"before 2, calls 1", "before 2 again", "after all, calls 2"}));
  // Profiled runs go node by node and time the hooks as "host".
  OpProfile prof;
  s.set_profile(&prof);
  log.clear();
  s.run(g);
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(prof.nodes("host", Op::Add), 1u);
  g.reset();
  EXPECT_TRUE(g.host_hooks().empty());
}
