// Speculative decoding's drafters. A drafter proposes tokens that may continue a
// sequence; the Generator feeds them after the sequence's next token in one forward
// step, keeps the longest prefix its sampler accepts (Sampler::verify) and rolls the
// KV cache back past it. A proposal is either deterministic given the tokens (a point
// mass: n-gram lookup, a draft model's argmax) or drawn from a distribution the
// drafter hands over with it (a draft model sampling as the request does).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/sampler.h"

namespace tessera {

class Engine;
class PluginRegistry;
struct EngineOptions;

// One sequence asking for proposals.
struct DraftRequest {
  uint64_t id = 0;                  // the generation request's id
  std::span<const int32_t> tokens;  // its prompt and generated tokens so far
  int max_tokens = 0;               // propose at most this many (>= 1)
  std::vector<int32_t>* out = nullptr;  // proposals are appended here (none is fine)
  // The request's sampling; a drafter with a distribution of its own (a draft model)
  // may then draw its proposals from it, appending to `drawn_from` what each was drawn
  // from (one per proposal; Sampler::verify weighs the draft by it). Left empty, the
  // proposals are point masses.
  const SamplerParams* sampling = nullptr;
  std::vector<TokenDistribution>* drawn_from = nullptr;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // "ngram", "draft" (as --spec names them).
  virtual std::string name() const = 0;
  // The cost of drafting and verifying one token relative to one decode step of the
  // target model: what the Generator weighs against the acceptance it measures when
  // it chooses how many tokens to ask for.
  virtual double relative_cost() const = 0;
  // Proposals for every request (one call per step, so a model drafter batches them).
  virtual void propose(std::span<const DraftRequest> requests) = 0;
  // The request finished, was cancelled or preempted: drop what is kept for it.
  virtual void release(uint64_t id) { (void)id; }
};

// Prompt lookup: the tokens that followed the most recent earlier occurrence of the
// sequence's last n tokens (prompt and generated alike), trying n from max_n down to
// min_n, continued periodically past the sequence's end (a loop goes on). No model.
struct NgramDrafterOptions {
  int min_n = 2;
  int max_n = 4;
};
std::unique_ptr<Drafter> make_ngram_drafter(const NgramDrafterOptions& options = {});

// A second, smaller model with the same vocabulary, run by its own Engine (its KV paged
// too), one batched forward step per drafted position: its argmax for greedy requests,
// and for sampling ones a draw with the request's temperature, top-k, top-p, min-p
// and logit biases (no penalties), handed over with its distribution. `options`
// names the draft model; its context and sequence count are taken from `target`.
// Throws tessera::Error if the vocabularies differ or the draft model has recurrent
// layers (its state cannot be rolled back).
std::unique_ptr<Drafter> make_draft_model_drafter(const PluginRegistry& registry, EngineOptions options,
                                                  const Engine& target);

// The draft length that maximises the expected tokens per unit of step cost, given a
// per-token acceptance probability and a drafter's relative cost: tokens gained by a
// draft of k, (1 - a^(k+1)) / (1 - a), over the cost 1 + cost * k; 0 <= result <=
// max_tokens, 0 when no draft beats plain decoding (one token per step at cost 1).
int choose_draft_length(double acceptance, double cost, int max_tokens);

}  // namespace tessera
