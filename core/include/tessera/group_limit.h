// Op::GroupLimit of one row, the reference's arithmetic: the E scores fall in `groups`
// equal groups, each scored by its best value (or its best two summed, when a group
// has more than one); the `kept` best groups keep their scores (ties go to the lower
// group), every other score becomes -inf. Header-only, so a plugin compiles it in.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace tessera {

// score and order are the caller's scratch (resized here).
inline void group_limit_row(const float* in, float* out, int64_t E, int64_t groups, int64_t kept,
                            std::vector<float>& score, std::vector<int64_t>& order) {
  const int64_t per = E / groups;
  const float none = -std::numeric_limits<float>::infinity();
  score.resize(size_t(groups));
  order.resize(size_t(groups));
  for (int64_t g = 0; g < groups; ++g) {
    float first = none, second = none;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (in[e] > first) second = first, first = in[e];
      else if (in[e] > second) second = in[e];
    }
    score[size_t(g)] = per == 1 ? first : first + second;
    order[size_t(g)] = g;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return score[size_t(p)] > score[size_t(q)]; });
  // Kept groups' scores in place; order's first `kept` entries name them.
  std::vector<bool> keep(size_t(groups), false);
  for (int64_t k = 0; k < kept && k < groups; ++k) keep[size_t(order[size_t(k)])] = true;
  for (int64_t e = 0; e < E; ++e) out[e] = keep[size_t(e / per)] ? in[e] : none;
}

}  // namespace tessera
