#version 450
// One invocation per element of x [hd, heads, T]. cos/sin come from a table the host
// computed exactly as the reference does (theta = p * theta_scale^i by repeated
// multiplication, std::cos/std::sin): [T][n_dims] floats, cos at even, sin at odd.
// push: 0 hd, 1 heads, 2 T, 3 n_dims, 4 neox, 5 offX, 6 offY, 7 offCS
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  uint hd = pc.u[0], heads = pc.u[1], T = pc.u[2], nd = pc.u[3];
  if (i >= hd * heads * T) return;
  uint d = i % hd, row = i / hd, t = row / heads;
  uint xo = pc.u[5] + 4u * hd * row;
  uint cs = pc.u[7] + 4u * nd * t;
  precise float y;
  if (d >= nd) {
    y = a_f32(xo + 4u * d);
  } else if (pc.u[4] == 0u) {
    uint i0 = d & ~1u;
    float c = a_f32(cs + 4u * i0), s = a_f32(cs + 4u * i0 + 4u);
    float x0 = a_f32(xo + 4u * i0), x1 = a_f32(xo + 4u * i0 + 4u);
    if ((d & 1u) == 0u) y = x0 * c - x1 * s;
    else y = x0 * s + x1 * c;
  } else {
    uint half_ = nd / 2u;
    uint ic = d < half_ ? d : d - half_;
    uint i0 = 2u * ic;
    float c = a_f32(cs + 4u * i0), s = a_f32(cs + 4u * i0 + 4u);
    float x0 = a_f32(xo + 4u * ic), x1 = a_f32(xo + 4u * (ic + half_));
    if (d < half_) y = x0 * c - x1 * s;
    else y = x0 * s + x1 * c;
  }
  a_st(pc.u[6] + 4u * i, y);
}
