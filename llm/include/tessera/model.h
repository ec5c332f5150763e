// A model architecture: reads hyperparameters and weight tensors from the model's
// description in tessera's names (model_description.h, docs/model_names.md; each loader
// translates its format), validating names and shapes, and builds the compute graph of
// one forward step over a batch of tokens of one or more sequences. Architectures
// register by tessera's name; the forward math follows llama.cpp's conventions.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/graph.h"
#include "tessera/kv_cache.h"

namespace tessera {

class ModelFile;

// The hyperparameters every architecture reports (for `tessera info` and the engine).
struct ModelInfo {
  std::string architecture;
  std::string name;
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0;
  int64_t head_dim = 0, n_ff = 0, context_length = 0, rope_dims = 0;
  float rope_freq_base = 10000.f, rope_freq_scale = 1.f, rms_eps = 1e-5f;
  int64_t n_expert = 0, n_expert_used = 0;  // 0 for dense models
};

// One sequence's part of a forward batch: rows [first, first + count) of the batch
// are its tokens at positions pos0 .. pos0 + count - 1 (its next positions: the
// caller has reserved them in the KV cache).
struct SeqSlice {
  KvCache::SeqId seq = 0;
  int32_t first = 0;
  int32_t count = 0;
  int64_t pos0 = 0;
};

// What one KvWrite and one Attention per layer read about a step's sequences (I32,
// made by make_paged_inputs from the KV cache's block tables): per token the slot its
// position is written to, and the sequence table (graph.h, Op::Attention), padded to
// a power of two of sequences and of pages so that a graph's shape does not change
// with every mix of sequences. A cache with sliding-window layers has a second pair
// for those layers, over their pool (the same shape; released pages are -1).
struct PagedInputs {
  std::span<const int32_t> slots;      // one per token
  std::span<const int32_t> seq_table;  // [kSeqTableHeader + pages, seqs]
  int64_t pages = 0, seqs = 0;
  std::span<const int32_t> window_slots, window_seq_table;  // empty without window layers
};

// The memory PagedInputs' spans point into.
struct PagedBuffers {
  std::vector<int32_t> slots, table, window_slots, window_table;
};

// One forward step's inputs: tokens of any number of sequences, slice after slice.
// Matrix products see every token at once, and so do attention and KV writes (each
// token reads its own sequence's pages through its block table, with its own causal
// limit); recurrent layers run per slice (their state is per sequence).
struct ForwardBatch {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;  // same length as tokens
  std::span<const SeqSlice> slices;    // non-empty, consecutive, covering every token
  // Rows whose logits are wanted, ascending; empty means the last row only.
  std::span<const int32_t> output_rows;
  PagedInputs paged;
  // The step ends at the output norm: the output rows' final hidden states (what the
  // LM head would read) instead of their logits; the LM head is not computed.
  bool hidden_output = false;
  // A distributed rank's part of the step (--split layers): layers [layer_first,
  // layer_end) only (layer_end 0: to the last layer). stage_input, when set, holds the
  // previous rank's output (F32, n_embd per token) and replaces the token embeddings;
  // with stage_output the step ends after its last layer with every token's hidden
  // state (F32 [n_embd, tokens], not normed) instead of logits.
  int64_t layer_first = 0, layer_end = 0;
  const float* stage_input = nullptr;
  bool stage_output = false;
};

// The layers a step runs: [b.layer_first, b.layer_end or n_layer).
struct LayerSpan {
  int64_t first = 0, end = 0;
};
inline LayerSpan step_layers(const ForwardBatch& b, int64_t n_layer) {
  return {b.layer_first, b.layer_end > 0 ? b.layer_end : n_layer};
}

// Fills `buffers` for the slices of a step whose positions kv has reserved, and returns
// the spans over them. The sequence table has room for at least `min_seqs` sequences
// (rounded up to a power of two, as the slices' count is).
PagedInputs make_paged_inputs(const KvCache& kv, std::span<const SeqSlice> slices, PagedBuffers& buffers,
                              int64_t min_seqs = 1);

class Model {
 public:
  virtual ~Model() = default;

  // Build the model for a file's architecture; throws tessera::Error for an unknown
  // architecture, a hyperparameter the tensor table does not back, or a missing /
  // misshapen tensor. Tensors of the file the architecture does not read are listed
  // in unused_tensors() and logged as a warning (never ignored silently).
  static std::unique_ptr<Model> load(const ModelFile& file);
  static std::vector<std::string> supported_architectures();

  const ModelInfo& info() const { return info_; }
  // Every weight tensor the forward pass reads (for backend repacking at load): the
  // members the architecture loaded them into, in load order.
  const std::vector<Tensor*>& weights() { return weights_; }
  // KV cache geometry for a context of n_ctx positions: by default every layer caches
  // n_head_kv x head_dim values of K and V per position.
  virtual KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const;
  // Append the nodes of one forward step to `graph`; returns the logits tensor
  // (F32 [n_vocab, rows]: one row per output row, in order), or with
  // batch.hidden_output the normed hidden states (F32 [n_embd, rows]). The caller has
  // reserved the KV positions.
  virtual int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& batch) const = 0;

  // Tensors of the file the architecture recognises and deliberately leaves out of the
  // forward pass (glm4moe's NextN layers): not weights(), and not reported as unused.
  virtual std::vector<std::string> skipped_tensors() const { return {}; }
  // Names of the file's tensors that the forward pass does not read (file order).
  const std::vector<std::string>& unused_tensors() const { return unused_tensors_; }

 protected:
  ModelInfo info_;
  std::vector<Tensor*> weights_;  // filled by the architecture's WeightSource

 private:
  std::vector<std::string> unused_tensors_;
};

}  // namespace tessera
