#include "tessera/engine.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/open_model.h"
#include "tessera/plugin_registry.h"
#include "tessera/scheduler.h"
#include "tessera/tokenizer.h"

namespace tessera {

Engine::Engine(const PluginRegistry& registry, const EngineOptions& opt) {
  if (opt.threads < 0) throw Error("--threads must be >= 0");
  pool_ = std::make_unique<FastPool>(opt.threads);

  OpenedModel opened = open_model_file(registry, opt.model_path);
  loader_ = opened.loader;
  file_ = std::move(opened.file);
  model_ = Model::load(*file_);
  try {
    tokenizer_ = Tokenizer::from_metadata(file_->metadata());
  } catch (const Error& e) {
    tokenizer_error_ = e.what();
  }

  std::vector<std::string> names = opt.backends.empty() ? registry.ranked_backends() : opt.backends;
  if (names.empty()) throw Error("no usable backend plugin found (see `tessera backends`)");
  std::vector<std::shared_ptr<Backend>> backends;
  for (const auto& n : names) backends.push_back(registry.create_backend(n, pool_.get()));
  // The primary backend may repack weights into its own layout once, at load.
  for (Tensor* w : model_->weights()) backends.front()->prepare_weight(*w);
  scheduler_ = std::make_unique<Scheduler>(std::move(backends));

  const ModelInfo& mi = model_->info();
  n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(mi.context_length > 0 ? mi.context_length : 4096, 4096);
  if (opt.page_tokens <= 0) throw Error("KV page size must be positive");
  kv_ = std::make_unique<KvCache>(model_->kv_config(n_ctx_, opt.page_tokens));
  seq_ = kv_->create_sequence();
  spdlog::debug("engine: {} ({}), {} layers, context {}, {} threads", opt.model_path, mi.architecture,
                mi.n_layer, n_ctx_, pool_->executorCount());
}

Engine::~Engine() = default;

const Tokenizer& Engine::tokenizer() const {
  if (!tokenizer_) throw Error(file_->path() + ": no usable tokenizer: " + tokenizer_error_);
  return *tokenizer_;
}

int Engine::threads() const { return pool_->executorCount(); }

int64_t Engine::n_vocab() const { return model_->info().n_vocab; }

std::span<const float> Engine::eval(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) throw Error("nothing to evaluate: empty token list");
  const int64_t n = int64_t(tokens.size()), V = n_vocab();
  for (int32_t t : tokens)
    if (t < 0 || t >= V) throw Error("token id " + std::to_string(t) + " is out of range (vocabulary size " +
                                     std::to_string(V) + ")");
  if (pos_ + n > n_ctx_)
    throw Error("context is full: " + std::to_string(pos_ + n) + " positions needed, context size is " +
                std::to_string(n_ctx_));
  if (!kv_->reserve(seq_, pos_ + n)) throw Error("KV cache has no free pages left");

  tokens_.assign(tokens.begin(), tokens.end());
  positions_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) positions_[size_t(i)] = int32_t(pos_ + i);

  graph_.reset();
  ForwardBatch batch{tokens_, positions_, seq_, all_logits};
  int32_t out = model_->build_forward(graph_, *kv_, batch);
  graph_.allocate();
  scheduler_->run(graph_);

  const Tensor& lt = graph_.tensor(out);
  const int64_t rows = all_logits ? n : 1;
  if (lt.type != DType::F32 || lt.ne[0] != V || lt.ne[1] != rows) throw Error("internal: logits tensor has the wrong shape");
  logits_.resize(size_t(rows * V));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&logits_[size_t(r * V)], lt.row<float>(r), size_t(V) * sizeof(float));
  pos_ += n;
  return logits_;
}

void Engine::reset() {
  kv_->free_sequence(seq_);
  seq_ = kv_->create_sequence();
  pos_ = 0;
}

std::string Engine::placement() const { return scheduler_->describe(graph_); }

}  // namespace tessera
