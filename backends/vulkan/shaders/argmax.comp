#version 450
// One work group per row: index of the first maximum.
// push: 0 K, 1 rows, 2 offX, 3 offY (I32)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
shared float rv[64];
shared uint ri[64];

void main() {
  uint row = wg_index();
  if (row >= pc.u[1]) return;
  uint K = pc.u[0], tid = gl_LocalInvocationID.x;
  uint xo = pc.u[2] + 4u * K * row;
  uint bi = 0xFFFFFFFFu;
  float bv = 0.0;
  for (uint i = tid; i < K; i += 64u) {
    float v = a_f32(xo + 4u * i);
    if (bi == 0xFFFFFFFFu || v > bv) { bv = v; bi = i; }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  barrier();
  for (uint st = 32u; st > 0u; st >>= 1) {
    if (tid < st) {
      uint oi = ri[tid + st];
      float ov = rv[tid + st];
      if (oi != 0xFFFFFFFFu && (ri[tid] == 0xFFFFFFFFu || ov > rv[tid] || (ov == rv[tid] && oi < ri[tid]))) {
        rv[tid] = ov;
        ri[tid] = oi;
      }
    }
    barrier();
  }
  if (tid == 0u) a[(pc.u[3] >> 2) + row] = ri[0];
}
