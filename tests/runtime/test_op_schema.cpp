// The op schema in the core and the scheduler around it: a malformed node is refused
// once per plan (before any backend is asked), a valid graph is validated once per
// plan however many steps run, the run-time state is checked before every run, a
// node a backend declines runs on the next backend by rank, and a backend that
// declines everything is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cpu_scalar_backend.h"
#include "support/paged_nodes.h"
#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/op_schema.h"
#include "tessera/scheduler.h"

using namespace tessera;

namespace {

Node node(Op op, int32_t dst, int32_t s0, int32_t s1 = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src = {s0, s1, -1, -1, -1};
  return n;
}

// A host backend that computes Add natively (a plain loop), declines every other op
// with a reason, and counts what it is asked and given.
class AddOnly final : public Backend {
 public:
  std::string name() const override { return "add_only"; }
  OpSupport supports(const Graph&, const Node& n) const override {
    ++asked;
    if (n.op == Op::Add) return OpSupport::yes();
    return OpSupport::no(std::string(op_name(n.op)) + ": add_only runs only add");
  }
  void execute(Graph& g, size_t first, size_t count) override {
    op_schema::validate_for_execute(*this, g, first, count);
    execute_validated(g, first, count);
  }
  void execute_validated(Graph& g, size_t first, size_t count) override {
    runs.emplace_back(first, count);
    for (size_t k = first; k < first + count; ++k) {
      const Node& n = g.nodes()[k];
      const Tensor &a = g.tensor(n.src[0]), &b = g.tensor(n.src[1]), &y = g.tensor(n.dst);
      for (int64_t i = 0; i < a.nelements(); ++i)
        static_cast<float*>(y.data)[i] = static_cast<const float*>(a.data)[i] + static_cast<const float*>(b.data)[i];
    }
  }
  mutable size_t asked = 0;
  std::vector<std::pair<size_t, size_t>> runs;
};

// Declines every node.
class DeclinesAll final : public Backend {
 public:
  std::string name() const override { return "declines_all"; }
  OpSupport supports(const Graph&, const Node& n) const override {
    return OpSupport::no(std::string(op_name(n.op)) + ": declines_all runs nothing");
  }
  void execute(Graph&, size_t, size_t) override { throw Error("declines_all: execute called"); }
};

// x -> add(x, x) -> silu -> add(., x) -> silu: four nodes over 8 floats.
struct Chain {
  std::vector<float> x = {-2, -1, -0.5f, 0, 0.5f, 1, 2, 3}, a = std::vector<float>(8), b = std::vector<float>(8),
                     c = std::vector<float>(8), d = std::vector<float>(8);
  Graph g;
  Chain() {
    auto t = [&](std::vector<float>& v, const char* name) {
      Tensor tt = Tensor::contiguous(DType::F32, {8}, v.data());
      tt.name = name;
      return g.add_tensor(tt);
    };
    const int tx = t(x, "x"), ta = t(a, "a"), tb = t(b, "b"), tc = t(c, "c"), td = t(d, "d");
    g.add_node(node(Op::Add, ta, tx, tx));
    g.add_node(node(Op::Silu, tb, ta));
    g.add_node(node(Op::Add, tc, tb, tx));
    g.add_node(node(Op::Silu, td, tc));
  }
  std::vector<float> expected() const {
    std::vector<float> out(8);
    for (size_t i = 0; i < 8; ++i) {
      const float s = 2 * x[i];
      const float u = s / (1.0f + std::exp(-s)) + x[i];
      out[i] = u / (1.0f + std::exp(-u));
    }
    return out;
  }
};

}  // namespace

