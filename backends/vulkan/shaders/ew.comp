#version 450
// Elementwise ops over contiguous F32 tensors. MODE 0 silu(x), 1 swiglu(gate, up),
// 2 add, 3 mul (src1 broadcast: each of its dimensions divides src0's), 4 sigmoid,
// 5 softplus (x > 20 passes through, as the reference), 6 geglu(gate, up) (GELU's tanh
// form as the reference tabulates it: of x rounded to F16, the result rounded to F16),
// 7 swiglu_oai(gate, up) (gpt-oss's clamped SwiGLU; push 12 alpha, 13 limit).
// push: 0 n, 1 offA, 2 offB, 3 offD, 4..7 ne of A, 8..11 ne of B
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

float silu(float x) { return x / (1.0 + exp(-x)); }
float gelu(float x) {
  if (x <= -10.0) return 0.0;
  if (x >= 10.0) return x;
  precise float h = round_f16(x);
  precise float y = 0.5 * h * (1.0 + tanh(0.79788456080286535588 * h * (1.0 + 0.044715 * h * h)));
  return round_f16(y);
}

void main() {
  uint i = global_index();
  if (i >= pc.u[0]) return;
  float x = a_f32(pc.u[1] + 4u * i);
#if MODE == 0
  precise float y = silu(x);
#elif MODE == 4
  precise float y = 1.0 / (1.0 + exp(-x));
#elif MODE == 5
  precise float y = x > 20.0 ? x : log(1.0 + exp(x));
#elif MODE == 1
  precise float y = silu(x) * a_f32(pc.u[2] + 4u * i);
#elif MODE == 6
  precise float y = gelu(x) * a_f32(pc.u[2] + 4u * i);
#elif MODE == 7
  float lim = PF(13);
  precise float g = min(x, lim);
  precise float u = clamp(a_f32(pc.u[2] + 4u * i), -lim, lim);
  precise float y = g / (1.0 + exp(PF(12) * (-g))) * (u + 1.0);
#else
  uint ne0 = pc.u[4], ne1 = pc.u[5], ne2 = pc.u[6];
  uint i0 = i % ne0, r = i / ne0;
  uint i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
  uint b0 = pc.u[8], b1 = pc.u[9], b2 = pc.u[10], b3 = pc.u[11];
  uint bi = (i0 % b0) + b0 * ((i1 % b1) + b1 * ((i2 % b2) + b2 * (i3 % b3)));
  float b = a_f32(pc.u[2] + 4u * bi);
#if MODE == 2
  precise float y = x + b;
#else
  precise float y = x * b;
#endif
#endif
  a_st(pc.u[3] + 4u * i, y);
}
