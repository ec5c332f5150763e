#version 450
// dst[:, t] = sum over j in order of weights[j, t] * experts[:, j, t].
// push: 0 N, 1 k, 2 n, 3 offE, 4 offW, 5 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  uint N = pc.u[0], k = pc.u[1], n = pc.u[2];
  if (i >= N * n) return;
  uint r = i % N, t = i / N;
  uint eo = pc.u[3] + 4u * (N * k * t + r);
  uint wo = pc.u[4] + 4u * k * t;
  precise float acc = a_f32(eo) * a_f32(wo);
  for (uint j = 1u; j < k; ++j) {
    precise float p = a_f32(eo + 4u * N * j) * a_f32(wo + 4u * j);
    acc = acc + p;
  }
  a_st(pc.u[5] + 4u * i, acc);
}
