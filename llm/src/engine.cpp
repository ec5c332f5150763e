#include "tessera/engine.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "distributed/expert_shard.h"
#include "distributed/micro_batches.h"
#include "distributed/step_message.h"
#include "expert_stream/model_experts.h"
#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/host_memory.h"
#include "tessera/memory_budget.h"
#include "tessera/memory_plan.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/tensor_scan.h"
#include "tessera/open_model.h"
#include "tessera/plugin_registry.h"
#include "tessera/rank_group.h"
#include "tessera/scheduler.h"
#include "tessera/tokenizer.h"
#include "weight_quantize.h"
#include "weight_uses.h"

namespace tessera {

namespace {

// Vectors (norms, biases, scale vectors) are read for NaN/Inf at every load (decision
// 91): a few KB in all, and a non-finite norm weight makes every logit non-finite or
// equal. The full scan of the matrices is --check-tensors.
void check_vectors_finite(const ModelFile& file) {
  const std::vector<NonFiniteTensor> bad = find_non_finite_vectors(file);
  if (bad.empty()) return;
  std::string msg = printable(file.path(), 200) + ": " + describe(bad.front());
  if (bad.size() > 1) msg += " (and " + std::to_string(bad.size() - 1) + " more tensors)";
  throw Error(msg + ": the file is damaged (`tessera info --check-tensors` lists every tensor holding NaN or infinity)");
}

// One sequence's chunk of a step, continuing at pos0: its slice, tokens and positions.
const SeqSlice& append_slice(KvCache::SeqId seq, std::span<const int32_t> tokens, int64_t pos0,
                             std::vector<int32_t>& all_tokens, std::vector<int32_t>& positions,
                             std::vector<SeqSlice>& slices) {
  SeqSlice s;
  s.seq = seq;
  s.first = int32_t(all_tokens.size());
  s.count = int32_t(tokens.size());
  s.pos0 = pos0;
  all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
  for (int64_t i = 0; i < s.count; ++i) positions.push_back(int32_t(pos0 + i));
  slices.push_back(s);
  return slices.back();
}

}  // namespace

int64_t step_bucket(int64_t n) {
  if (n <= 2) return std::max<int64_t>(n, 1);
  if (n <= 8) return n <= 4 ? 4 : 8;
  const int64_t step = int64_t(std::bit_floor(uint64_t(n))) / 4;
  return (n + step - 1) / step * step;
}

// What the construction steps hand on to each other.
struct Engine::Construction {
  MemoryBudget budget;
  std::vector<detail::WeightGroup> uses;  // how the graph reads each weight
  bool experts_quantized = false;         // --quantize made the routed experts copies in memory
  bool split_experts = false;             // a distributed rank holding a share of the experts
  ExpertRange experts;                    // that share
  std::unordered_set<const Tensor*> streamed;  // routed experts read from the file as needed
};

Engine::Engine(const PluginRegistry& registry, const EngineOptions& opt) {
  if (opt.threads < 0) throw Error("--threads must be >= 0");
  if (opt.quantize) detail::check_quantize_target(*opt.quantize);  // before reading the file
  if (opt.ranks && opt.ranks->size() > 1) ranks_ = opt.ranks;
  if (ranks_ && opt.quantize)
    throw Error("--quantize is not available in a distributed run yet (each rank would quantize every expert)");
  pool_ = opt.pool ? opt.pool : std::make_shared<FastPool>(opt.threads);

  Construction c;
  open_model(registry, opt, c);
  plan_memory(opt, c);
  std::vector<std::shared_ptr<Backend>> backends = create_backends(registry, opt);
  choose_expert_streaming(opt, backends, c);
  prepare_weights(*backends.front(), c);
  scheduler_ = std::make_unique<Scheduler>(std::move(backends));
  create_kv_cache(opt);
  // Host backends read scratch through plain pointers, so intermediates may share
  // memory by liveness, never within what a backend computes as one; a device backend
  // tracks host ranges per submission and gets distinct ranges (decision 37).
  bool host_only = true;
  int32_t window = 1;
  for (const auto& b : scheduler_->backends()) {
    host_only = host_only && b->uses_host_memory();
    window = std::max(window, b->fusion_window());
  }
  graph_.set_memory_reuse(host_only, window);
  choose_step_buckets(opt);
  spdlog::debug("engine: {} ({}), {} layers, context {}, {} sequences, {} threads", opt.model_path,
                model_->info().architecture, model_->info().n_layer, n_ctx_, opt.max_sequences, pool_->executor_count());
}

// The file through its loader plugin, the model's architecture over it, the memory
// budget (read before anything large is allocated), --quantize's copies and the
// tokenizer.
void Engine::open_model(const PluginRegistry& registry, const EngineOptions& opt, Construction& c) {
  OpenedModel opened = open_model_file(registry, opt.model_path);
  loader_ = opened.loader;
  file_ = std::move(opened.file);
  model_ = Model::load(*file_);
  c.budget = read_memory_budget();
  check_vectors_finite(*file_);
  // --quantize: the copies replace the weights before experts are streamed and the
  // backends repack (decision 66).
  c.uses = detail::weight_uses(*model_);
  if (opt.quantize) quantized_ = detail::quantize_weights(c.uses, *opt.quantize, *pool_);
  c.experts_quantized = quantized_ && quantized_->experts;
  if (c.experts_quantized && opt.expert_cache_bytes > 0)
    throw Error("--expert-cache SIZE streams the experts from the file, but --quantize made them copies in memory: "
                "use --expert-cache auto or off with --quantize");
  try {
    tokenizer_ = Tokenizer::from_metadata(file_->metadata());
  } catch (const Error& e) {
    tokenizer_error_ = e.what();
  }
}

// The context and step sizes, a distributed rank's share of the model, and how the
// memory budget splits between weights, the expert cache and the KV pool.
void Engine::plan_memory(const EngineOptions& opt, Construction& c) {
  // Every automatic size (expert cache, KV pool) comes from the memory budget: the
  // lowest of the cgroup's limit, RLIMIT_AS and MemAvailable (memory_plan.h).
  const ModelInfo& info = model_->info();
  n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(info.context_length > 0 ? info.context_length : 4096, 4096);
  if (opt.page_tokens <= 0) throw Error("KV page size must be positive");
  if (opt.max_sequences <= 0) throw Error("the number of parallel sequences must be positive");
  if (opt.batch_tokens <= 0) throw Error("the batch size (tokens per forward step) must be positive");
  batch_tokens_ = opt.batch_tokens;
  const int64_t pages_per_seq = (n_ctx_ + opt.page_tokens - 1) / opt.page_tokens;
  if (pages_per_seq > INT32_MAX / opt.max_sequences) throw Error("KV cache too large: lower --ctx or --parallel");
  MemoryNeeds needs = memory_needs(*model_, opt, n_ctx_, c.experts_quantized);
  if (ranks_) {
    split_ = opt.split.value_or(info.n_expert > 0 ? Split::Experts : Split::Layers);
    if (split_ == Split::Experts && info.n_expert <= 0)
      throw Error(info.architecture + " has no routed experts to split over ranks: use --split layers");
  }
  // Split::Experts: the experts of every MoE layer this rank holds.
  c.split_experts = ranks_ && split_ == Split::Experts;
  const ExpertRange r = c.split_experts ? expert_range(info.n_expert, ranks_->rank(), ranks_->size()) : ExpertRange{};
  c.experts = r;
  if (c.split_experts) {
    const uint64_t share = needs.expert_weights / uint64_t(info.n_expert) * uint64_t(r.end - r.first);
    needs.weights -= needs.expert_weights - share;
    needs.expert_weights = share;
    needs.min_expert_cache = needs.min_expert_cache / uint64_t(info.n_expert) * uint64_t(r.end - r.first);
    spdlog::info("distributed run: rank {} of {} holds experts [{}, {}) of every MoE layer", ranks_->rank(),
                 ranks_->size(), r.first, r.end);
  } else if (ranks_) {
    const bool by_memory = opt.rank_memory.size() == size_t(ranks_->size());
    if (by_memory) {
      uint64_t fixed = 0;  // the embeddings and the output head: rank 0's besides its layers
      for (const Tensor* w : model_->weights())
        if (w->name.rfind("blk.", 0) != 0) fixed += w->nbytes();
      layers_ = layer_range_by_memory(info.n_layer, ranks_->rank(), opt.rank_memory, fixed);
    } else {
      layers_ = layer_range(info.n_layer, ranks_->rank(), ranks_->size());
    }
    if (ranks_->rank() == 0 && layers_.end == layers_.first)
      throw Error("--split layers: rank 0 would hold no layers");  // neither range function does that
    if (layers_.end == layers_.first)
      spdlog::warn("--split layers: {} ranks for {} layers leave rank {} none: it only passes the activations on",
                   ranks_->size(), info.n_layer, ranks_->rank());
    // Its layers' share of the weights (the layers are alike; the embeddings and the
    // head, on rank 0, are counted as if spread).
    const uint64_t n = uint64_t(layers_.end - layers_.first), L = uint64_t(info.n_layer);
    needs.weights = needs.weights / L * n;
    needs.expert_weights = needs.expert_weights / L * n;
    std::string sized = "equal ranges";
    if (by_memory) {
      sized = "ranges sized by the ranks' memory:";
      for (uint64_t m : opt.rank_memory) sized += " " + format_memory(m);
    }
    spdlog::info("distributed run: rank {} of {} runs layers [{}, {}) ({})", ranks_->rank(), ranks_->size(),
                 layers_.first, layers_.end, sized);
  }
  memory_plan_ = tessera::plan_memory(needs, c.budget);
  if (opt.kv_pages > 0) memory_plan_.kv_pages = opt.kv_pages;
  spdlog::info("{}; {}", memory_plan_.budget.describe(), memory_plan_.describe());
  for (const std::string& w : memory_plan_.warnings) spdlog::warn("{}", w);
}

// The backends: the ranked list or the ones asked for, with the reference backend (the
// plugin that says it is one) as the last resort for what they decline, unless the
// caller asked for those alone.
std::vector<std::shared_ptr<Backend>> Engine::create_backends(const PluginRegistry& registry, const EngineOptions& opt) {
  std::vector<std::string> names = opt.backends.empty() ? registry.ranked_backends() : opt.backends;
  if (names.empty()) throw Error("no usable backend plugin found (see `tessera backends`)");
  if (const PluginRecord* ref = registry.reference_backend();
      ref && !opt.backends.empty() && !opt.strict_backends && std::find(names.begin(), names.end(), ref->name) == names.end())
    names.push_back(ref->name);
  // A backend whose plugin fails to create (its create() returns NULL) is skipped with
  // a warning and the next one by rank takes its nodes; a name that is
  // unknown or unusable, or the only backend asked for, is still an error.
  std::vector<std::shared_ptr<Backend>> backends;
  std::string failed;
  for (const auto& n : names) {
    const PluginRecord* rec = registry.find(n);
    const bool creatable = rec && rec->usable && rec->kind == "backend";
    try {
      backends.push_back(registry.create_backend(n, pool_.get()));
    } catch (const Error& e) {
      if (!creatable || names.size() == 1 || (opt.backends.size() == 1 && n == opt.backends[0])) throw;
      spdlog::warn("backend {} skipped: {}; the next backend by rank takes its nodes", printable(n, 64),
                   printable(e.what(), 400));
      failed += (failed.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  if (backends.empty()) throw Error("no backend could be created: " + failed);
  return backends;
}

// Routed experts streamed from the file when asked, or by default when the model does
// not fit in the memory budget; their bytes are never all resident, so no backend
// repacks them, and a device backend (which keeps a copy of every weight it reads)
// cannot run with them.
void Engine::choose_expert_streaming(const EngineOptions& opt, std::vector<std::shared_ptr<Backend>>& backends,
                                     Construction& c) {
  if (!memory_plan_.stream_experts) return;
  // A device backend keeps a copy of every weight it reads: the default list goes
  // on without it (said on stderr); one the user named is an error.
  for (size_t i = backends.size(); i-- > 0;) {
    if (backends[i]->uses_host_memory()) continue;
    if (!opt.backends.empty())
      throw Error("streaming experts needs CPU backends (" + backends[i]->name() +
                  " keeps weights on its device): choose --backend cpu_avx512,cpu_scalar, or --expert-cache off");
    spdlog::info("streaming experts: backend {} (weights on its device) is not used", backends[i]->name());
    backends.erase(backends.begin() + std::ptrdiff_t(i));
  }
  if (backends.empty()) throw Error("streaming experts needs a CPU backend, and none is usable");
  experts_ = detail::stream_model_experts(*file_, *model_, memory_plan_.expert_cache, c.streamed);
  if (experts_ && c.split_experts) experts_->hold_only(c.experts.first, c.experts.end);  // a rank streams its own share
  if (experts_ && opt.expert_cache_bytes <= 0)  // automatic: at least the smallest that works
    experts_->set_cache_bytes(std::max(memory_plan_.expert_cache, experts_->min_cache_bytes()));
  if (experts_) experts_->finish_setup();
}

// The primary backend may repack or copy weights into its own memory once, at load:
// those a matrix product reads (a GetRows table or a norm would only get a copy
// nothing reads), once per storage (a tied output matrix shares the embedding's
// result). The original's pages are handed back when nothing reads them any more:
// every view now points at the backend's copy, or only products read the weight and
// the backend streams a copy of its own (the file's pages would otherwise stay
// resident beside it).
// A distributed rank holds only its share of the routed experts: read in now, and not
// prepared by the primary backend (which would copy every expert; the ranged products
// read them where they lie, in the file's layout).
void Engine::prepare_weights(Backend& primary, const Construction& c) {
  if (c.split_experts && !experts_) {
    const uint64_t read = detail::load_expert_share(*model_, c.experts.first, c.experts.end);
    spdlog::info("distributed run: rank {} read its share of the routed experts, {}", ranks_->rank(),
                 format_memory(read));
  }
  // Split::Layers: a rank's own layers' weights (blk.N.*); the embeddings and the head
  // are rank 0's.
  auto holds_weight = [&](const std::string& name) {
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return ranks_->rank() == 0;
    return layer >= layers_.first && layer < layers_.end;
  };
  for (const detail::WeightGroup& g : c.uses) {
    if (!g.product) continue;
    Tensor& first = *g.views.front();
    product_weights_.push_back(&first);
    if (c.streamed.count(&first)) continue;
    if (c.split_experts && detail::is_routed_expert(first)) continue;
    if (ranks_ && split_ == Split::Layers && !holds_weight(first.name)) continue;
    const Tensor original = first;
    primary.prepare_weight(first);
    bool original_read = false;  // by a view of another layout
    for (Tensor* w : g.views) {
      if (w == &first) continue;
      if (detail::same_layout(*w, original)) {
        w->type = first.type;
        std::copy(std::begin(first.nb), std::end(first.nb), std::begin(w->nb));
        w->data = first.data;
        w->buffer = first.buffer;
      } else {
        primary.prepare_weight(*w);
        original_read = true;
      }
    }
    if (original_read || !original.is_contiguous() || !primary.uses_host_memory()) continue;
    const bool moved = first.data != original.data;
    const std::span<const std::byte> own = primary.weight_bytes(first);
    const bool own_copy = own.data() && static_cast<const void*>(own.data()) != original.data;
    if (moved || (own_copy && !g.table && !g.other)) release_pages(original.data, original.nbytes());
  }
  // A --quantize copy the backend copied again into pages of its own is read by nothing.
  if (quantized_)
    if (const size_t freed = quantized_->drop_unreferenced(model_->weights()))
      spdlog::debug("--quantize: {:.1f} MiB of copies now held by the backend freed", double(freed) / (1 << 20));
}

// The pool holds max_sequences full contexts, or what the memory budget leaves
// (never less than one context; memory_plan.h). Its pages live in the memory of the
// backend that runs attention: the primary one (a backend that declines attention
// over its own pages sends it down the ranking).
void Engine::create_kv_cache(const EngineOptions& opt) {
  Backend& attention_backend = *scheduler_->backends().front();
  KvCacheConfig kv_config = model_->kv_config(memory_plan_.kv_pages * opt.page_tokens, opt.page_tokens);
  if (kv_config.windowed()) {
    kv_config.n_window_pages = int(std::max<int64_t>(1, memory_plan_.window_pages()));
    kv_config.window_slack = opt.kv_window_slack;
  }
  kv_ = std::make_unique<KvCache>(kv_config,
                                  [&](size_t bytes) { return attention_backend.alloc_buffer(bytes, BufferUsage::Kv); });
  seq_ = kv_->create_sequence();
  if (ranks_ && ranks_->rank() == 0) kv_->record_calls(&kv_calls_);
}

void Engine::choose_step_buckets(const EngineOptions& opt) {
  if (opt.step_buckets == StepBuckets::Off) return;
  std::string why_not;
  if (kv_->has_recurrent())
    why_not = "the model has recurrent layers, which run per sequence";
  else if (ranks_)
    why_not = "a distributed run lays its steps out on every rank";
  else if (experts_)
    why_not = "the experts are streamed, and padding rows would read experts";
  if (opt.step_buckets == StepBuckets::On) {
    if (!why_not.empty()) throw Error("--step-buckets on: " + why_not);
    pad_steps_ = true;
  } else {
    pad_steps_ = why_not.empty() && !scheduler_->backends().front()->uses_host_memory();
  }
  // A padded engine's sequence tables have room for all the sequences it holds at once
  // and the padding's, whatever a step holds: their shape never changes with them.
  if (pad_steps_) table_seqs_ = int64_t(opt.max_sequences) + 1;
}

Engine::~Engine() {
  if (!ranks_ || ranks_->rank() != 0) return;
  kv_->record_calls(nullptr);
  const RankTraffic t = ranks_->traffic();
  spdlog::info("distributed run: {} steps, {} exchanges, {} bytes sent and {} received by rank 0 in {:.3f} s", steps_,
               t.exchanges, t.bytes_sent, t.bytes_received, t.seconds);
  try {
    send_step({}, true);  // the other ranks stop following
  } catch (const std::exception& e) {
    spdlog::error("distributed run: could not tell the other ranks to stop: {}", e.what());
  }
}

const Tokenizer& Engine::tokenizer() const {
  if (!tokenizer_) {
    // A checkpoint folder's tokenizer is a file beside the weights: say which.
    if (file_->format() == "safetensors" && !file_->metadata().find("tokenizer.ggml.model"))
      throw Error(file_->path() + ": no tokenizer: the folder has no tokenizer.json (token ids still work: "
                                  "`tessera logits --tokens`, `tessera bench`)");
    throw Error(file_->path() + ": no usable tokenizer: " + tokenizer_error_);
  }
  return *tokenizer_;
}

int Engine::threads() const { return pool_->executor_count(); }

int64_t Engine::n_vocab() const { return model_->info().n_vocab; }

int64_t Engine::n_embd() const { return model_->info().n_embd; }

std::span<const float> Engine::forward(std::span<const Chunk> chunks) { return run_step(chunks, false); }

std::span<const float> Engine::forward_hidden(std::span<const Chunk> chunks) { return run_step(chunks, true); }

// Pads the step laid out in tokens_, slices_ and out_rows_ to step_bucket() sizes: rows
// of a sequence of their own at positions 0.. (the first token repeated), the first of
// them added to the output rows until those are a bucket too. False, changing nothing,
// when nothing needs padding or the pool has no pages for it.
bool Engine::pad_step() {
  const int64_t n = int64_t(tokens_.size()), rows = int64_t(out_rows_.size());
  const int64_t extra_rows = step_bucket(rows) - rows;
  int64_t padded = step_bucket(n);
  while (padded - n < extra_rows) padded = step_bucket(padded + 1);
  const int64_t extra = padded - n;
  if (extra == 0) return false;
  if (pad_seq_ < 0) pad_seq_ = kv_->create_sequence();
  if (!kv_->reserve(pad_seq_, extra)) {
    ++padding_.unpadded_steps;
    return false;
  }
  pad_tokens_.assign(size_t(extra), tokens_.front());
  append_slice(pad_seq_, pad_tokens_, 0, tokens_, positions_, slices_);
  for (int64_t r = 0; r < extra_rows; ++r) out_rows_.push_back(int32_t(n + r));
  ++padding_.padded_steps;
  padding_.padding_tokens += extra;
  return true;
}

std::span<const float> Engine::run_step(std::span<const Chunk> chunks, bool hidden) {
  if (chunks.empty()) throw Error("nothing to evaluate: no chunks");
  const int64_t V = n_vocab();
  tokens_.clear();
  positions_.clear();
  slices_.clear();
  out_rows_.clear();
  for (const Chunk& c : chunks) {
    if (c.tokens.empty()) throw Error("nothing to evaluate: empty token list");
    for (const SeqSlice& s : slices_)
      if (s.seq == c.seq) throw Error("forward: sequence " + std::to_string(c.seq) + " appears in two chunks");
    for (int32_t t : c.tokens)
      if (t < 0 || t >= V)
        throw Error("token id " + std::to_string(t) + " is out of range (vocabulary size " + std::to_string(V) + ")");
    const int64_t pos0 = kv_->length(c.seq), n = int64_t(c.tokens.size());
    if (pos0 + n > n_ctx_)
      throw Error("context is full: " + std::to_string(pos0 + n) + " positions needed, context size is " +
                  std::to_string(n_ctx_));
    const SeqSlice& s = append_slice(c.seq, c.tokens, pos0, tokens_, positions_, slices_);
    if (c.logits == Logits::Last) out_rows_.push_back(s.first + s.count - 1);
    if (c.logits == Logits::All)
      for (int32_t r = s.first; r < s.first + s.count; ++r) out_rows_.push_back(r);
  }
  // Reserve every chunk's positions, or none of them.
  for (size_t i = 0; i < slices_.size(); ++i) {
    const SeqSlice& s = slices_[i];
    if (!kv_->reserve(s.seq, s.pos0 + s.count)) {
      for (size_t j = 0; j < i; ++j) kv_->truncate(slices_[j].seq, slices_[j].pos0);
      throw Error("KV cache has no free pages left");
    }
  }

  const bool want_rows = !out_rows_.empty();
  if (!want_rows) out_rows_.push_back(int32_t(tokens_.size()) - 1);  // the graph always ends in logits
  const size_t real_tokens = tokens_.size(), real_rows = out_rows_.size();
  const bool padded = pad_steps_ && pad_step();
  if (ranks_) {
    // From here on every rank runs this step: a failure on rank 0 would leave the others
    // waiting inside it, so it ends them all.
    send_step(chunks);
    try {
      execute_step(hidden, false);
    } catch (const std::exception& e) {
      ranks_->abort(std::string("forward step failed: ") + e.what());
    }
  } else {
    execute_step(hidden, false);
  }
  // The engine, not the kernels, owns the sequences' lengths; the padding's pages go back.
  for (const SeqSlice& s : slices_) kv_->set_length(s.seq, s.pos0 + s.count);
  if (padded) kv_->truncate(pad_seq_, 0);
  tokens_evaluated_ += int64_t(real_tokens);

  const int64_t rows = want_rows ? int64_t(real_rows) : 0;
  const int64_t width = hidden ? n_embd() : V;
  logits_.resize(size_t(rows * width));
  if (staged_output_) {  // pipelined micro-batches (--split layers): gathered by execute_layers
    if (stage_out_.size() != out_rows_.size() * size_t(width))
      throw Error("internal: the micro-batches' output rows do not add up to the step's");
    std::memcpy(logits_.data(), stage_out_.data(), size_t(rows * width) * sizeof(float));
  } else {
    const Tensor& lt = graph_.tensor(graph_out_);
    if (lt.type != DType::F32 || lt.ne[0] != width || lt.ne[1] != int64_t(out_rows_.size()))
      throw Error(std::string("internal: ") + (hidden ? "hidden-state" : "logits") + " tensor has the wrong shape");
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&logits_[size_t(r * width)], lt.row<float>(r), size_t(width) * sizeof(float));
  }
  ++steps_;
  if (!hidden) check_logits(rows);
  return logits_;
}

void Engine::execute_step(bool hidden, bool replaying) {
  if (ranks_ && split_ == Split::Layers) return execute_layers(hidden);
  ForwardBatch batch{tokens_, positions_, slices_, out_rows_,
                     make_paged_inputs(*kv_, slices_, paged_buffers_, table_seqs_), hidden};
  run_graph(batch, !replaying);
}

void Engine::run_graph(ForwardBatch& batch, bool keep_output) {
  graph_.reset();
  graph_out_ = model_->build_forward(graph_, *kv_, batch);
  if (experts_) detail::add_expert_hooks(graph_, *experts_);
  if (ranks_ && split_ == Split::Experts) detail::shard_experts(graph_, *ranks_, exchange_buffer_);
  if (keep_output) graph_.mark_output(graph_out_);
  graph_.allocate();
  const uint64_t misses = scheduler_->plan_misses();
  scheduler_->run(graph_);
  if (scheduler_->plan_misses() != misses)
    spdlog::debug("engine: a new plan for a step of {} tokens, {} output rows, a sequence table of {} x {} pages",
                  batch.tokens.size(), batch.output_rows.size(), batch.paged.seqs, batch.paged.pages);
}

void Engine::execute_layers(bool hidden) {
  const int me = ranks_->rank(), R = ranks_->size();
  const size_t row = size_t(n_embd()) * sizeof(float);
  // Several sequences and enough tokens in the step: up to one micro-batch per rank,
  // pipelined (each handed on as soon as this rank's layers are done with it).
  const std::vector<detail::MicroBatch> mbs =
      detail::split_micro_batches(slices_, R, detail::kMinMicroBatchTokens);
  std::vector<detail::MicroBatchStep> steps;
  for (const detail::MicroBatch& mb : mbs)
    steps.push_back(detail::micro_batch_step(tokens_, positions_, slices_, out_rows_, mb));
  PagedInputs paged;  // the last micro-batch's (paged_buffers_ hold it)
  for (detail::MicroBatchStep& st : steps) {
    const size_t rows = st.tokens.size();
    paged = make_paged_inputs(*kv_, st.slices, paged_buffers_);
    ForwardBatch batch{st.tokens, st.positions, st.slices, st.out_rows, paged, hidden};
    batch.layer_first = layers_.first;
    batch.layer_end = layers_.end;
    batch.stage_output = true;
    if (me > 0) {
      stage_in_.resize(rows * size_t(n_embd()));
      ranks_->recv(me - 1, {reinterpret_cast<uint8_t*>(stage_in_.data()), rows * row});
      batch.stage_input = stage_in_.data();
    }
    run_graph(batch, true);
    const Tensor& out = graph_.tensor(graph_out_);
    if (out.type != DType::F32 || !out.is_contiguous() || out.ne[0] != n_embd() || out.ne[1] != int64_t(rows))
      throw Error("internal: a rank's layers did not end with every token's hidden state");
    // Handed on at once to the next rank, which waits for it; the last rank's output
    // goes back to rank 0 without waiting, since rank 0 is still busy with the later
    // micro-batches (a blocking send each way would wait in a cycle).
    const std::span<const uint8_t> bytes{static_cast<const uint8_t*>(out.data), rows * row};
    if (me + 1 < R)
      ranks_->send(me + 1, bytes);
    else
      ranks_->send_async(0, bytes);
  }
  staged_output_ = false;
  if (me == 0) {
    // The output head on the last rank's output, micro-batch by micro-batch; with more
    // than one, their output rows are gathered (in the step's order) for run_step.
    const int64_t width = hidden ? n_embd() : n_vocab();
    stage_out_.clear();
    for (detail::MicroBatchStep& st : steps) {
      const size_t rows = st.tokens.size();
      stage_in_.resize(rows * size_t(n_embd()));
      ranks_->recv(R - 1, {reinterpret_cast<uint8_t*>(stage_in_.data()), rows * row});
      // One micro-batch: its paged inputs are still those made above.
      if (steps.size() > 1) paged = make_paged_inputs(*kv_, st.slices, paged_buffers_);
      ForwardBatch tail{st.tokens, st.positions, st.slices, st.out_rows, paged, hidden};
      tail.layer_first = tail.layer_end = model_->info().n_layer;
      tail.stage_input = stage_in_.data();
      run_graph(tail, true);
      if (steps.size() == 1) break;
      const Tensor& out = graph_.tensor(graph_out_);
      if (out.type != DType::F32 || out.ne[0] != width)
        throw Error("internal: a micro-batch's output head has the wrong shape");
      for (int64_t r = 0; r < int64_t(st.out_rows.size()); ++r)
        stage_out_.insert(stage_out_.end(), out.row<float>(r), out.row<float>(r) + width);
    }
    staged_output_ = steps.size() > 1;
  }
  ranks_->wait_sends();
}

void Engine::send_step(std::span<const Chunk> chunks, bool quit) {
  detail::StepMessage m;
  m.quit = quit;
  m.calls = std::move(kv_calls_);
  kv_calls_.clear();
  for (const Chunk& c : chunks) m.chunks.push_back({c.seq, std::vector<int32_t>(c.tokens.begin(), c.tokens.end())});
  std::vector<uint8_t> bytes = detail::encode(m);
  ranks_->broadcast(bytes);
}

void Engine::follow_rank0() {
  if (!ranks_ || ranks_->rank() == 0) throw Error("internal: follow_rank0() on rank 0 or outside a distributed run");
  try {
    for (;;) {
      std::vector<uint8_t> bytes;
      ranks_->broadcast(bytes);
      const detail::StepMessage m = detail::decode(bytes);
      for (const KvCache::Call& c : m.calls) kv_->replay(c);
      if (m.quit) return;
      // The step as rank 0 laid it out (its reservations are among the calls); only the
      // final hidden states, which nothing here reads: no output head.
      tokens_.clear();
      positions_.clear();
      slices_.clear();
      out_rows_.clear();
      for (const detail::StepChunk& c : m.chunks)
        append_slice(c.seq, c.tokens, kv_->length(c.seq), tokens_, positions_, slices_);
      if (tokens_.empty()) throw Error("a step message without tokens");
      out_rows_.push_back(int32_t(tokens_.size()) - 1);
      execute_step(true, true);
      tokens_evaluated_ += int64_t(tokens_.size());
      ++steps_;
    }
  } catch (const std::exception& e) {
    ranks_->abort(e.what());
  }
}

// NaN or infinite logits are never handed on as if they were a distribution:
// a NaN weight or an overflow gives all-NaN rows that samplers would turn into token 0
// or garbage without a word. Nor is a row whose values are all equal (decision 92): no
// model produces one, but a zeroed hidden state does, and greedy sampling would then
// emit token 0 forever. The scan is one pass over the rows handed out, a bit test and
// a compare per float (vectorizes), far cheaper than the output product that made them.
void Engine::check_logits(int64_t rows) const {
  const int64_t V = n_vocab();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &logits_[size_t(r * V)];
    uint32_t all_exp_ones = 0, differs = 0;
    for (int64_t i = 0; i < V; ++i) {
      uint32_t b;
      std::memcpy(&b, row + i, 4);
      all_exp_ones |= uint32_t((b & 0x7f800000u) == 0x7f800000u);
      differs |= uint32_t(row[i] != row[0]);
    }
    // One token has nothing to differ from (no model has one; guarded all the same).
    if (!all_exp_ones && (differs || V == 1)) continue;
    const int32_t batch_row = out_rows_[size_t(r)];
    const SeqSlice* slice = &slices_.front();
    for (const SeqSlice& s : slices_)
      if (batch_row >= s.first && batch_row < s.first + s.count) slice = &s;
    const std::string where = " at forward step " + std::to_string(steps_) + " (sequence " +
                              std::to_string(slice->seq) + ", position " +
                              std::to_string(slice->pos0 + batch_row - slice->first) + "): ";
    if (!all_exp_ones)
      throw Error("degenerate logits" + where + "all " + std::to_string(V) + " values are equal (" +
                  std::to_string(row[0]) + "); stopping. The weights may be damaged (try --check-tensors)");
    int64_t first = 0, count = 0;
    for (int64_t i = 0; i < V; ++i)
      if (!std::isfinite(row[i]) && count++ == 0) first = i;
    const float v = row[first];
    throw Error("non-finite logits" + where + std::to_string(count) + " of " + std::to_string(V) + " values are " +
                (std::isnan(v) ? "nan" : "infinite") + " (first at token id " + std::to_string(first) +
                "); stopping. The weights may hold NaN/Inf (try --check-tensors)");
  }
}

std::span<const float> Engine::eval(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) throw Error("nothing to evaluate: empty token list");
  const int64_t n = int64_t(tokens.size()), V = n_vocab();
  if (position() + n > n_ctx_)
    throw Error("context is full: " + std::to_string(position() + n) + " positions needed, context size is " +
                std::to_string(n_ctx_));
  if (n <= batch_tokens_) {
    const Chunk c{seq_, tokens, all_logits ? Logits::All : Logits::Last};
    return forward(std::span<const Chunk>(&c, 1));
  }
  // Chunked prefill: bounded scratch whatever the prompt length.
  eval_logits_.clear();
  for (int64_t first = 0; first < n; first += batch_tokens_) {
    const int64_t count = std::min(batch_tokens_, n - first);
    const bool last = first + count == n;
    const Chunk c{seq_, tokens.subspan(size_t(first), size_t(count)),
                  all_logits ? Logits::All : last ? Logits::Last : Logits::None};
    auto rows = forward(std::span<const Chunk>(&c, 1));
    if (all_logits || last) eval_logits_.insert(eval_logits_.end(), rows.begin(), rows.end());
  }
  if (eval_logits_.size() != size_t((all_logits ? n : 1) * V)) throw Error("internal: chunked logits have the wrong size");
  return eval_logits_;
}

int64_t Engine::position() const { return kv_->length(seq_); }

void Engine::reset() {
  kv_->free_sequence(seq_);
  seq_ = kv_->create_sequence();
}

void Engine::set_profile(OpProfile* profile) { scheduler_->set_profile(profile); }

Engine::PlanCacheStats Engine::plan_cache() const { return {scheduler_->plan_hits(), scheduler_->plan_misses()}; }

TransferStats Engine::transfers() const {
  TransferStats total;
  for (const auto& b : scheduler_->backends()) {
    const TransferStats t = b->transfers();
    total.upload_bytes += t.upload_bytes;
    total.download_bytes += t.download_bytes;
  }
  return total;
}

std::string Engine::placement() const { return scheduler_->describe(graph_); }

}  // namespace tessera
