// How many tokens to draft (drafter.h): the expected accepted run of a draft of k
// tokens, each accepted with probability a until the first rejection, plus the token
// the verification step samples itself, is (1 - a^(k+1)) / (1 - a); a step with k
// drafted tokens costs 1 + cost * k decode steps. 0 when no draft length beats plain
// decoding (the acceptance is below the cost).
#include <algorithm>
#include <cmath>

#include "tessera/drafter.h"

namespace tessera {

int choose_draft_length(double acceptance, double cost, int max_tokens) {
  const double a = std::clamp(acceptance, 0.0, 0.999);
  // No draft is worth 1 token per step at cost 1.
  int best = 0;
  double best_value = 1.0;
  for (int k = 1; k <= std::max(1, max_tokens); ++k) {
    const double value = (1.0 - std::pow(a, k + 1)) / (1.0 - a) / (1.0 + std::max(0.0, cost) * k);
    if (value > best_value) {
      best_value = value;
      best = k;
    }
  }
  return best;
}

}  // namespace tessera
