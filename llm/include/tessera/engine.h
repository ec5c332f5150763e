// The engine: opens a model file through the loader plugins, builds its
// architecture, creates the selected backends (best-ranked first) with a shared
// FastPool, and evaluates forward passes over the paged KV cache: one step holds
// chunks of any number of sequences (forward), planned once per graph shape and run
// in scratch memory reused by liveness. eval() is the single-sequence use of it; the
// Generator (generator.h) schedules many sequences over it.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/memory_plan.h"
#include "tessera/model.h"
#include "tessera/rank_group.h"

namespace tessera {

class PluginRegistry;
class ModelFile;
class ModelLoader;
class Model;
class Tokenizer;
class Scheduler;
class FastPool;
namespace detail {
struct QuantizedWeights;
}

enum class StepBuckets { Auto, On, Off };

// The token count a padded step has for n tokens: n itself up to 2, then 4 and 8, then
// multiples of a quarter of the largest power of two not above n: 10, 12, 14, 16, 20,
// ... 32, 40, ... 64, 80, ... Past 8, padding adds less than a quarter of n.
int64_t step_bucket(int64_t n);

struct EngineOptions {
  std::string model_path;
  // Backends by name in preference order; empty = every usable backend, by rank.
  // Nodes the named backends do not run go to the reference backend (cpu_scalar),
  // appended last, unless strict_backends.
  std::vector<std::string> backends;
  bool strict_backends = false;  // only `backends`: a node none of them runs is an error
  int threads = 0;         // executors for the FastPool; 0 = all hardware threads
  // Run on this worker pool instead of making one of `threads` executors: two engines
  // that take turns (a speculative draft model and its target) share one, so neither's
  // idle workers compete with the other's.
  std::shared_ptr<FastPool> pool;
  int64_t n_ctx = 0;       // KV positions per sequence; 0 = min(model context length, 4096)
  int page_tokens = 16;    // KV cache page size
  int max_sequences = 1;   // sequences holding KV at once: the pool has n_ctx * max_sequences positions
  int64_t batch_tokens = 512;  // token budget of one forward step (eval() chunks longer inputs)
  // Routed-expert weights of MoE models (expert_stream.h): kExpertCacheAuto streams
  // them through a cache only when the model does not fit in the memory available
  // (saying so on stderr); kExpertCacheOff keeps them all resident; a positive value
  // streams through a cache of that many bytes (refused, naming the minimum, if one
  // layer's experts do not fit).
  static constexpr int64_t kExpertCacheAuto = -1, kExpertCacheOff = 0;
  int64_t expert_cache_bytes = kExpertCacheAuto;
  // Quantize the F32/F16/BF16 matrix weights (those only read as MatMul / MatMulId
  // weights or as the GetRows table: projections, experts, token embedding, output)
  // to this type at load, as copies the engine owns; norms, biases, 1-D tensors and
  // MoE routers stay as stored (decision 66). One of quantize_targets(); routed experts
  // quantized this way are in memory, so they are not streamed (an explicit
  // expert_cache_bytes is refused). Unset: the weights as the file holds them.
  std::optional<DType> quantize;
  // A distributed run (rank_group.h, docs/distributed.md): this process is one of
  // ranks->size() ranks, each holding its share of every MoE layer's routed experts.
  // Null (or one rank): the engine runs alone.
  std::shared_ptr<RankGroup> ranks;
  // How the ranks share the model out; unset: experts for a MoE model, layers else.
  std::optional<Split> split;
  // The KV pool's pages, instead of the memory plan's (0): the other ranks of a
  // distributed run take rank 0's, so their caches replay its bookkeeping exactly.
  int64_t kv_pages = 0;
  // Sliding-window layers keep this many positions beyond their window, so that a
  // sequence can be truncated that far below its length (a drafter's rejected tokens).
  int kv_window_slack = 0;
  // Split::Layers: every rank's memory budget in bytes, rank by rank (the same on every
  // rank), which sizes the layer ranges (layer_range_by_memory); empty: equal ranges.
  std::vector<uint64_t> rank_memory;
  // Pad each step's tokens (and its output rows) up to a bucket of a few sizes
  // (step_bucket()), so that a device backend meets a handful of graph shapes and
  // reuses their plans instead of making one for every new token count. The padding
  // rows are a sequence of their own whose pages go back after the step; what the
  // real rows compute does not change. Auto: on when the backend ranked first is a
  // device backend; host backends plan a step in microseconds and would pay the
  // padding's arithmetic. On is refused for models with recurrent layers (they run
  // per sequence, so their graphs differ with every mix of sequences anyway), for
  // distributed runs and for streamed experts (the padding would read experts).
  StepBuckets step_buckets = StepBuckets::Auto;
};

// The types EngineOptions::quantize accepts, and their names for messages ("q8_0, q4_0, ...").
std::span<const DType> quantize_targets();
std::string quantize_target_names();

struct OpProfile;
class ExpertStream;

class Engine {
 public:
  Engine(const PluginRegistry& registry, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelFile& file() const { return *file_; }
  const Model& model() const { return *model_; }
  // The weights a matrix product reads (one Tensor per storage; what decode streams and
  // the primary backend prepared, but for streamed experts), in the model's order.
  const std::vector<const Tensor*>& product_weights() const { return product_weights_; }
  // Throws tessera::Error if the file has no usable tokenizer metadata.
  const Tokenizer& tokenizer() const;
  // The tokenizer, or null when the file has none (no exception).
  const Tokenizer* tokenizer_if_any() const { return tokenizer_.get(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  int threads() const;
  const std::shared_ptr<FastPool>& pool() const { return pool_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_vocab() const;
  int64_t n_embd() const;

  int64_t batch_tokens() const { return batch_tokens_; }
  KvCache& kv() { return *kv_; }
  const KvCache& kv() const { return *kv_; }

  // One sequence's part of a forward step: `tokens` continue the sequence at its next
  // position (KvCache::length). logits: none, the last token's row, or every row.
  enum class Logits : uint8_t { None, Last, All };
  struct Chunk {
    KvCache::SeqId seq = 0;
    std::span<const int32_t> tokens;
    Logits logits = Logits::None;
  };
  // Evaluate the chunks (of distinct sequences) as one forward pass. Returns the
  // logits rows the chunks asked for, chunk after chunk (n_vocab floats each), valid
  // until the next call. Reserves the KV positions; throws tessera::Error if a token is
  // out of range, a sequence would pass n_ctx, or the pool has too few free pages
  // (then nothing was evaluated). The caller keeps the total within its budget.
  std::span<const float> forward(std::span<const Chunk> chunks);
  // The same forward pass ending at the output norm: the final hidden states (n_embd
  // floats per row, what the LM head would read) of the rows the chunks ask for
  // (Chunk::logits picks them), without computing the LM head. Embeddings are made
  // from these (embedder.h).
  std::span<const float> forward_hidden(std::span<const Chunk> chunks);
  // Tokens evaluated by forward() since the engine was made.
  int64_t tokens_evaluated() const { return tokens_evaluated_; }
  // The expert stream of a MoE model whose experts are streamed, else null.
  const ExpertStream* expert_stream() const { return experts_.get(); }
  // Forward steps run since the engine was made (the step a non-finite-logits error names).
  int64_t steps() const { return steps_; }
  // Whether steps are padded to buckets (EngineOptions::step_buckets), and how many
  // were: padded, or left as they were because the pool had no pages for the padding.
  bool pads_steps() const { return pad_steps_; }
  struct PaddingStats {
    int64_t padded_steps = 0, padding_tokens = 0, unpadded_steps = 0;
  };
  PaddingStats padding() const { return padding_; }

  // Feed `tokens` at the next positions of the engine's own sequence, in forward
  // steps of at most batch_tokens. Returns the logits: n_vocab floats per token if
  // all_logits, else for the last token only.
  // Throws tessera::Error if the context is full or a token id is out of range.
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);
  int64_t position() const;
  // The engine's own sequence (the one eval() feeds), for callers that step it through
  // forward() themselves.
  KvCache::SeqId sequence() const { return seq_; }
  // Forget the sequence (the KV cache is emptied).
  void reset();
  // Placement of the last evaluated graph, one line per node.
  std::string placement() const;
  // Time every node of the following steps per op and backend (nullptr: off).
  void set_profile(OpProfile* profile);
  // Scratch bytes the last forward step's memory plan needed.
  size_t scratch_bytes() const { return graph_.scratch_bytes(); }
  // Forward steps whose graph shape had a plan already (validation, placement and the
  // backends' fusion decisions reused), and those that made one.
  struct PlanCacheStats {
    uint64_t hits = 0, misses = 0;
  };
  PlanCacheStats plan_cache() const;
  // Bytes the backends copied between host and device memory so far (0 on host backends).
  TransferStats transfers() const;
  // The memory budget read at load and how the automatic sizes split it.
  const MemoryPlan& memory_plan() const { return memory_plan_; }

  // Distributed runs. The group this engine is one rank of, or null, and how the model
  // is shared out over it.
  RankGroup* ranks() const { return ranks_.get(); }
  Split split() const { return split_; }
  // On a rank other than 0: replays rank 0's forward steps until rank 0's engine ends
  // (its destructor tells the others). A failure ends every rank (RankGroup::abort).
  void follow_rank0();

 private:
  // Construction, step by step (engine.cpp says what each does).
  struct Construction;
  void open_model(const PluginRegistry& registry, const EngineOptions& opt, Construction& c);
  void plan_memory(const EngineOptions& opt, Construction& c);
  std::vector<std::shared_ptr<Backend>> create_backends(const PluginRegistry& registry, const EngineOptions& opt);
  void choose_expert_streaming(const EngineOptions& opt, std::vector<std::shared_ptr<Backend>>& backends,
                               Construction& c);
  void prepare_weights(Backend& primary, const Construction& c);
  void create_kv_cache(const EngineOptions& opt);

  // Throws tessera::Error naming the step, sequence and position if a logits row handed
  // out holds NaN or infinity, or is degenerate (every value equal).
  void check_logits(int64_t rows) const;
  // forward() and forward_hidden(): rows of `width` floats (n_vocab or n_embd).
  std::span<const float> run_step(std::span<const Chunk> chunks, bool hidden);
  // The graph of the step in slices_ (reserved), run; replaying: a rank other than 0.
  void execute_step(bool hidden, bool replaying);
  // Split::Layers: this rank's layers of the step (from the previous rank's output on
  // the others), handed to the next rank; rank 0 then runs the output head on the last
  // rank's output. A step of several sequences goes through as pipelined micro-batches.
  void execute_layers(bool hidden);
  // Builds, allocates and runs the step's graph with `batch`'s stage fields set.
  void run_graph(ForwardBatch& batch, bool keep_output);
  void choose_step_buckets(const EngineOptions& opt);
  bool pad_step();
  // Rank 0: sends the KV calls recorded since the last step and the step's chunks.
  void send_step(std::span<const Chunk> chunks, bool quit = false);

  std::shared_ptr<FastPool> pool_;
  std::shared_ptr<ModelLoader> loader_;  // keeps the loader plugin alive while the file is open
  std::unique_ptr<ModelFile> file_;
  std::unique_ptr<Model> model_;
  std::vector<const Tensor*> product_weights_;
  std::unique_ptr<detail::QuantizedWeights> quantized_;  // --quantize copies; outlive the backends
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string tokenizer_error_;
  std::unique_ptr<ExpertStream> experts_;  // before scheduler_: the backends never own it
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KvCache> kv_;
  MemoryPlan memory_plan_;
  KvCache::SeqId seq_ = 0;
  int64_t n_ctx_ = 0, batch_tokens_ = 0, tokens_evaluated_ = 0, steps_ = 0;
  bool pad_steps_ = false;
  KvCache::SeqId pad_seq_ = -1;  // the padding rows' sequence (created on first use)
  int64_t table_seqs_ = 1;        // the least room a step's sequence table has (make_paged_inputs)
  std::vector<int32_t> pad_tokens_;
  PaddingStats padding_;
  Graph graph_;
  int32_t graph_out_ = -1;  // the last step's logits or hidden-state tensor
  std::vector<int32_t> tokens_, positions_, out_rows_;
  PagedBuffers paged_buffers_;
  std::vector<SeqSlice> slices_;
  std::vector<float> logits_, eval_logits_;
  std::shared_ptr<RankGroup> ranks_;     // a distributed run's group (more than one rank), or null
  Split split_ = Split::Experts;
  LayerRange layers_;                    // Split::Layers: this rank's layers
  std::vector<float> stage_in_, stage_out_;  // stage_out_: micro-batches' output rows
  bool staged_output_ = false;               // the last step's output rows are in stage_out_
  std::vector<KvCache::Call> kv_calls_;  // rank 0: bookkeeping calls not yet sent
  std::vector<uint8_t> exchange_buffer_;
};

}  // namespace tessera
