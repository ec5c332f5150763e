// How the engine's automatic sizes split the memory budget (memory_budget.h): whether
// a MoE model's routed experts stay resident or stream through a cache (and its
// size), and how many positions the KV page pool holds. See docs/hardening.md,
// "Memory limits".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/memory_budget.h"

namespace tessera {

class Model;
struct EngineOptions;

// What a model needs in memory, before anything is allocated.
struct MemoryNeeds {
  uint64_t weights = 0;            // every weight, as the model reads them
  uint64_t expert_weights = 0;     // of which routed experts that may stream (0: none may)
  uint64_t min_expert_cache = 0;   // one layer's routed experts: the smallest cache that works
  uint64_t kv_page_bytes = 0;      // one KV page (every attention layer, K and V)
  uint64_t kv_sequence_bytes = 0;  // per sequence besides its pages (recurrent state)
  int64_t pages_per_sequence = 0;  // pages of one full context
  // Sliding-window layers: one page of theirs (0: none), and the pages a sequence keeps
  // of them (its window, window_slack and one step's positions).
  uint64_t window_page_bytes = 0;
  int64_t window_pages_per_sequence = 0;
  int64_t max_sequences = 1;
  int64_t n_ctx = 0;
  int page_tokens = 16;
  // EngineOptions::expert_cache_bytes: -1 auto, 0 off, > 0 a cache of that size.
  int64_t expert_cache_request = -1;
};

// The needs of `model` run with `options` (n_ctx already resolved by the caller: > 0).
// quantized_experts: --quantize made the experts copies in memory (they cannot stream).
MemoryNeeds memory_needs(Model& model, const EngineOptions& options, int64_t n_ctx, bool quantized_experts);

struct MemoryPlan {
  MemoryBudget budget;
  MemoryNeeds needs;
  bool stream_experts = false;
  uint64_t expert_cache = 0;     // when streaming: the cache's size
  int64_t kv_pages = 0;          // the pool's pages (pages_per_sequence * max_sequences unless shrunk)
  uint64_t headroom = 0;         // left for scratch, buffers and the page cache
  std::vector<std::string> warnings;  // said once at start (spdlog::warn)

  // The sliding-window layers' pool: max_sequences windows, never more than kv_pages.
  int64_t window_pages() const;
  uint64_t resident_weights() const;  // weights kept in memory plus the expert cache
  uint64_t kv_bytes() const;          // the pool and per-sequence state
  // The split, after budget.describe(): "weights 1.0 GiB resident, routed experts
  // (16.3 GiB) streamed through a 9.1 GiB cache; KV cache 384 MiB (1 x 4096 positions)"
  std::string describe() const;
};

// Splits `budget` between the needs. Automatic choices (expert_cache_request -1) keep
// every expert resident when the model, the full KV pool and the headroom fit, else
// stream them through what is left (at least min_expert_cache). The KV pool holds
// max_sequences full contexts when they fit beside the weights and the headroom, else
// fewer positions (at least one full context; a warning says so and how to choose).
// Throws tessera::Error with the numbers when the weights that must stay resident and
// one context of KV exceed a hard budget (cgroup, RLIMIT_AS); against MemAvailable
// alone this is a warning (the kernel may still reclaim or swap).
MemoryPlan plan_memory(const MemoryNeeds& needs, const MemoryBudget& budget);

}  // namespace tessera