// A node that breaks its op's contract is refused by the schema, with the message the
// reference used to give, before any backend is asked; errors are not cached.
TEST(OpSchema, MalformedNodeIsRefusedBeforeAnyBackendIsAsked) {
  std::vector<float> x(8, 1.0f), y(8);
  Graph g;
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {8}, x.data()));
  Tensor ty = Tensor::contiguous(DType::F32, {8}, y.data());
  ty.name = "normed";
  const int iy = g.add_tensor(ty);
  Node n = node(Op::RmsNorm, iy, tx);
  n.f[0] = -1.0f;  // eps must be >= 0
  g.add_node(n);
  EXPECT_EQ(op_schema::check(g, g.nodes()[0]), "rms_norm: eps (f[0]) must be a finite value >= 0");

  auto add_only = std::make_shared<AddOnly>();
  Scheduler s({add_only, std::shared_ptr<Backend>(cpu_scalar::make_backend(nullptr))});
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      s.run(g);
      ADD_FAILURE() << "expected tessera::Error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "node 0 (rms_norm -> 'normed') breaks the op schema: rms_norm: eps (f[0]) must be a finite value >= 0");
    }
  }
  EXPECT_EQ(add_only->asked, 0u);
  EXPECT_TRUE(add_only->runs.empty());
  EXPECT_EQ(s.plan_hits(), 0u);  // never cached: checked again on each attempt
  EXPECT_EQ(s.nodes_validated(), 2u);

  // A backend's execute() (outside the scheduler) refuses it too, naming itself.
  auto ref = cpu_scalar::make_backend(nullptr);
  try {
    ref->execute(g, 0, 1);
    ADD_FAILURE() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_scalar: node 0 (rms_norm -> 'normed'): rms_norm: eps"), std::string::npos)
        << e.what();
  }
}

// A valid graph is validated once per plan: many steps later neither the schema nor
// any backend's supports() has been called again.
TEST(OpSchema, ValidationIsOncePerPlanNotPerStep) {
  Chain c;
  auto add_only = std::make_shared<AddOnly>();
  Scheduler s({add_only, std::shared_ptr<Backend>(cpu_scalar::make_backend(nullptr))});
  const uint64_t before = op_schema::checks_made();
  s.run(c.g);
  const uint64_t after_plan = op_schema::checks_made();
  const size_t asked = add_only->asked;
  EXPECT_EQ(s.nodes_validated(), 4u);
  EXPECT_GE(after_plan - before, 4u);  // the scheduler's checks (cpu_scalar's supports() may add its own)
  EXPECT_EQ(asked, 4u);
  for (int step = 0; step < 50; ++step) s.run(c.g);
  EXPECT_EQ(op_schema::checks_made(), after_plan);
  EXPECT_EQ(add_only->asked, asked);
  EXPECT_EQ(s.nodes_validated(), 4u);
  EXPECT_EQ(s.plan_misses(), 1u);
  EXPECT_EQ(s.plan_hits(), 50u);
  EXPECT_EQ(c.d, c.expected());
}

// The nodes a backend declines run on the next backend by rank, in runs of consecutive
// nodes, and the results are right.
TEST(OpSchema, DeclinedNodesRunOnTheNextBackend) {
  Chain c;
  auto add_only = std::make_shared<AddOnly>();
  Scheduler s({add_only, std::shared_ptr<Backend>(cpu_scalar::make_backend(nullptr))});
  EXPECT_EQ(s.place(c.g), (std::vector<int>{0, 1, 0, 1}));
  s.run(c.g);
  EXPECT_EQ(add_only->runs, (std::vector<std::pair<size_t, size_t>>{{0, 1}, {2, 1}}));
  EXPECT_EQ(c.d, c.expected());
  EXPECT_EQ(s.usage()[0].placed, 2u);
  EXPECT_EQ(s.usage()[0].declined, 2u);
  EXPECT_EQ(s.usage()[0].first_decline, "silu: add_only runs only add");
  EXPECT_EQ(s.usage()[1].placed, 2u);
  EXPECT_FALSE(s.declines_everything(0));
  EXPECT_EQ(s.describe(c.g), "0 add a -> add_only\n1 silu b -> cpu_scalar\n2 add c -> add_only\n3 silu d -> cpu_scalar\n");

  // Alone, a backend that declines a node has nowhere to send it: the error names the
  // node and its reason.
  Scheduler alone({add_only});
  try {
    alone.place(c.g);
    ADD_FAILURE() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no backend supports node 1 (silu -> b): add_only: silu: add_only runs only add"),
              std::string::npos)
        << e.what();
  }
}

