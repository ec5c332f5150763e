#include "product_planner.h"

#include <utility>

#include "kernels.h"
#include "tensor_layout.h"

namespace tessera::cpu_avx512 {

ProductGroup ProductPlanner::repacked_group(const Graph& g, size_t k, size_t end) const {
  ProductGroup grp;
  grp.n = matmul_group(g, k, end, grp.rps, grp.ws, grp.dsts);
  grp.swiglu = fused_swiglu(g, k, end, grp);
  return grp;
}

namespace {

// The MatMul nodes from k on (at most kMaxGroup, before `end`) over node k's x whose
// weights `joins(w, n)` admits (n: how many joined before it), with evenly spaced F32
// outputs that overlap neither x, nor another output, nor a weight of the group (so
// running them at once equals running them in order); ws and dsts receive them.
template <class Joins>
int consecutive_products(const Graph& g, size_t k, size_t end, const Tensor** ws, const Tensor** dsts, Joins&& joins) {
  const auto& nodes = g.nodes();
  const int32_t xi = nodes[k].src[1];
  if (xi < 0 || !g.tensor(xi).data) return 0;
  const Tensor& x = g.tensor(xi);
  int n = 0;
  for (size_t j = k; j < end && n < kMaxGroup; ++j) {
    const Node& nd = nodes[j];
    if (nd.op != Op::MatMul || nd.src[1] != xi || nd.src[0] < 0 || nd.dst < 0) break;
    const Tensor& w = g.tensor(nd.src[0]);
    const Tensor& d = g.tensor(nd.dst);
    if (!w.data || !d.data) break;
    if (!uniform_rows(d) || d.nb[1] % sizeof(float) != 0 || overlaps(d, x)) break;
    if (!joins(w, n)) break;
    bool clash = false;
    for (int i = 0; i < n && !clash; ++i)
      clash = overlaps(d, *dsts[i]) || overlaps_bytes(d, *ws[i]) || overlaps_bytes(*dsts[i], w);
    if (clash || overlaps_bytes(d, w)) break;
    ws[n] = &w;
    dsts[n] = &d;
    ++n;
  }
  return n;
}

}  // namespace

// The products of consecutive_products whose weights have repacked copies of one dtype
// and K, for mat_mul_repacked_group; rps receives the copies (unchecked: see
// mat_mul_repacked_group).
int ProductPlanner::matmul_group(const Graph& g, size_t k, size_t end, const Repacked** rps, const Tensor** ws,
                                 const Tensor** dsts) const {
  return consecutive_products(g, k, end, ws, dsts, [&](const Tensor& w, int n) {
    const Repacked* r = weights_.lookup(w);
    if (!r || (n && (r->type != rps[0]->type || r->K != rps[0]->K))) return false;
    rps[n] = r;
    return true;
  });
}

// The output of a SwiGlu node right after a group of two products (from node k) that
// reads exactly their outputs, all flat F32 of one shape and the output overlapping
// none of the group's tensors: computed inside the products' dispatch (see
// mat_mul_repacked_group). nullptr when it cannot be fused. The group is put in
// gate, up order: a graph may hold up's product first (the order in which a
// builder's function arguments were evaluated, as in `swiglu(matmul(..), matmul(..))`).
// Only for several tokens (prefill): in decode each executor then alternates between
// two weight streams instead of streaming one product, which made decode slower
// (decision 31).
const Tensor* ProductPlanner::fused_swiglu(const Graph& g, size_t k, size_t end, ProductGroup& grp) const {
  const size_t j = k + size_t(grp.n);
  if (grp.n != 2 || j >= end || grp.rps[0]->N != grp.rps[1]->N) return nullptr;
  if (g.tensor(g.nodes()[k].src[1]).nrows() < 2) return nullptr;  // one token
  const Node& sn = g.nodes()[j];
  if (sn.op != Op::SwiGlu || sn.dst < 0 || sn.src[0] < 0 || sn.src[1] < 0) return nullptr;
  if (&g.tensor(sn.src[0]) == grp.dsts[1] && &g.tensor(sn.src[1]) == grp.dsts[0]) {
    std::swap(grp.rps[0], grp.rps[1]);  // the products are independent: any order computes the same
    std::swap(grp.ws[0], grp.ws[1]);
    std::swap(grp.dsts[0], grp.dsts[1]);
  }
  if (&g.tensor(sn.src[0]) != grp.dsts[0] || &g.tensor(sn.src[1]) != grp.dsts[1]) return nullptr;
  const Tensor &y = g.tensor(sn.dst), &gate = *grp.dsts[0], &up = *grp.dsts[1], &x = g.tensor(g.nodes()[k].src[1]);
  if (!y.data || y.type != DType::F32 || gate.type != DType::F32 || up.type != DType::F32) return nullptr;
  if (!flat(y) || !flat(gate) || !flat(up) || !same_shape(y, gate) || !same_shape(y, up)) return nullptr;
  if (overlaps(y, gate) || overlaps(y, up) || overlaps(y, x) || overlaps_bytes(y, *grp.ws[0]) ||
      overlaps_bytes(y, *grp.ws[1]))
    return nullptr;
  return &y;
}

int ProductPlanner::row_group(const Graph& g, size_t k, size_t end, const Tensor** ws, const Tensor** dsts) const {
  return consecutive_products(g, k, end, ws, dsts, [&](const Tensor& w, int n) {
    return kern::format_supported(w.type) && w.ne[2] == 1 && w.ne[3] == 1 &&
           (n == 0 || (w.type == ws[0]->type && w.ne[0] == ws[0]->ne[0]));
  });
}

}  // namespace tessera::cpu_avx512
