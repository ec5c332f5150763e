#version 450
// Rows of A (na values) followed by the same rows of B (nb values): one invocation per
// output value, a copy.
// push: 0 na, 1 nb, 2 rows, 3 offA, 4 offB, 5 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  uint na = pc.u[0], nb = pc.u[1], width = na + nb;
  if (i >= width * pc.u[2]) return;
  uint row = i / width, e = i % width;
  float v = e < na ? a_f32(pc.u[3] + 4u * (row * na + e)) : a_f32(pc.u[4] + 4u * (row * nb + e - na));
  a_st(pc.u[5] + 4u * i, v);
}
