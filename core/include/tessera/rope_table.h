// The cos/sin of every rotated pair of a Rope node (graph.h) at one position, as the
// reference computes them (ggml's rope cache): theta = position * theta_scale^i by
// repeated multiplication in float, angle = freq_scale * theta (divided by the pair's
// frequency factor where src2 holds them), std::cos / std::sin of it. Multi-section
// RoPE (text): pairs outside the t, h and w sections rotate by position 0. YaRN (the
// node's f[2] != 0): pair i's angle blends the interpolated and the original angle by
// ggml's ramp over the correction dimensions, and cos/sin are scaled by attn_factor x
// (1 + 0.1 ln(1 / freq_scale)). Header-only:
// every backend fills its table with this one definition, so their angles are equal.
#pragma once
#include <algorithm>
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
        theta_scale_(std::pow(n.f[0], -2.0f / float(n.i[0]))),
        ext_factor_(n.f[2]),
        mscale_(n.f[2] != 0.0f ? n.f[3] * (1.0f + 0.1f * std::log(1.0f / n.f[1])) : 1.0f),
        corr_low_(float(n.i[6])),
        corr_high_(float(n.i[7])) {}

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
      const float extrap = factors ? th / factors[i0 / 2] : th;
      float ang = freq_scale_ * extrap;
      if (ext_factor_ != 0.0f) {
        const float y = (float(i0 / 2) - corr_low_) / std::max(0.001f, corr_high_ - corr_low_);
        const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * ext_factor_;
        ang = ang * (1.0f - mix) + extrap * mix;
        cs[i0] = std::cos(ang) * mscale_;
        cs[i0 + 1] = std::sin(ang) * mscale_;
      } else {
        cs[i0] = std::cos(ang);
        cs[i0 + 1] = std::sin(ang);
      }
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
  float ext_factor_, mscale_, corr_low_, corr_high_;
};

// YaRN's correction dimensions (ggml's): the rotated dimensions whose wavelength spans
// beta_fast and beta_slow rotations over the original context, floored and ceiled, clamped
// to [0, n_dims - 1]. They go into a Rope node's i[6] and i[7].
inline void rope_yarn_corr_dims(int32_t n_dims, int64_t n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                                int32_t out[2]) {
  auto dim = [&](float rotations) {
    return float(n_dims) * std::log(float(n_ctx_orig) / (rotations * 2.0f * 3.14159265358979323846f)) /
           (2.0f * std::log(freq_base));
  };
  const float start = std::floor(dim(beta_fast)), end = std::ceil(dim(beta_slow));
  out[0] = int32_t(std::max(0.0f, start));
  out[1] = int32_t(std::min(float(n_dims - 1), end));
}

}  // namespace tessera
