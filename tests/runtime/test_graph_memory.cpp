// Graph's liveness memory plan (set_memory_reuse): reuse along a chain, aliases keep
// their storage alive, outputs survive, no node's output overlaps anything alive at
// that node or anything a short fused run of nodes reads, reset() semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessera/graph.h"

using namespace tessera;

namespace {

constexpr int32_t kForever = INT32_MAX;

Node node(Op op, int32_t dst, int32_t a, int32_t b = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src = {a, b, -1, -1, -1};
  return n;
}

// Bytes a tensor's elements span (views may be strided).
size_t span_bytes(const Tensor& t) {
  size_t last = dtype_traits(t.type).block_bytes;
  for (int d = 0; d < Tensor::kMaxDims; ++d) last += size_t(t.ne[d] - 1) * t.nb[d];
  return last;
}

bool overlap(const Tensor& a, const Tensor& b) {
  auto* pa = static_cast<const char*>(a.data);
  auto* pb = static_cast<const char*>(b.data);
  return pa < pb + span_bytes(b) && pb < pa + span_bytes(a);
}

float& at(const Tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return *reinterpret_cast<float*>(static_cast<char*>(t.data) + size_t(i0) * t.nb[0] + size_t(i1) * t.nb[1] +
                                   size_t(i2) * t.nb[2] + size_t(i3) * t.nb[3]);
}

// A tiny reference executor for the elementwise ops these graphs use (F32, any strides).
void execute(Graph& g) {
  for (const Node& n : g.nodes()) {
    const Tensor& d = g.tensor(n.dst);
    const Tensor& a = g.tensor(n.src[0]);
    const Tensor* b = n.src[1] >= 0 ? &g.tensor(n.src[1]) : nullptr;
    for (int64_t i3 = 0; i3 < d.ne[3]; ++i3)
      for (int64_t i2 = 0; i2 < d.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < d.ne[1]; ++i1)
          for (int64_t i0 = 0; i0 < d.ne[0]; ++i0) {
            const float x = at(a, i0, i1, i2, i3);
            const float y = b ? at(*b, i0, i1, i2, i3) : 0.0f;
            float r = 0;
            switch (n.op) {
              case Op::Add: r = x + y; break;
              case Op::Mul: r = x * y; break;
              case Op::Silu: r = x / (1.0f + std::exp(-x)); break;
              case Op::SwiGlu: r = x / (1.0f + std::exp(-x)) * y; break;
              case Op::Cont: r = x; break;
              default: ADD_FAILURE() << "op not in the test executor"; break;
            }
            at(d, i0, i1, i2, i3) = r;
          }
  }
}

// Per storage root, the node interval the plan must keep it for (the spec, computed
// independently of graph.cpp): first node naming it (0 if first read), last node
// naming it; outputs and roots no node names: to the end.
struct Life {
  int32_t first = -1, last = -1;
};
std::vector<Life> lifetimes(const Graph& g, const std::vector<int32_t>& outputs) {
  std::vector<Life> life(g.tensor_count());
  const auto& nodes = g.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    for (int32_t s : nodes[k].src) {
      if (s < 0 || g.storage_root(s) < 0) continue;
      Life& l = life[size_t(g.storage_root(s))];
      if (l.first < 0) l.first = 0;
      l.last = int32_t(k);
    }
    if (nodes[k].dst >= 0 && g.storage_root(nodes[k].dst) >= 0) {
      Life& l = life[size_t(g.storage_root(nodes[k].dst))];
      if (l.first < 0) l.first = int32_t(k);
      l.last = int32_t(k);
    }
  }
  for (int32_t o : outputs)
    if (g.storage_root(o) >= 0) {
      Life& l = life[size_t(g.storage_root(o))];
      if (l.first < 0) l.first = 0;
      l.last = kForever;
    }
  for (size_t t = 0; t < g.tensor_count(); ++t)
    if (g.storage_root(int32_t(t)) == int32_t(t) && life[t].first < 0) life[t] = {0, kForever};
  return life;
}

bool is_root(const Graph& g, size_t t) { return g.storage_root(int32_t(t)) == int32_t(t); }

