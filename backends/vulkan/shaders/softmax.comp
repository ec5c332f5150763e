#version 450
// One work group per row: max, exp(x - max), sum, scale by 1/sum.
// push: 0 K, 1 rows, 2 offX, 3 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
shared float red[64];

void main() {
  uint row = wg_index();
  if (row >= pc.u[1]) return;
  uint K = pc.u[0], tid = gl_LocalInvocationID.x;
  uint xo = pc.u[2] + 4u * K * row, yo = pc.u[3] + 4u * K * row;
  float mx = uintBitsToFloat(0xFF800000u);
  for (uint i = tid; i < K; i += 64u) mx = max(mx, a_f32(xo + 4u * i));
  red[tid] = mx;
  barrier();
  for (uint st = 32u; st > 0u; st >>= 1) {
    if (tid < st) red[tid] = max(red[tid], red[tid + st]);
    barrier();
  }
  mx = red[0];
  barrier();
  float s = 0.0;
  for (uint i = tid; i < K; i += 64u) {
    float e = exp(a_f32(xo + 4u * i) - mx);
    a_st(yo + 4u * i, e);
    s += e;
  }
  red[tid] = s;
  barrier();
  for (uint st = 32u; st > 0u; st >>= 1) {
    if (tid < st) red[tid] += red[tid + st];
    barrier();
  }
  float inv = 1.0 / red[0];
  for (uint i = tid; i < K; i += 64u) a_st(yo + 4u * i, a_f32(yo + 4u * i) * inv);
}
