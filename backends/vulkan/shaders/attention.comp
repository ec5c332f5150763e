#version 450
// Causal attention of one query (head h, token t) over the F16 mirror of the cache,
// with the reference's semantics: q rounded to F16, score = scale * (F32 dot),
// online softmax in F32 walking the positions in order, the V weighted sum rounded
// to F16 after every update. Scores are computed 128 positions at a time in
// parallel, then every invocation (one per output dimension) walks them in order.
// push: 0 hd, 1 n_head, 2 T, 3 group, 4 p0, 5 offQ, 6 offD, 7 mirK, 8 mirV,
//       9 row elems (n_kv*hd), 10 scale
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;
#include "common.glsl"
shared float qf[256];
shared float sc[128];

float mk(uint base, uint e) {  // half element e of the mirror at byte offset base
  uint word = a[(base >> 2) + (e >> 1)];
  return f16_to_f32((e & 1u) != 0u ? word >> 16 : word & 0xFFFFu);
}

void main() {
  uint item = wg_index();
  uint hd = pc.u[0], nh = pc.u[1], T = pc.u[2];
  if (item >= nh * T) return;
  uint h = item % nh, t = item / nh, kvh = h / pc.u[3];
  uint tid = gl_LocalInvocationID.x;
  uint re = pc.u[9];
  float scale = PF(10);
  uint qo = pc.u[5] + 4u * hd * item;
  for (uint d = tid; d < hd; d += 128u) qf[d] = round_f16(a_f32(qo + 4u * d));
  float acc0 = 0.0, acc1 = 0.0;
  float M = 0.0, S = 0.0;
  bool first = true;
  uint last = pc.u[4] + t;
  for (uint j0 = 0u; j0 <= last; j0 += 128u) {
    uint cnt = min(128u, last + 1u - j0);
    barrier();
    if (tid < cnt) {
      uint kb = (j0 + tid) * re + kvh * hd;
      float dot = 0.0;
      for (uint d = 0u; d < hd; ++d) dot += qf[d] * mk(pc.u[7], kb + d);
      sc[tid] = dot * scale;
    }
    barrier();
    for (uint i = 0u; i < cnt; ++i) {
      float s = sc[i];
      float ms = 1.0, vs = 1.0;
      if (first || s > M) {
        ms = first ? 0.0 : exp(M - s);
        M = s;
        first = false;
        acc0 = round_f16(acc0 * ms);
        acc1 = round_f16(acc1 * ms);
      } else {
        vs = exp(s - M);
      }
      uint vb = (j0 + i) * re + kvh * hd;
      if (tid < hd) acc0 = round_f16(acc0 + mk(pc.u[8], vb + tid) * vs);
      if (tid + 128u < hd) acc1 = round_f16(acc1 + mk(pc.u[8], vb + tid + 128u) * vs);
      S = S * ms + vs;
    }
  }
  float inv = S == 0.0 ? 0.0 : 1.0 / S;
  uint od = pc.u[6] + 4u * hd * item;
  if (tid < hd) a_st(od + 4u * tid, acc0 * inv);
  if (tid + 128u < hd) a_st(od + 4u * (tid + 128u), acc1 * inv);
}
