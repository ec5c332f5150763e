// What a drafted token costs, measured while generating. A step's time grows with its
// tokens: a least-squares line over the recent steps (older ones fade) gives the time
// of a step without drafts and what each extra token adds, which depends on the
// backend (a memory-bound decode verifies a few tokens almost for free; a
// compute-bound one pays for each). Drafting takes its own time per token. Until the
// steps have shown how their time grows, the drafter's own estimate stands in.
#pragma once
#include <cstdint>

namespace tessera {

class SpeculationCost {
 public:
  // A forward step of `tokens` tokens took `seconds`.
  void record_step(int64_t tokens, double seconds);
  // The drafter proposed `tokens` tokens in `seconds`.
  void record_draft(int64_t tokens, double seconds);
  // The time of drafting and verifying one token, relative to one sequence's share of
  // a step in which `decoding` sequences decode one token each without drafts (the unit
  // choose_draft_length weighs it in); `prior` while the steps do not show it yet.
  double relative_cost(int64_t decoding, double prior) const;

 private:
  // Weighted sums for the line time = a + b * tokens; each record keeps kKeep of the
  // weight of those before it.
  static constexpr double kKeep = 0.97;
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
  double draft_seconds_ = 0, draft_tokens_ = 0;
};

}  // namespace tessera
