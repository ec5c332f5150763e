// Helpers shared by architectures: typed hyperparameter reads keyed by architecture
// and weight lookup with shape validation.
#pragma once
#include <initializer_list>
#include <string>

#include "tessera/error.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"
#include "tessera/model_file.h"

namespace tessera::models {

// KV geometry of an attention model: one K/V row of n_head_kv * head_dim per layer
// and position, pages enough for n_ctx positions.
KvCacheConfig paged_kv_config(const ModelInfo& info, int64_t n_ctx, int page_tokens);

class WeightSource {
 public:
  WeightSource(const ModelFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  const Metadata& md() const { return file_.metadata(); }
  // "<arch>.<suffix>" as integer/float; `fallback` when absent (required if no fallback).
  int64_t hp_int(const std::string& suffix) const;
  int64_t hp_int(const std::string& suffix, int64_t fallback) const;
  float hp_float(const std::string& suffix, float fallback) const;

  // The tensor `name` with exactly this shape (ggml order); throws naming the
  // tensor and both shapes otherwise. Optional variant returns an empty Tensor.
  Tensor require(const std::string& name, std::initializer_list<int64_t> shape) const;
  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  const TensorInfo* find(const std::string& name) const { return file_.find_tensor(name); }

 private:
  const ModelFile& file_;
  std::string arch_;
};

}  // namespace tessera::models
