#version 450
// One work group per row: y = x * (1 / sqrt(mean(x^2) + eps)), then * weight.
// push: 0 K, 1 rows, 2 offX, 3 offW (in binding 1; 0xFFFFFFFF: none), 4 offY, 5 eps
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
shared float red[64];

void main() {
  uint row = wg_index();
  if (row >= pc.u[1]) return;
  uint K = pc.u[0], tid = gl_LocalInvocationID.x;
  uint xo = pc.u[2] + 4u * K * row, yo = pc.u[4] + 4u * K * row;
  float s = 0.0;
  for (uint i = tid; i < K; i += 64u) {
    float v = a_f32(xo + 4u * i);
    s += v * v;
  }
  red[tid] = s;
  barrier();
  for (uint st = 32u; st > 0u; st >>= 1) {
    if (tid < st) red[tid] += red[tid + st];
    barrier();
  }
  float mean = red[0] / float(K);
  float scale = 1.0 / sqrt(mean + PF(5));
  bool hasw = pc.u[3] != 0xFFFFFFFFu;
  for (uint i = tid; i < K; i += 64u) {
    precise float y = a_f32(xo + 4u * i) * scale;
    if (hasw) y = y * w_f32(pc.u[3] + 4u * i);
    a_st(yo + 4u * i, y);
  }
}