// Every check on a planned (allocated) graph.
void check_plan(const Graph& g, const std::vector<int32_t>& outputs) {
  const std::vector<Life> life = lifetimes(g, outputs);
  const auto& nodes = g.nodes();
  const size_t T = g.tensor_count();
  // Aliases lie inside their root.
  for (size_t t = 0; t < T; ++t) {
    const int32_t r = g.storage_root(int32_t(t));
    if (r < 0) continue;
    const auto* p = static_cast<const char*>(g.tensor(int32_t(t)).data);
    const auto* base = static_cast<const char*>(g.tensor(r).data);
    EXPECT_GE(p, base) << t;
    EXPECT_LE(p + span_bytes(g.tensor(int32_t(t))), base + span_bytes(g.tensor(r))) << t;
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.dst < 0 || g.storage_root(n.dst) < 0) continue;
    const int32_t dr = g.storage_root(n.dst);
    // The node's dst never overlaps one of its srcs (unless it is the same storage).
    for (int32_t s : n.src) {
      if (s >= 0 && g.storage_root(s) != dr) {
        EXPECT_FALSE(overlap(g.tensor(n.dst), g.tensor(s))) << "node " << k << " dst overlaps src " << s;
      }
    }
    // ... nor any root alive at this node.
    for (size_t r = 0; r < T; ++r) {
      if (is_root(g, r) && int32_t(r) != dr && life[r].first <= int32_t(k) && int32_t(k) <= life[r].last) {
        EXPECT_FALSE(overlap(g.tensor(dr), g.tensor(int32_t(r))))
            << "node " << k << " dst root " << dr << " overlaps live root " << r;
      }
    }
  }
  // The window: two roots sharing memory are reuse_window() nodes apart at least.
  for (size_t a = 0; a < T; ++a) {
    if (!is_root(g, a)) continue;
    for (size_t b = 0; b < T; ++b) {
      if (b == a || !is_root(g, b) || !overlap(g.tensor(int32_t(a)), g.tensor(int32_t(b)))) continue;
      const Life& la = life[a];
      const Life& lb = life[b];
      const bool a_then_b = la.last != kForever && int64_t(lb.first) >= int64_t(la.last) + g.reuse_window();
      const bool b_then_a = lb.last != kForever && int64_t(la.first) >= int64_t(lb.last) + g.reuse_window();
      EXPECT_TRUE(a_then_b || b_then_a) << "roots " << a << " [" << la.first << ", " << la.last << "] and " << b
                                        << " [" << lb.first << ", " << lb.last << "] share memory too soon";
    }
  }
  // What a fused run of reuse_window() consecutive nodes reads is never written by the run.
  for (size_t k = 0; k < nodes.size(); ++k) {
    const size_t end = std::min(nodes.size(), k + size_t(g.reuse_window()));
    for (size_t w = k; w < end; ++w) {
      const int32_t d = nodes[w].dst;
      if (d < 0 || g.storage_root(d) < 0) continue;
      for (size_t r = k; r < end; ++r) {
        for (int32_t s : nodes[r].src) {
          if (s >= 0 && g.storage_root(s) >= 0 && g.storage_root(s) != g.storage_root(d)) {
            EXPECT_FALSE(overlap(g.tensor(d), g.tensor(s)))
                << "run at " << k << ": node " << w << " writes over a src of node " << r;
          }
        }
      }
    }
  }
}

// x0 -> silu -> x1 -> silu -> ... -> xN; returns the tensors in order.
std::vector<int32_t> chain(Graph& g, int n, int64_t elems = 1024) {
  std::vector<int32_t> x{g.new_tensor(DType::F32, {elems}, "x0")};
  for (int k = 0; k < n; ++k) {
    x.push_back(g.new_tensor(DType::F32, {elems}));
    g.add_node(node(Op::Silu, x.back(), x[x.size() - 2]));
  }
  return x;
}

