// cpu_avx512's planner: which consecutive nodes of a run it computes as one dispatch.
// Products over one input whose weights the store repacked (q/k/v, gate/up) run as one
// group, with the SwiGlu that reads a gate/up pair fused into it in prefill; products
// over one input of the row-kernel types run as one group of row tiles. A group forms
// only where running it at once equals running its nodes in order (no output overlaps
// the input, another output or a weight of the group).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/graph.h"
#include "weight_store.h"

namespace tessera::cpu_avx512 {

// The most products in one group: also the backend's fusion window.
inline constexpr int kMaxGroup = 4;

// Products that run as one dispatch (matmul_group's result), from graph node `node`,
// and the SwiGlu fused into them (fused_swiglu), if any.
struct ProductGroup {
  size_t node = SIZE_MAX;
  int n = 0;
  const Repacked* rps[kMaxGroup];
  const Tensor *ws[kMaxGroup], *dsts[kMaxGroup];
  const Tensor* swiglu = nullptr;
};

class ProductPlanner {
 public:
  explicit ProductPlanner(const WeightStore& weights) : weights_(weights) {}

  // The repacked products from node k (before `end`) that run as one dispatch
  // (matmul_group), and the SwiGlu fused into them (fused_swiglu); n = 0 when node k's
  // weight has no repacked copy.
  ProductGroup repacked_group(const Graph& g, size_t k, size_t end) const;
  // Consecutive products (from node k, up to kMaxGroup) over one x whose weights are of
  // one of the format-kernel types (GGUF layout, row kernels), one dtype and K, with the
  // same non-overlap conditions as matmul_group: q/k and gate/up of an IQ4_XS or Q3_K
  // model then wait once for the slower executor, as repacked groups do (decision 25).
  int row_group(const Graph& g, size_t k, size_t end, const Tensor** ws, const Tensor** dsts) const;

 private:
  int matmul_group(const Graph& g, size_t k, size_t end, const Repacked** rps, const Tensor** ws,
                   const Tensor** dsts) const;
  const Tensor* fused_swiglu(const Graph& g, size_t k, size_t end, ProductGroup& grp) const;

  const WeightStore& weights_;
};

}  // namespace tessera::cpu_avx512