// A backend that declines every node it is asked about is reported as such.
TEST(OpSchema, BackendThatDeclinesEverythingIsReported) {
  Chain c;
  Scheduler s({std::make_shared<DeclinesAll>(), std::shared_ptr<Backend>(cpu_scalar::make_backend(nullptr))});
  s.run(c.g);
  EXPECT_EQ(c.d, c.expected());
  EXPECT_TRUE(s.declines_everything(0));
  EXPECT_FALSE(s.declines_everything(1));
  EXPECT_EQ(s.usage()[0].placed, 0u);
  EXPECT_EQ(s.usage()[0].declined, 4u);
  EXPECT_EQ(s.usage()[0].first_decline, "add: declines_all runs nothing");
  EXPECT_EQ(s.usage()[1].placed, 4u);
  EXPECT_EQ(s.usage()[1].declined, 0u);
}

// Slots, sequence tables and data pointers are checked by the core before every run
// (their contents are not in the plan); the KV lengths are the engine's, never a
// backend's.
TEST(OpSchema, RunStateIsCheckedBeforeEveryRun) {
  KvCacheConfig cfg;
  cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.head_dim = 8, cfg.page_tokens = 4, cfg.n_pages = 4;
  KvCache kv(cfg);
  const KvCache::SeqId seq = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(seq, 4));
  std::vector<float> k(16, 0.5f), q(16, 0.25f), o(16);
  test::PagedStep ps;
  auto step = [&](Graph& g, int32_t p0) {
    g.reset();
    const int tk = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1, 2}, k.data()));
    const int tq = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1, 2}, q.data()));
    const int to = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1, 2}, o.data()));
    test::add_paged_inputs(g, kv, 0, seq, p0, 2, ps);
    g.add_node(test::kv_write_node(ps, false, tk));
    g.add_node(test::kv_write_node(ps, true, tk));
    g.add_node(test::attention_node(ps, tq, to, 0.5f));
  };
  Scheduler s({std::shared_ptr<Backend>(cpu_scalar::make_backend(nullptr))});
  Graph g;
  step(g, 0);
  s.run(g);
  EXPECT_EQ(kv.length(seq), 0);  // set by the engine after the step, not by a backend
  step(g, 2);
  s.run(g);  // positions [2, 4)
  EXPECT_EQ(s.plan_misses(), 1u);  // positions and pages are not part of the plan
  auto expect_error = [&](const char* what) {
    try {
      s.run(g);
      ADD_FAILURE() << "expected tessera::Error containing '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  ps.data.slots[1] = 16;  // 4 pages of 4
  expect_error("node 0 (kv_write -> 'k_cache.0'): slot 16 (token 1) outside the storage's [0, 16)");
  ps.data.slots[1] = 3;
  ps.data.table[kSeqTableHeader] = 4;
  expect_error("node 2 (attention): sequence table column 0: page 4 (entry 0) outside the storage's [0, 4)");
  ps.data.table[kSeqTableHeader] = kv.block_table(seq)[0];
  ps.data.table[kSeqPos0] = -2;
  expect_error("negative first position -2");
  ps.data.table[kSeqPos0] = 3;  // positions [0, 5) need 2 pages
  expect_error("need 2 pages, the table has 1");
  EXPECT_EQ(s.plan_misses(), 1u);
  EXPECT_EQ(s.nodes_validated(), 3u);
}

// The ops of the deepseek2 family on the reference: Concat joins rows; GroupLimit keeps
// the groups whose two largest values sum highest (the lower group on a tie) and masks
// the rest with -infinity; the schema refuses shapes and parameters that do not fit.
TEST(OpSchema, ConcatAndGroupLimit) {
  auto ref = cpu_scalar::make_backend(nullptr);
  {
    std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8, 9, 10}, y(10, 0.0f);
    Graph g;
    const int ta = g.add_tensor(Tensor::contiguous(DType::F32, {2, 2}, a.data()));
    const int tb = g.add_tensor(Tensor::contiguous(DType::F32, {3, 2}, b.data()));
    const int ty = g.add_tensor(Tensor::contiguous(DType::F32, {5, 2}, y.data()));
    g.add_node(node(Op::Concat, ty, ta, tb));
    ASSERT_EQ(op_schema::check(g, g.nodes()[0]), "");
    ref->execute(g, 0, 1);
    EXPECT_EQ(y, (std::vector<float>{1, 2, 5, 6, 7, 3, 4, 8, 9, 10}));
    const int bad = g.add_tensor(Tensor::contiguous(DType::F32, {4, 2}, y.data()));
    g.add_node(node(Op::Concat, bad, ta, tb));
    EXPECT_NE(op_schema::check(g, g.nodes()[1]).find("must have 5 values per row"), std::string::npos);
  }
  {
    // Four groups of two; row 0: scores 3, 7, 7, 1 (groups 1 and 2 tie): keeping 2 keeps
    // groups 1 and 2; keeping 1 keeps group 1, the lower of the tie.
    std::vector<float> x = {1, 2, 3, 4, 5, 2, 0.5f, 0.5f}, y(8), y1(8);
    Graph g;
    const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1}, x.data()));
    const int ty = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1}, y.data()));
    const int ty1 = g.add_tensor(Tensor::contiguous(DType::F32, {8, 1}, y1.data()));
    Node n = node(Op::GroupLimit, ty, tx);
    n.i[0] = 4, n.i[1] = 2;
    g.add_node(n);
    n.dst = ty1, n.i[1] = 1;
    g.add_node(n);
    ASSERT_EQ(op_schema::check(g, g.nodes()[0]), "");
    ref->execute(g, 0, 2);
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(y, (std::vector<float>{-inf, -inf, 3, 4, 5, 2, -inf, -inf}));
    EXPECT_EQ(y1, (std::vector<float>{-inf, -inf, 3, 4, -inf, -inf, -inf, -inf}));
    Node bad = n;
    bad.i[0] = 3;  // does not divide 8
    g.add_node(bad);
    EXPECT_NE(op_schema::check(g, g.nodes()[2]).find("must divide the row of 8"), std::string::npos);
    bad.i[0] = 4, bad.i[1] = 5;
    g.add_node(bad);
    EXPECT_NE(op_schema::check(g, g.nodes()[3]).find("must be 1 .. 4"), std::string::npos);
  }
}

