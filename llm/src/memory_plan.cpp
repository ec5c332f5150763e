// Splitting the memory budget between weights, the expert cache and the KV pool
// (memory_plan.h; the rules are decisions 85-89 in docs/decisions.md).
#include "tessera/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "expert_stream/model_experts.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/model.h"

namespace tessera {

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;

uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// What scratch (one step's intermediates), logits, I/O buffers, the tokenizer and the
// page cache of the weights being read take beside the planned sizes: an eighth of the
// budget, between 512 MiB and 2 GiB.
uint64_t headroom_for(const MemoryBudget& b) {
  if (!b.limited()) return 2 * kGiB;
  return std::clamp<uint64_t>(b.bytes / 8, 512 * kMiB, 2 * kGiB);
}

std::string positions(int64_t n) { return std::to_string(n) + " positions"; }

}  // namespace

MemoryNeeds memory_needs(Model& model, const EngineOptions& opt, int64_t n_ctx, bool quantized_experts) {
  MemoryNeeds n;
  const detail::ExpertBytes b = detail::expert_bytes(model);
  n.weights = b.all;
  if (model.info().n_expert > 0 && !quantized_experts) {
    n.expert_weights = b.experts;
    n.min_expert_cache = b.largest_layer;
  }
  n.page_tokens = opt.page_tokens > 0 ? opt.page_tokens : 16;
  n.n_ctx = n_ctx;
  n.max_sequences = std::max(1, opt.max_sequences);
  n.expert_cache_request = opt.expert_cache_bytes;
  KvCacheConfig c = model.kv_config(n_ctx, n.page_tokens);
  c.window_slack = opt.kv_window_slack;
  // As KvCache lays a page out: every layer's K and V plane (K only when V is read out
  // of K), each 64-byte aligned; sliding-window layers' planes in their own pool.
  const uint64_t plane = (uint64_t(n.page_tokens) * uint64_t(c.n_kv_heads) * uint64_t(c.head_dim) * 2 + 63) / 64 * 64;
  const uint64_t per_layer = plane * (c.v_in_k > 0 ? 1 : 2);
  const uint64_t window_layers = uint64_t(c.window_layer_count());
  n.kv_page_bytes = per_layer * (uint64_t(c.n_layers) - window_layers);
  n.pages_per_sequence = c.n_pages;
  if (window_layers > 0) {
    n.window_page_bytes = per_layer * window_layers;
    n.window_pages_per_sequence = std::min<int64_t>(c.n_pages, c.window_pages_per_sequence(opt.batch_tokens));
  }
  n.kv_sequence_bytes = uint64_t(c.recurrent.n_layers) * uint64_t(c.recurrent.conv_elems + c.recurrent.state_elems) * 4;
  return n;
}

uint64_t MemoryPlan::resident_weights() const {
  return stream_experts ? needs.weights - needs.expert_weights + expert_cache : needs.weights;
}

int64_t MemoryPlan::window_pages() const {
  return std::min(kv_pages, needs.window_pages_per_sequence * needs.max_sequences);
}

uint64_t MemoryPlan::kv_bytes() const {
  return uint64_t(kv_pages) * needs.kv_page_bytes + uint64_t(window_pages()) * needs.window_page_bytes +
         uint64_t(needs.max_sequences) * needs.kv_sequence_bytes;
}

std::string MemoryPlan::describe() const {
  std::string s;
  if (stream_experts)
    s += "weights " + format_memory(needs.weights - needs.expert_weights) + " resident, routed experts (" +
         format_memory(needs.expert_weights) + ") streamed through a " + format_memory(expert_cache) + " cache";
  else
    s += "weights " + format_memory(needs.weights) + " resident";
  const int64_t want = needs.pages_per_sequence * needs.max_sequences;
  s += "; KV cache " + format_memory(kv_bytes()) + " (";
  if (kv_pages < want) s += std::to_string(kv_pages * needs.page_tokens) + " of ";
  s += std::to_string(needs.max_sequences) + " x " + std::to_string(needs.n_ctx) + " positions";
  if (needs.window_page_bytes > 0)
    s += "; sliding-window layers " + std::to_string(window_pages() * needs.page_tokens) + " positions";
  s += ")";
  return s;
}

