// Connecting ExpertStream to a loaded model and its forward graphs: which weights are
// streamed, and the host hooks that make a step's routed experts resident.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

#include "tessera/expert_stream.h"
#include "tessera/graph.h"
#include "tessera/model.h"
#include "tessera/model_file.h"

namespace tessera::detail {

// Bytes of the routed-expert tensors (blk.N.ffn_{gate,up,down}_exps.weight) of a
// model, of all its weights, and of the layer with the most expert bytes (about the
// smallest cache that streams them, ExpertStream::min_cache_bytes, before 4 KiB
// widening).
struct ExpertBytes {
  uint64_t experts = 0;
  uint64_t all = 0;
  uint64_t largest_layer = 0;
};
ExpertBytes expert_bytes(Model& model);

// True for a routed-expert tensor (blk.N.ffn_{gate,up,down}_exps.weight).
bool is_routed_expert(const Tensor& w);

// A distributed rank's share: reads experts [first, end) of every routed-expert tensor
// of `model` into memory (the pages of the mapped file), so its first steps do not wait
// on the disk and its memory is taken at load. Returns the bytes read in.
uint64_t load_expert_share(Model& model, int64_t first, int64_t end);

// Streams every routed-expert tensor of `model` from `file` through a cache of
// `cache_bytes`: each such Tensor's data now points into the stream's reservation.
// Returns the stream (nullptr when the model has no routed experts; the caller calls
// finish_setup() once the size is final); `streamed` gets the tensors it took over
// (their bytes are not resident: no backend may repack them).
std::unique_ptr<ExpertStream> stream_model_experts(const ModelFile& file, Model& model, uint64_t cache_bytes,
                                                   std::unordered_set<const Tensor*>& streamed);

// Adds to `graph` (just built) a host hook before the first MatMulId of each layer
// that reads streamed experts: it makes the experts of that MatMulId's ids resident.
void add_expert_hooks(Graph& graph, ExpertStream& stream);

}  // namespace tessera::detail
