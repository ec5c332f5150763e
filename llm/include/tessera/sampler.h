// Token sampler: logit biases, repetition, presence and frequency penalties, then
// greedy (temperature <= 0) or top-k, top-p, min-p and temperature followed by a
// seeded draw. Deterministic for a given seed. Also: token log-probabilities of a
// logits row (token_logprobs), computed only for requests that ask for them.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace tessera {

struct SamplerParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  // OpenAI's penalties over the generated tokens (not the prompt): a token's logit
  // loses presence_penalty once if it was generated, and frequency_penalty per time.
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  // Added to a token's logit first (OpenAI's logit_bias, [-100, 100]).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
};

// A token and its log-probability.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
};
// The log-probabilities a request asked for at one generated position.
struct TokenLogprobs {
  float logprob = 0.0f;           // of the chosen token
  std::vector<TokenLogprob> top;  // the n_top most likely tokens, most likely first
};
// Log-softmax of the model's raw logits row (before logit biases, penalties,
// temperature and truncation: the model's own distribution, as vLLM reports by
// default): the chosen token's log-probability and the n_top most likely tokens
// (ties: lower id first; n_top is clamped to the row's size). NaN logits count as
// -inf and +inf as the largest finite float, as in Sampler::sample. O(n log n_top).
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int n_top);

// A distribution over tokens: ids ascending, each with its probability; a token not
// listed has none. What a sampled draft was drawn from (Sampler::sample).
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  double prob(int32_t id) const;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  // Pick the next token from one row of logits (does not record it). A non-empty
  // `allowed` (bit i of word i / 64 for token i; grammar.h's TokenMask) leaves out every
  // other token before anything else is applied; tokens past its end are left out too.
  int32_t sample(std::span<const float> logits, std::span<const uint64_t> allowed = {});
  // Speculative decoding: the token at a position whose drafted token was `draft`.
  // Greedy: the argmax, accepted when it equals the draft. Otherwise the draft (a
  // point mass) is accepted with the probability the sampler gives it, and a rejected
  // draft is replaced by a draw from the sampler's distribution without it, so the
  // returned tokens follow the same distribution as sample() (Leviathan et al.). Does
  // not record the token.
  int32_t verify(std::span<const float> logits, int32_t draft, bool& accepted);
  // sample(), also giving the distribution the token was drawn from (greedy: the
  // argmax alone, with probability 1): what a drafter that samples hands to verify.
  int32_t sample(std::span<const float> logits, TokenDistribution& drawn_from);
  // verify() for a draft drawn from `q`: accepted with probability min(1, p / q) of
  // the draft, else replaced by a draw from max(p - q, 0) normalised, so the returned
  // tokens follow this sampler's distribution p whatever q is (Leviathan et al., Chen
  // et al.). With q a point mass this is verify() above.
  int32_t verify(std::span<const float> logits, int32_t draft, const TokenDistribution& q, bool& accepted);
  // Record a token for the repetition penalty (prompt tokens and generated ones).
  void accept(int32_t token);
  // Record a generated token for the presence and frequency penalties.
  void count_generated(int32_t token);
  const SamplerParams& params() const { return p_; }

 private:
  struct Candidate { int32_t id; float logit; };
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;
  std::vector<std::pair<int32_t, int32_t>> generated_;  // (token, times), in first-seen order
  std::vector<Candidate> cand_;  // reused across calls
  std::vector<double> residual_;  // verify with a drawn draft: max(p - q, 0) per candidate
  struct Keyed { uint32_t key; Candidate c; };
  std::vector<Keyed> keyed_;  // sort_by_logit's work buffers (two halves)
  // cand_ (in ascending id order) into descending logit, ascending id on ties.
  void sort_by_logit();
  int32_t candidates(std::span<const float> logits, std::span<const uint64_t> allowed = {});
  double uniform();
  double weight(size_t i) const;
  int32_t draw(double total, int32_t skip);
  // candidates(), then the candidates' total weight and the draft's (0 when it is not
  // among them); the argmax when greedy (weights left 0), else -1.
  int32_t weigh(std::span<const float> logits, int32_t draft, double& total, double& w_draft);
};

}  // namespace tessera
