// Token sampler: repetition penalty, then greedy (temperature <= 0) or top-k, top-p,
// min-p and temperature followed by a seeded draw. Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

namespace tessera {

struct SamplerParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  // Pick the next token from one row of logits (does not record it).
  int32_t sample(std::span<const float> logits);
  // Record a token for the repetition penalty (prompt tokens and generated ones).
  void accept(int32_t token);
  const SamplerParams& params() const { return p_; }

 private:
  struct Candidate { int32_t id; float logit; };
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;
  std::vector<Candidate> cand_;  // reused across calls
};

}  // namespace tessera