// A layered graph of elementwise ops with reshapes, row views, strided views and
// Cont, two caller-filled inputs (one first read late) and an external weight.
struct Built {
  int32_t in = -1, late = -1;
  std::vector<int32_t> outputs;
};
Built build_layers(Graph& g, std::vector<float>& weight, bool mark) {
  constexpr int64_t K = 64, N = 8;
  Built b;
  weight.resize(size_t(K * N));
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.5f + 0.01f * float(i % 37);
  const int32_t w = g.add_tensor(Tensor::contiguous(DType::F32, {K, N}, weight.data()));
  b.in = g.new_tensor(DType::F32, {K, N}, "in");
  b.late = g.new_tensor(DType::F32, {K, N}, "late");
  int32_t h = b.in;
  for (int l = 0; l < 4; ++l) {
    const int32_t n1 = g.new_tensor(DType::F32, {K, N});
    g.add_node(node(Op::Mul, n1, h, w));
    const int32_t gate = g.new_tensor(DType::F32, {K, N});
    g.add_node(node(Op::Silu, gate, n1));
    const int32_t up = g.new_tensor(DType::F32, {K, N});
    g.add_node(node(Op::Add, up, n1, h));
    const int32_t s = g.new_tensor(DType::F32, {K, N});
    g.add_node(node(Op::SwiGlu, s, gate, up));
    // Second half of every row of s, through a reshape and a strided view, made contiguous.
    const int32_t sr = g.reshape(s, {K / 2, 2 * N});
    const int32_t v = g.view(sr, {K / 2, N, 1, 1}, {size_t(K) * 4, size_t(K * N) * 4, size_t(K * N) * 4},
                             size_t(K / 2) * 4);
    const int32_t c = g.new_tensor(DType::F32, {K / 2, N});
    g.add_node(node(Op::Cont, c, v));
    // A few unrelated nodes, then rows of s read again much later.
    const int32_t t1 = g.new_tensor(DType::F32, {K / 2, N});
    g.add_node(node(Op::Silu, t1, c));
    const int32_t t2 = g.new_tensor(DType::F32, {K / 2, N});
    g.add_node(node(Op::Add, t2, t1, c));
    const int32_t t3 = g.new_tensor(DType::F32, {K / 2, N});
    g.add_node(node(Op::Mul, t3, t2, t1));
    const int32_t t4 = g.new_tensor(DType::F32, {K / 2, N});
    g.add_node(node(Op::Silu, t4, t3));
    const int32_t rows = g.view_rows(s, 2, N - 2);
    const int32_t r2 = g.new_tensor(DType::F32, {K, N - 2});
    g.add_node(node(Op::Silu, r2, rows));
    const int32_t h2 = g.new_tensor(DType::F32, {K, N});
    g.add_node(node(Op::Add, h2, h, l == 3 ? b.late : s));  // `late` is first read here
    if (mark && l == 1) b.outputs.push_back(c);                   // an intermediate output
    if (mark && l == 2) b.outputs.push_back(g.reshape(gate, {K * N}));  // through an alias
    if (mark && l == 2) b.outputs.push_back(g.view_rows(r2, 1, 2));     // a view of one
    if (mark && l == 3) b.outputs.push_back(t4);
    h = h2;
  }
  if (mark) b.outputs.push_back(h);
  for (int32_t o : b.outputs) g.mark_output(o);
  return b;
}

void fill_inputs(Graph& g, const Built& b) {
  for (int32_t t : {b.in, b.late}) {
    const Tensor& x = g.tensor(t);
    auto* p = static_cast<float*>(x.data);
    for (int64_t i = 0; i < x.nelements(); ++i) p[i] = std::sin(0.1f * float(i) + (t == b.late ? 1.0f : 0.0f));
  }
}

std::vector<float> contents(const Tensor& t) {
  std::vector<float> v;
  for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) v.push_back(at(t, i0, i1, i2, i3));
  return v;
}

}  // namespace

TEST(GraphMemory, ReuseIsOffByDefaultAndLinear) {
  Graph g;
  EXPECT_FALSE(g.memory_reuse());
  auto x = chain(g, 10, 100);  // 400 bytes -> 448-byte blocks
  g.allocate();
  EXPECT_EQ(g.scratch_bytes(), size_t(11 * 448));
  for (size_t k = 1; k < x.size(); ++k)
    EXPECT_EQ(static_cast<char*>(g.tensor(x[k]).data) - static_cast<char*>(g.tensor(x[k - 1]).data), 448);
}

