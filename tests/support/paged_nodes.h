// The paged KvWrite / Attention nodes of one forward step, built as the models build
// them (models/decoder_blocks.cpp, over make_paged_inputs), for tests that drive the
// kernels directly.
#pragma once
#include <span>
#include <vector>

#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"

namespace tessera::test {

// The step's I32 inputs and the layer's storage, as tensors of one graph. Keep it alive
// while the graph runs (the tensors point into it).
struct PagedStep {
  PagedBuffers data;
  int32_t slots = -1, table = -1, k_storage = -1, v_storage = -1;
};

inline void add_paged_inputs(Graph& g, const KvCache& kv, int layer, std::span<const SeqSlice> slices, PagedStep& s) {
  const PagedInputs in = make_paged_inputs(kv, slices, s.data);
  const bool w = kv.windowed(layer);
  s.slots = g.add_tensor(Tensor::contiguous(DType::I32, {int64_t(in.slots.size())}, (w ? s.data.window_slots : s.data.slots).data()));
  s.table = g.add_tensor(
      Tensor::contiguous(DType::I32, {kSeqTableHeader + in.pages, in.seqs}, (w ? s.data.window_table : s.data.table).data()));
  s.k_storage = g.add_tensor(kv.k_storage(layer));
  s.v_storage = g.add_tensor(kv.v_storage(layer));
}

inline void add_paged_inputs(Graph& g, const KvCache& kv, int layer, KvCache::SeqId seq, int64_t pos0, int64_t n,
                             PagedStep& s) {
  const SeqSlice slice{seq, 0, int32_t(n), pos0};
  add_paged_inputs(g, kv, layer, std::span<const SeqSlice>(&slice, 1), s);
}

// KvWrite of x ([hd, n_kv, n]) into the K (v = false) or V storage.
inline Node kv_write_node(const PagedStep& s, bool v, int32_t x) {
  Node n;
  n.op = Op::KvWrite;
  n.dst = v ? s.v_storage : s.k_storage;
  n.src = {x, s.slots, -1, -1, -1};
  return n;
}

inline Node attention_node(const PagedStep& s, int32_t q, int32_t out, float scale) {
  Node n;
  n.op = Op::Attention;
  n.dst = out;
  n.src = {q, s.k_storage, s.v_storage, s.table, -1};
  n.f[0] = scale;
  return n;
}

}  // namespace tessera::test
