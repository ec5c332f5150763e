// Routed experts split over the ranks of a distributed run (rank_group.h): each rank
// computes the products of its own experts and the ranks exchange them before the
// weighted sum, so every rank sums every slot in the order one process does.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/graph.h"
#include "tessera/rank_group.h"

namespace tessera::detail {

// In a built graph: gives every routed-expert MatMulId (one whose expert ids a TopK
// chose) this rank's expert range, and adds before every MoeCombine a host hook that
// gathers every rank's slot rows into its experts input. `buffer` is the hooks'
// scratch and must outlive the graph's run. Returns the number of MoE layers.
int shard_experts(Graph& graph, RankGroup& ranks, std::vector<uint8_t>& buffer);

}  // namespace tessera::detail
