// The cos/sin of every rotated pair of a Rope node (graph.h) at one position, as the
// reference computes them (ggml's rope cache): theta = position * theta_scale^i by
// repeated multiplication in float, angle = freq_scale * theta (divided by the pair's
// frequency factor where src2 holds them), std::cos / std::sin of it. Multi-section
// RoPE (text): pairs outside the t, h and w sections rotate by position 0. Header-only:
// every backend fills its table with this one definition, so their angles are equal.
#pragma once
#include <cmath>
#include <cstdint>

#include "tessera/graph.h"

namespace tessera {

class RopeTable {
 public:
  explicit RopeTable(const Node& n)
      : n_dims_(n.i[0]),
        imrope_(n.i[1] == kRopeImrope),
        sec_{n.i[2], n.i[3], n.i[4], n.i[5]},
        sect_dims_(n.i[2] + n.i[3] + n.i[4] + n.i[5]),
        freq_scale_(n.f[1]),
        theta_scale_(std::pow(n.f[0], -2.0f / float(n.i[0]))) {}

  // cs[i0] = cos, cs[i0 + 1] = sin of pair i0 / 2, for i0 in [0, n_dims) step 2;
  // factors: the node's src2 data, or null.
  void cos_sin(int32_t position, const float* factors, float* cs) const {
    float theta = float(position), theta_e = 0.0f;
    for (int32_t i0 = 0; i0 < n_dims_; i0 += 2) {
      float th = theta;
      if (imrope_) {
        const int32_t sector = (i0 / 2) % sect_dims_;
        const bool t_h_w = (sector % 3 == 1 && sector < 3 * sec_[1]) || (sector % 3 == 2 && sector < 3 * sec_[2]) ||
                           (sector % 3 == 0 && sector < 3 * sec_[0]);
        if (!t_h_w) th = theta_e;
      }
      const float ang = freq_scale_ * (factors ? th / factors[i0 / 2] : th);
      cs[i0] = std::cos(ang);
      cs[i0 + 1] = std::sin(ang);
      theta *= theta_scale_;
      theta_e *= theta_scale_;
    }
  }

 private:
  int32_t n_dims_;
  bool imrope_;
  int32_t sec_[4];
  int32_t sect_dims_;
  float freq_scale_, theta_scale_;
};

}  // namespace tessera
