// Server counters and latency histograms, rendered in Prometheus' text format
// (GET /metrics). Updated from the engine worker and the HTTP handlers.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace tessera::server {

// A Prometheus histogram with fixed bucket bounds (seconds).
class Histogram {
 public:
  void observe(double seconds);
  // "name_bucket{le=...} n" lines, then _sum and _count.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  static constexpr std::array<double, 12> kBounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> counts_{};  // last: +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct Metrics {
  std::atomic<int64_t> requests_running{0}, requests_waiting{0};
  std::atomic<int64_t> kv_pages_used{0}, kv_pages_total{0};
  std::atomic<int64_t> prompt_tokens_total{0}, generated_tokens_total{0}, prefix_cache_hit_tokens_total{0};
  std::atomic<int64_t> requests_total{0}, request_errors_total{0};
  std::atomic<int64_t> plan_cache_hits_total{0}, plan_cache_misses_total{0};
  // HTTP limits (GuardedServer): connections served now, connections answered 503
  // beyond --max-connections, requests refused for their size or for arriving too slowly.
  std::atomic<int64_t> http_connections_open{0}, http_connections_refused_total{0}, http_requests_refused_total{0};
  // Speculative decoding: tokens drafted and tokens the verification accepted.
  std::atomic<int64_t> spec_drafted_tokens_total{0}, spec_accepted_tokens_total{0};
  // Requests cancelled because their client went away.
  std::atomic<int64_t> requests_cancelled_total{0};
  // POST /v1/embeddings answered, the inputs they held, and those inputs' tokens.
  std::atomic<int64_t> embedding_requests_total{0}, embedding_inputs_total{0}, embedding_tokens_total{0};
  Histogram time_to_first_token, inter_token_latency;
  std::string render() const;
};

}  // namespace tessera::server