// MatMulId's expert range (a rank of a distributed run holds experts [i[0], i[1])): the
// slots routed inside it get exactly the rows of the unranged product, the others
// zero rows; a range outside the experts is refused by the schema.
TEST(OpSchema, MatMulIdExpertRange) {
  auto ref = cpu_scalar::make_backend(nullptr);
  const int64_t K = 4, N = 3, E = 4, k = 2, n = 3;
  std::vector<float> w(size_t(K * N * E)), x(size_t(K * n));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 7) - 3) * 0.5f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 5) - 2);
  std::vector<int32_t> ids = {0, 3, 2, 1, 3, 2};  // [k, n]
  std::vector<float> all(size_t(N * k * n), -1.0f), part(size_t(N * k * n), -1.0f);
  Graph g;
  const int tw = g.add_tensor(Tensor::contiguous(DType::F32, {K, N, E}, w.data()));
  const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, 1, n}, x.data()));
  const int ti = g.add_tensor(Tensor::contiguous(DType::I32, {k, n}, ids.data()));
  const int ta = g.add_tensor(Tensor::contiguous(DType::F32, {N, k, n}, all.data()));
  const int tp = g.add_tensor(Tensor::contiguous(DType::F32, {N, k, n}, part.data()));
  Node m = node(Op::MatMulId, ta, tw, tx);
  m.src[2] = ti;
  g.add_node(m);
  m.dst = tp;
  m.i[0] = 2, m.i[1] = 4;  // experts 2 and 3
  g.add_node(m);
  ASSERT_EQ(op_schema::check(g, g.nodes()[1]), "");
  ref->execute(g, 0, 2);
  int inside = 0;
  for (int64_t s = 0; s < k * n; ++s) {
    const bool mine = ids[size_t(s)] >= 2;
    inside += mine;
    for (int64_t r = 0; r < N; ++r) {
      const float got = part[size_t(s * N + r)];
      EXPECT_EQ(got, mine ? all[size_t(s * N + r)] : 0.0f) << "slot " << s << " row " << r;
    }
  }
  EXPECT_EQ(inside, 4);
  Node bad = m;
  bad.i[0] = 3, bad.i[1] = 5;  // past the 4 experts
  g.add_node(bad);
  EXPECT_NE(op_schema::check(g, g.nodes()[2]).find("expert range [3, 5) is not inside [0, 4)"), std::string::npos);
}
