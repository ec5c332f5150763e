#include "tessera/speculation_cost.h"

#include <algorithm>

namespace tessera {

void SpeculationCost::record_step(int64_t tokens, double seconds) {
  const double x = double(tokens);
  w_ = kKeep * w_ + 1;
  x_ = kKeep * x_ + x;
  y_ = kKeep * y_ + seconds;
  xx_ = kKeep * xx_ + x * x;
  xy_ = kKeep * xy_ + x * seconds;
}

void SpeculationCost::record_draft(int64_t tokens, double seconds) {
  draft_tokens_ = kKeep * draft_tokens_ + double(tokens);
  draft_seconds_ = kKeep * draft_seconds_ + seconds;
}

double SpeculationCost::relative_cost(int64_t decoding, double prior) const {
  if (w_ <= 0 || decoding < 1) return prior;
  const double mx = x_ / w_, my = y_ / w_;
  // Token counts that hardly vary (every step alike) do not show the slope.
  const double var = xx_ / w_ - mx * mx;
  if (var < 0.1) return prior;
  const double per_token = std::max(0.0, (xy_ / w_ - mx * my) / var);
  const double plain = (my - per_token * mx) + per_token * double(decoding);
  if (plain <= 0) return prior;
  const double drafting = draft_tokens_ > 0 ? draft_seconds_ / draft_tokens_ : 0.0;
  return (per_token + drafting) * double(decoding) / plain;
}

}  // namespace tessera
