// The engine: opens a model file through the loader plugins, builds its
// architecture, creates the selected backends (best-ranked first) with a shared
// FastPool, and evaluates batches of tokens of one sequence over the paged KV cache.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/graph.h"
#include "tessera/kv_cache.h"

namespace tessera {

class PluginRegistry;
class ModelFile;
class ModelLoader;
class Model;
class Tokenizer;
class Scheduler;
class FastPool;

struct EngineOptions {
  std::string model_path;
  // Backends by name in preference order; empty = every usable backend, by rank.
  std::vector<std::string> backends;
  int threads = 0;         // executors for the FastPool; 0 = all hardware threads
  int64_t n_ctx = 0;       // KV positions; 0 = min(model context length, 4096)
  int page_tokens = 16;    // KV cache page size
};

class Engine {
 public:
  Engine(const PluginRegistry& registry, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelFile& file() const { return *file_; }
  const Model& model() const { return *model_; }
  // Throws tessera::Error if the file has no usable tokenizer metadata.
  const Tokenizer& tokenizer() const;
  const Scheduler& scheduler() const { return *scheduler_; }
  int threads() const;
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_vocab() const;

  // Feed `tokens` at the next positions of the sequence as one batch. Returns the
  // logits: n_vocab floats per token if all_logits, else for the last token only.
  // Throws tessera::Error if the context is full or a token id is out of range.
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);
  int64_t position() const { return pos_; }
  // Forget the sequence (the KV cache is emptied).
  void reset();
  // Placement of the last evaluated graph, one line per node.
  std::string placement() const;

 private:
  std::unique_ptr<FastPool> pool_;
  std::shared_ptr<ModelLoader> loader_;  // keeps the loader plugin alive while the file is open
  std::unique_ptr<ModelFile> file_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string tokenizer_error_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KvCache> kv_;
  KvCache::SeqId seq_ = 0;
  int64_t n_ctx_ = 0, pos_ = 0;
  Graph graph_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<float> logits_;
};

}  // namespace tessera