TEST(GraphMemory, ChainNeedsAConstantNumberOfBlocks) {
  constexpr size_t kBlock = 1024 * 4;
  for (int32_t window : {1, 4}) {
    size_t first_bytes = 0;
    for (int n : {16, 64, 512}) {
      Graph g;
      g.set_memory_reuse(true, window);
      auto x = chain(g, n);
      g.mark_output(x.back());
      g.allocate();
      const size_t bytes = g.scratch_bytes();
      EXPECT_GE(bytes, 2 * kBlock) << n;
      EXPECT_LE(bytes, size_t(window + 2) * kBlock) << n;
      if (!first_bytes) first_bytes = bytes;
      EXPECT_EQ(bytes, first_bytes) << "independent of the chain length, n = " << n << ", window " << window;
      check_plan(g, {x.back()});

      Graph linear;
      chain(linear, n);
      linear.allocate();
      EXPECT_EQ(linear.scratch_bytes(), size_t(n + 1) * kBlock) << n;
    }
  }
}

TEST(GraphMemory, FusionWindowIsRespected) {
  for (int32_t window : {1, 2, 4, 7}) {
    Graph g;
    g.set_memory_reuse(true, window);
    EXPECT_EQ(g.reuse_window(), window);
    auto x = chain(g, 40);
    g.mark_output(x.back());
    g.allocate();
    check_plan(g, {x.back()});
    // x[k] is written by node k-1 and last read by node k: its memory may go to a
    // tensor first written at node k + window (that is x[k + window + 1]) or later.
    bool reused = false, at_the_window = false;
    for (size_t a = 0; a < x.size(); ++a)
      for (size_t b = a + 1; b < x.size(); ++b)
        if (overlap(g.tensor(x[a]), g.tensor(x[b]))) {
          reused = true;
          at_the_window |= b == a + size_t(window) + 1;
          EXPECT_GE(b, a + size_t(window) + 1) << "window " << window << ": " << a << " " << b;
        }
    EXPECT_TRUE(reused) << window;
    EXPECT_TRUE(at_the_window) << "window " << window << ": memory is reused no later than it may be";
  }
  Graph g;
  EXPECT_THROW(g.set_memory_reuse(true, 0), std::exception);
}

TEST(GraphMemory, ViewsAndReshapesKeepTheirSourceAlive) {
  Graph g;
  g.set_memory_reuse(true);
  const int32_t in = g.new_tensor(DType::F32, {256, 4}, "in");
  const int32_t a = g.new_tensor(DType::F32, {256, 4}, "a");
  g.add_node(node(Op::Silu, a, in));
  const int32_t r = g.reshape(a, {1024});
  const int32_t v = g.view_rows(a, 1, 2);
  const int32_t sv = g.view(a, {128, 4, 1, 1}, {1024, 4096, 4096}, 512);
  // A long chain that names none of a's aliases, then each alias read in turn.
  auto x = chain(g, 30, 1024);
  const int32_t o1 = g.new_tensor(DType::F32, {1024});
  g.add_node(node(Op::Add, o1, r, x.back()));
  auto y = chain(g, 20, 1024);
  const int32_t o2 = g.new_tensor(DType::F32, {256, 2});
  g.add_node(node(Op::Silu, o2, v));
  auto z = chain(g, 20, 1024);
  const int32_t o3 = g.new_tensor(DType::F32, {128, 4});
  g.add_node(node(Op::Cont, o3, sv));
  g.allocate();
  EXPECT_EQ(g.storage_root(r), a);
  EXPECT_EQ(g.storage_root(v), a);
  EXPECT_EQ(g.storage_root(sv), a);
  EXPECT_EQ(g.storage_root(in), in);
  check_plan(g, {});
  // Nothing written between a's first and last node overlaps it.
  const auto& nodes = g.nodes();
  for (size_t k = 1; k + 1 < nodes.size(); ++k)
    EXPECT_FALSE(overlap(g.tensor(nodes[k].dst), g.tensor(a))) << "node " << k;
  EXPECT_LT(g.scratch_bytes(), size_t(20) * 4096);  // yet the chains reuse memory
}

