#version 450
// GatedDeltaNet, the reference's delta rule token by token: one work group per value
// head, invocation j owns row j of the head's S x S state (mirrored on the device).
// q and k are L2-normalized per head; per token: state *= exp(g); d = beta (v - state k);
// state += k d^T; out = state q / sqrt(S).
// push: 0 S, 1 Hk, 2 Hv, 3 T, 4 offQKV, 5 offG, 6 offBeta, 7 offD, 8 offState, 9 eps, 10 scale
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;
#include "common.glsl"
shared float qs[128];
shared float ks[128];
shared float rq[128];
shared float rk[128];

void main() {
  uint h = wg_index();
  uint S = pc.u[0], Hk = pc.u[1], Hv = pc.u[2], T = pc.u[3];
  if (h >= Hv) return;
  uint j = gl_LocalInvocationID.x;
  uint kh = h % Hk;
  uint row = (2u * Hk + Hv) * S;
  uint mo = pc.u[8] + 4u * (h * S * S + j * S);
  float eps = PF(9), scale = PF(10);
  for (uint t = 0u; t < T; ++t) {
    uint base = pc.u[4] + 4u * t * row;
    float qv = 0.0, kv = 0.0;
    if (j < S) {
      qv = a_f32(base + 4u * (kh * S + j));
      kv = a_f32(base + 4u * ((Hk + kh) * S + j));
    }
    rq[j] = qv * qv;
    rk[j] = kv * kv;
    barrier();
    for (uint st = 64u; st > 0u; st >>= 1) {
      if (j < st) {
        rq[j] += rq[j + st];
        rk[j] += rk[j + st];
      }
      barrier();
    }
    float iq = 1.0 / max(sqrt(rq[0]), eps), ik = 1.0 / max(sqrt(rk[0]), eps);
    qs[j] = qv * iq;
    ks[j] = kv * ik;
    barrier();
    if (j < S) {
      float decay = exp(a_f32(pc.u[5] + 4u * (t * Hv + h)));
      float b = a_f32(pc.u[6] + 4u * (t * Hv + h));
      float v = a_f32(base + 4u * ((2u * Hk + h) * S + j));
      float sk = 0.0;
      for (uint i = 0u; i < S; ++i) {
        float m = a_f32(mo + 4u * i) * decay;
        a_st(mo + 4u * i, m);
        sk += m * ks[i];
      }
      float d = (v - sk) * b;
      float o = 0.0;
      for (uint i = 0u; i < S; ++i) {
        float m = a_f32(mo + 4u * i) + ks[i] * d;
        a_st(mo + 4u * i, m);
        o += m * qs[i];
      }
      a_st(pc.u[7] + 4u * (j + S * (h + Hv * t)), o * scale);
    }
    barrier();  // qs/ks/rq/rk are rewritten for the next token
  }
}
