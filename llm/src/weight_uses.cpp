#include "weight_uses.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"

namespace tessera::detail {

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.type == b.type && std::equal(std::begin(a.ne), std::end(a.ne), std::begin(b.ne)) &&
         std::equal(std::begin(a.nb), std::end(a.nb), std::begin(b.nb));
}

std::vector<WeightGroup> weight_uses(Model& model) {
  std::vector<WeightGroup> groups;
  std::unordered_map<const void*, size_t> by_data;
  for (Tensor* w : model.weights()) {
    if (!w->data) continue;
    auto [it, added] = by_data.emplace(w->data, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].views.push_back(w);
  }

  std::map<uintptr_t, size_t> by_start;  // first byte -> group
  for (size_t i = 0; i < groups.size(); ++i)
    by_start[reinterpret_cast<uintptr_t>(groups[i].views.front()->data)] = i;
  auto group_of = [&](const Tensor& t) -> WeightGroup* {
    const auto p = reinterpret_cast<uintptr_t>(t.data);
    auto it = by_start.upper_bound(p);
    if (!p || it == by_start.begin()) return nullptr;
    --it;
    WeightGroup& g = groups[it->second];
    return p < it->first + g.views.front()->nbytes() ? &g : nullptr;
  };

  constexpr int kPage = 16;
  KvCache kv(model.kv_config(kPage, kPage));
  const KvCache::SeqId seq = kv.create_sequence();
  if (!kv.reserve(seq, 1)) throw Error("internal: scratch KV cache for the weight analysis has no room");
  const int32_t token = 0, position = 0, out_row = 0;
  const SeqSlice slice{seq, 0, 1, 0};
  PagedBuffers buffers;
  const PagedInputs paged = make_paged_inputs(kv, {&slice, 1}, buffers);
  Graph graph;
  model.build_forward(graph, kv, ForwardBatch{{&token, 1}, {&position, 1}, {&slice, 1}, {&out_row, 1}, paged});

  for (const Node& n : graph.nodes()) {
    if (n.dst >= 0)
      if (WeightGroup* g = group_of(graph.tensor(n.dst))) g->other = true;  // written
    for (int s = 0; s < int(n.src.size()); ++s) {
      if (n.src[size_t(s)] < 0) continue;
      const Tensor& t = graph.tensor(n.src[size_t(s)]);
      WeightGroup* g = group_of(t);
      if (!g) continue;
      g->used = true;
      const bool whole = same_layout(t, *g->views.front());
      if (s == 0 && whole && (n.op == Op::MatMul || n.op == Op::MatMulId)) g->product = true;
      else if (s == 0 && whole && n.op == Op::GetRows) g->table = true;
      else g->other = true;
      if (n.op == Op::MatMulId) g->matmul_id = true;
    }
  }
  return groups;
}

}  // namespace tessera::detail
