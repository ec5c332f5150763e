#include "distributed/expert_shard.h"

#include <cstring>
#include <string>

#include "tessera/error.h"

namespace tessera::detail {

namespace {

int32_t producer(const Graph& g, int32_t tensor, size_t before) {
  for (size_t i = before; i-- > 0;)
    if (g.nodes()[i].dst == tensor) return int32_t(i);
  return -1;
}

// The slot rows of `experts` (F32 [N, k, n], row j + k * t for slot j of token t) that
// each rank computed, gathered on every rank: a rank's rows travel in slot order, and
// every rank knows which rank computed which slot from the ids all of them chose.
void exchange(Graph& g, int32_t experts, int32_t ids, int64_t n_expert, RankGroup& ranks,
              std::vector<uint8_t>& buffer) {
  const Tensor& e = g.tensor(experts);
  const Tensor& id = g.tensor(ids);
  if (e.type != DType::F32 || !e.is_contiguous() || id.type != DType::I32 || !id.is_contiguous() ||
      e.ne[1] * e.ne[2] != id.nelements())
    throw Error("distributed experts: the expert products or ids are not dense rows");
  const int R = ranks.size(), me = ranks.rank();
  const size_t row = size_t(e.ne[0]) * sizeof(float);
  const int64_t slots = id.nelements();
  const int32_t* ids_data = static_cast<const int32_t*>(id.data);
  std::vector<size_t> counts(size_t(R), 0);
  std::vector<int> owner(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    owner[size_t(s)] = expert_owner(ids_data[s], n_expert, R);
    counts[size_t(owner[size_t(s)])] += row;
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  buffer.resize(counts[size_t(me)] + total);
  uint8_t* mine = buffer.data();
  uint8_t* all = buffer.data() + counts[size_t(me)];
  for (int64_t s = 0, k = 0; s < slots; ++s)
    if (owner[size_t(s)] == me) std::memcpy(mine + size_t(k++) * row, e.flat_row<float>(s), row);
  ranks.all_gather({mine, counts[size_t(me)]}, counts, {all, total});
  std::vector<size_t> next(size_t(R), 0);  // each rank's next row in `all`
  for (int r = 1; r < R; ++r) next[size_t(r)] = next[size_t(r - 1)] + counts[size_t(r - 1)];
  for (int64_t s = 0; s < slots; ++s) {
    const int r = owner[size_t(s)];
    if (r != me) std::memcpy(e.flat_row<float>(s), all + next[size_t(r)], row);
    next[size_t(r)] += row;
  }
}

}  // namespace

int shard_experts(Graph& g, RankGroup& ranks, std::vector<uint8_t>& buffer) {
  int layers = 0;
  int32_t last_ids = -1;  // the ids of the last routed-expert MatMulId
  int64_t last_experts = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::MatMulId) {
      const int32_t chooser = producer(g, n.src[2], i);
      if (chooser < 0 || g.nodes()[size_t(chooser)].op != Op::TopK) continue;  // not routing (e.g. per-head products)
      const int64_t E = g.tensor(n.src[0]).ne[2];
      const ExpertRange r = expert_range(E, ranks.rank(), ranks.size());
      if (r.end <= r.first)
        throw Error("distributed experts: " + std::to_string(ranks.size()) + " ranks for a layer of " +
                    std::to_string(E) + " experts leave rank " + std::to_string(ranks.rank()) +
                    " none; use at most " + std::to_string(E) + " ranks");
      Node& m = g.node(i);
      m.i[0] = int32_t(r.first);
      m.i[1] = int32_t(r.end);
      last_ids = n.src[2];
      last_experts = E;
    } else if (n.op == Op::MoeCombine) {
      if (last_ids < 0) throw Error("distributed experts: a MoeCombine without routed experts before it");
      const int32_t experts = n.src[0], ids = last_ids;
      const int64_t E = last_experts;
      RankGroup* group = &ranks;
      std::vector<uint8_t>* buf = &buffer;
      g.add_host_hook(i, [experts, ids, E, group, buf](Graph& graph) { exchange(graph, experts, ids, E, *group, *buf); });
      g.mark_output(ids);  // read by the hook, after the products that were its last readers
      last_ids = -1;
      ++layers;
    }
  }
  return layers;
}

}  // namespace tessera::detail