TEST(GraphMemory, OutputsAreNeverOverwritten) {
  std::vector<float> w_ref, w_reuse;
  Graph ref;  // reuse off: every tensor keeps its own memory
  Built br = build_layers(ref, w_ref, true);
  ref.allocate();
  fill_inputs(ref, br);
  execute(ref);

  Graph g;
  g.set_memory_reuse(true, 4);
  Built bg = build_layers(g, w_reuse, true);
  ASSERT_EQ(bg.outputs.size(), br.outputs.size());
  for (int step = 0; step < 2; ++step) {  // the second step runs over the first's stale values
    g.allocate();
    EXPECT_LT(g.scratch_bytes(), ref.scratch_bytes());
    check_plan(g, bg.outputs);
    fill_inputs(g, bg);
    execute(g);
    for (size_t i = 0; i < bg.outputs.size(); ++i) {
      const std::vector<float> want = contents(ref.tensor(br.outputs[i]));
      const std::vector<float> got = contents(g.tensor(bg.outputs[i]));
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "output " << i;
    }
  }
}

TEST(GraphMemory, NoNodeOverlapsAnythingAliveWithoutOutputs) {
  std::vector<float> w;
  Graph g;
  g.set_memory_reuse(true, 4);
  Built b = build_layers(g, w, false);
  const int32_t unused = g.new_tensor(DType::F32, {333}, "unused");  // named by no node
  g.allocate();
  check_plan(g, {});
  EXPECT_NE(g.tensor(unused).data, nullptr);
  // `late` is filled before execution and first read by the last node: it lives from
  // node 0, so no node writes over it.
  for (const Node& n : g.nodes()) {
    EXPECT_FALSE(overlap(g.tensor(n.dst), g.tensor(unused)));
    EXPECT_FALSE(overlap(g.tensor(n.dst), g.tensor(b.late)));
  }
}

TEST(GraphMemory, ResetKeepsTheFlagAndForgetsOutputs) {
  Graph g;
  g.set_memory_reuse(true);
  auto x = chain(g, 30);
  g.mark_output(x[5]);
  g.mark_output(x.back());
  g.allocate();
  for (size_t k = 6; k < x.size(); ++k) EXPECT_FALSE(overlap(g.tensor(x[5]), g.tensor(x[k]))) << k;
  const size_t with_output = g.scratch_bytes();

  g.reset();
  EXPECT_TRUE(g.memory_reuse());
  EXPECT_EQ(g.scratch_bytes(), with_output);  // what the last allocate() needed
  x = chain(g, 30);
  g.allocate();
  bool reused = false;
  for (size_t k = 6; k < x.size(); ++k) reused |= overlap(g.tensor(x[5]), g.tensor(x[k]));
  EXPECT_TRUE(reused) << "x5 is no longer an output after reset()";
  EXPECT_LT(g.scratch_bytes(), with_output);
  check_plan(g, {});

  g.set_memory_reuse(false);
  g.reset();
  EXPECT_FALSE(g.memory_reuse());
  chain(g, 30);
  g.allocate();
  EXPECT_EQ(g.scratch_bytes(), size_t(31) * 4096);
}

TEST(GraphMemory, EmptyGraphAndMarkOutputErrors) {
  Graph g;
  g.set_memory_reuse(true);
  g.allocate();
  EXPECT_EQ(g.scratch_bytes(), 0u);
  const int32_t a = g.new_tensor(DType::F32, {10});
  const int32_t b = g.new_tensor(DType::F32, {10});
  g.allocate();  // no nodes: both kept, apart
  EXPECT_FALSE(overlap(g.tensor(a), g.tensor(b)));
  EXPECT_THROW(g.mark_output(7), std::exception);
  EXPECT_THROW(g.mark_output(-1), std::exception);
}
