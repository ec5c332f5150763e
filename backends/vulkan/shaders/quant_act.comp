#version 450
// Activation rows (F32 [K] each) -> the reference's Q8_0 / Q8_1 (QK 32) or Q8_K (QK
// 256) blocks, one invocation per block. Output row layout (our own): K int8 quants,
// then K/QK float scales (Q8_0, Q8_1: the F16-rounded d; Q8_K: the float d), then for
// Q8_1 (SUMS 1) K/32 floats s = the F16-rounded (unrounded d) * (sum of the quants).
// A block holding a NaN or an infinity gets a NaN scale (and s), all quants 0, as the
// reference's quantizer: the non-finite value reaches every product (decision 90). The
// test is on the bits, which no driver's float optimizations can drop.
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
  bool bad = false;
  for (uint j = 0u; j < QK; ++j) {
    float v = a_f32(xo + 4u * j);
    bad = bad || (floatBitsToUint(v) & 0x7F800000u) == 0x7F800000u;
#if QK == 32
    amax = max(amax, abs(v));
#else
    if (abs(v) > amax) { amax = abs(v); mx = v; }
#endif
  }
  const float nan_ = uintBitsToFloat(0x7FC00000u);
#if QK == 32
  float d = bad ? nan_ : amax / 127.0;
  float id = bad || d == 0.0 ? 0.0 : 1.0 / d;
  float ds = bad ? nan_ : round_f16(d);
#else
  float iscale = bad || amax == 0.0 ? 0.0 : -127.0 / mx;
  float ds = bad ? nan_ : amax == 0.0 ? 0.0 : 1.0 / iscale;
#endif
#ifndef SUMS
#define SUMS 0
#endif
  int qsum = 0;
  for (uint j = 0u; j < QK; j += 4u) {
    uint word = 0u;
    for (uint l = 0u; l < 4u; ++l) {
      float v = bad ? 0.0 : a_f32(xo + 4u * (j + l));
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
  a_st(qo + K + 4u * nb + 4u * b, bad ? nan_ : round_f16(float(qsum) * d));
#endif
}
