// Median, minimum and maximum of a probe's repeated measurements (membw.cpp,
// compute_peak.cpp, dispatch_probe.cpp). Internal to the probes library.
#pragma once
#include <algorithm>
#include <vector>

namespace tessera::detail {

struct Spread {
  double median = 0, min = 0, max = 0;
};

// v must not be empty; it is sorted in place.
inline Spread spread(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

}  // namespace tessera::detail