MemoryPlan plan_memory(const MemoryNeeds& n, const MemoryBudget& budget) {
  MemoryPlan p;
  p.budget = budget;
  p.needs = n;
  const bool limited = budget.limited();
  const uint64_t B = budget.bytes;
  p.headroom = headroom_for(budget);
  const int64_t want_pages = n.pages_per_sequence * n.max_sequences;
  // Per sequence besides the main pool's pages: recurrent state and the window pool.
  const uint64_t seq_state =
      uint64_t(n.max_sequences) * (n.kv_sequence_bytes + uint64_t(n.window_pages_per_sequence) * n.window_page_bytes);
  const uint64_t kv_full = uint64_t(want_pages) * n.kv_page_bytes + seq_state;
  const uint64_t kv_one = uint64_t(n.pages_per_sequence) * n.kv_page_bytes + n.kv_sequence_bytes +
                          uint64_t(n.window_pages_per_sequence) * n.window_page_bytes;
  const uint64_t other = n.weights - n.expert_weights;
  const bool moe = n.expert_weights > 0;
  const bool auto_cache = n.expert_cache_request < 0;

  // Experts: a cache the user sized, or streaming chosen because the whole model, the
  // full KV pool and the headroom do not fit. The cache takes what the rest leaves.
  if (moe && n.expert_cache_request > 0) {
    p.stream_experts = true;
    p.expert_cache = uint64_t(n.expert_cache_request);
  } else if (moe && auto_cache && limited && n.weights + kv_full + p.headroom > B) {
    p.stream_experts = true;
    p.expert_cache = std::max(minus(B, other + kv_full + p.headroom), n.min_expert_cache);
    p.warnings.push_back("the model (" + format_memory(n.weights) + ") does not fit in the " + budget.describe() +
                         " beside its KV cache (" + format_memory(kv_full) + ") and " + format_memory(p.headroom) +
                         " of headroom: streaming its routed experts from the file through a " +
                         format_memory(p.expert_cache) +
                         " cache (--expert-cache SIZE to choose, off to keep them all resident)");
  }

  // KV: max_sequences full contexts when they fit beside the weights and the headroom,
  // else what fits, but never less than one full context.
  const uint64_t resident = p.resident_weights();
  const uint64_t kv_room = minus(B, resident + p.headroom);
  p.kv_pages = want_pages;
  if (limited && kv_full > kv_room && n.kv_page_bytes > 0) {
    const int64_t fit = int64_t(minus(kv_room, seq_state) / n.kv_page_bytes);
    p.kv_pages = std::clamp(fit, n.pages_per_sequence, want_pages);
    if (p.kv_pages < want_pages) {
      char contexts[32];
      std::snprintf(contexts, sizeof contexts, "%.1f", double(p.kv_pages) / double(n.pages_per_sequence));
      p.warnings.push_back(
          "KV cache: " + std::to_string(n.max_sequences) + " sequences x " + positions(n.n_ctx) + " need " +
          format_memory(kv_full) + ", but the " + budget.describe() + " leaves " + format_memory(kv_room) + " after " +
          format_memory(resident) + " of weights and " + format_memory(p.headroom) +
          " of headroom: the pool holds " + positions(p.kv_pages * n.page_tokens) + " (" + contexts +
          " full contexts), and sequences beyond them wait for free pages. Lower --parallel or --ctx to choose, or "
          "raise the memory limit");
    }
  }

  // The least that can run: the weights that must stay resident (with the smallest
  // expert cache when streaming automatically) and one context of KV.
  const uint64_t least_weights = p.stream_experts ? other + (auto_cache ? n.min_expert_cache : p.expert_cache) : n.weights;
  const uint64_t least = least_weights + kv_one;
  if (limited && least > B) {
    std::string what;
    if (p.stream_experts && auto_cache)
      what = "its weights other than the routed experts (" + format_memory(other) + "), the smallest expert cache (" +
             format_memory(n.min_expert_cache) + ", one layer's experts)";
    else if (p.stream_experts)
      what = "its weights other than the routed experts (" + format_memory(other) + "), --expert-cache (" +
             format_memory(p.expert_cache) + ")";
    else
      what = "its weights (" + format_memory(n.weights) + ")";
    std::string msg = "the model does not fit in the " + budget.describe() + ": " + what +
                      " and the KV cache of one context (" + format_memory(kv_one) + ", " + positions(n.n_ctx) +
                      ") need " + format_memory(least) + " before any scratch memory. ";
    if (moe && !p.stream_experts)
      msg += "Choose --expert-cache auto (streams the experts from the file), lower --ctx, or raise the memory limit";
    else if (p.stream_experts && !auto_cache)
      msg += "Choose a smaller --expert-cache (or auto), lower --ctx, or raise the memory limit";
    else
      msg += "Lower --ctx, or raise the memory limit";
    if (budget.hard()) throw Error(msg);
    p.warnings.push_back(msg + " (going on: memory available is an estimate, but the system may swap or kill the "
                               "process)");
  } else if (limited && least + p.headroom > B) {
    p.warnings.push_back("the " + budget.describe() + " leaves " + format_memory(minus(B, least)) +
                         " beside the weights and one context of KV cache, less than the " +
                         format_memory(p.headroom) + " of headroom planned for scratch memory and buffers");
  }
  return p;
}

}  // namespace tessera
