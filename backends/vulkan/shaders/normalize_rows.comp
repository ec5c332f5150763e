#version 450
// Each row divided by max(its sum, minimum), times a scale (a router's chosen weights):
// one invocation per row, the sum in order.
// push: 0 K, 1 rows, 2 offX, 3 offY, 4 scale, 5 minimum sum
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

void main() {
  uint row = global_index();
  if (row >= pc.u[1]) return;
  uint K = pc.u[0];
  uint xo = pc.u[2] + 4u * K * row, yo = pc.u[3] + 4u * K * row;
  precise float s = 0.0;
  for (uint i = 0u; i < K; ++i) s += a_f32(xo + 4u * i);
  s = max(s, PF(5));
  for (uint i = 0u; i < K; ++i) {
    precise float y = a_f32(xo + 4u * i) / s * PF(4);
    a_st(yo + 4u * i, y);
  }
}
