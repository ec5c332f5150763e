#version 450
// Activation rows (F32 [K] each) -> the reference's Q8_0 / Q8_1 (QK 32) or Q8_K (QK
// 256) blocks, one invocation per block. Output row layout (our own): K int8 quants,
// then K/QK float scales (Q8_0, Q8_1: the F16-rounded d; Q8_K: the float d), then for
// Q8_1 (SUMS 1) K/32 floats s = the F16-rounded (unrounded d) * (sum of the quants).
// push: 0 K, 1 rows, 2 offX, 3 x row stride (bytes), 4 offQ, 5 q row stride (bytes)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

void main() {
  uint K = pc.u[0], nb = K / QK;
  uint i = global_index();
  if (i >= nb * pc.u[1]) return;
  uint row = i / nb, b = i % nb;
  uint xo = pc.u[2] + pc.u[3] * row + 4u * QK * b;
  uint qo = pc.u[4] + pc.u[5] * row;
  float amax = 0.0, mx = 0.0;
  for (uint j = 0u; j < QK; ++j) {
    float v = a_f32(xo + 4u * j);
#if QK == 32
    amax = max(amax, abs(v));
#else
    if (abs(v) > amax) { amax = abs(v); mx = v; }
#endif
  }
#if QK == 32
  float d = amax / 127.0;
  float id = d != 0.0 ? 1.0 / d : 0.0;
  float ds = round_f16(d);
#else
  float iscale = amax == 0.0 ? 0.0 : -127.0 / mx;
  float ds = amax == 0.0 ? 0.0 : 1.0 / iscale;
#endif
#ifndef SUMS
#define SUMS 0
#endif
  int qsum = 0;
  for (uint j = 0u; j < QK; j += 4u) {
    uint word = 0u;
    for (uint l = 0u; l < 4u; ++l) {
      float v = a_f32(xo + 4u * (j + l));
#if QK == 32
      int q = int(round_away(v * id));
#else
      int q = min(127, int(roundEven(iscale * v)));
#endif
      word |= (uint(q) & 0xFFu) << (8u * l);
      qsum += q;
    }
    a[(qo >> 2) + (QK * b + j) / 4u] = word;
  }
  a_st(qo + K + 4u * b, ds);
#if SUMS
  a_st(qo + K + 4u * nb + 4u * b, round_f16(float(qsum) * d));
#endif
}
