#version 450
// Causal attention of one query (head h, token row t) over one layer's F16 K and V
// storage in device memory (bindings 2 and 3), read through the block table of t's
// sequence (its column of the sequence table: first row, count, first position, then
// page ids), with the reference's semantics: q rounded to F16, score = scale * (F32
// dot), online softmax in F32 walking the positions in order, the V weighted sum
// rounded to F16 after every update. Scores are computed 128 positions at a time in
// parallel, then every invocation (one per output dimension) walks them in order.
// push: 0 hd, 1 n_head, 2 T, 3 group, 4 offQ, 5 offD, 6 offTable, 7 table rows
//       (3 + pages), 8 table columns, 9 row stride (bytes), 10 page stride (bytes),
//       11 page_tokens, 12 scale, 13 sliding window (0: none; else positions
//       last - window + 1 .. last only, and pages before those may be released),
//       14 offset of the sinks (F32 per head; 0xFFFFFFFF: none), applied in F32 after
//       the positions as a score without a value, 15 dv (values per V head: hd, or
//       fewer where V is the leading part of each K row, as in latent attention).
// hd <= 1024, dv <= 512: each invocation keeps up to four output dimensions.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;
#include "common.glsl"
layout(std430, set = 0, binding = 2) readonly buffer KStore { uint ks[]; };
layout(std430, set = 0, binding = 3) readonly buffer VStore { uint vs[]; };
shared float qf[1024];
shared float sc[128];

float k_at(uint byte) {  // the half at an even byte offset of the K storage
  uint w = ks[byte >> 2];
  return f16_to_f32((byte & 2u) != 0u ? w >> 16 : w & 0xFFFFu);
}
float v_at(uint byte) {
  uint w = vs[byte >> 2];
  return f16_to_f32((byte & 2u) != 0u ? w >> 16 : w & 0xFFFFu);
}

void main() {
  uint item = wg_index();
  uint hd = pc.u[0], nh = pc.u[1], T = pc.u[2];
  if (item >= nh * T) return;
  uint h = item % nh, t = item / nh, kvh = h / pc.u[3];
  uint tid = gl_LocalInvocationID.x;
  float scale = PF(12);
  uint rows = pc.u[7], rs = pc.u[9], ps = pc.u[10], pt = pc.u[11];
  // The column of t's sequence (the table covers every row once).
  uint col = 0u, last = 0u;
  for (uint s = 0u; s < pc.u[8]; ++s) {
    uint c = (pc.u[6] >> 2) + s * rows;
    uint f0 = a[c], n0 = a[c + 1u];
    if (t >= f0 && t < f0 + n0) {
      col = c;
      last = a[c + 2u] + (t - f0);
    }
  }
  uint dv = pc.u[15];
  uint head = 2u * kvh * hd, vhead = 2u * kvh * dv;  // byte offsets of this KV head in a K / V row
  uint qo = pc.u[4] + 4u * hd * item;
  for (uint d = tid; d < hd; d += 128u) qf[d] = round_f16(a_f32(qo + 4u * d));
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  float M = 0.0, S = 0.0;
  bool first = true;
  uint win = pc.u[13];
  uint j_first = (win > 0u && last + 1u > win) ? last + 1u - win : 0u;
  for (uint j0 = j_first; j0 <= last; j0 += 128u) {
    uint cnt = min(128u, last + 1u - j0);
    barrier();
    if (tid < cnt) {
      uint j = j0 + tid;
      uint kb = a[col + 3u + j / pt] * ps + (j % pt) * rs + head;
      float dot = 0.0;
      for (uint d = 0u; d < hd; ++d) dot += qf[d] * k_at(kb + 2u * d);
      sc[tid] = dot * scale;
    }
    barrier();
    for (uint i = 0u; i < cnt; ++i) {
      float s = sc[i];
      float ms = 1.0, vsc = 1.0;
      if (first || s > M) {
        ms = first ? 0.0 : exp(M - s);
        M = s;
        first = false;
        for (uint r = 0u; r < 4u; ++r) acc[r] = round_f16(acc[r] * ms);
      } else {
        vsc = exp(s - M);
      }
      uint j = j0 + i;
      uint vb = a[col + 3u + j / pt] * ps + (j % pt) * rs + vhead;
      for (uint r = 0u; r < 4u; ++r)
        if (tid + 128u * r < dv) acc[r] = round_f16(acc[r] + v_at(vb + 2u * (tid + 128u * r)) * vsc);
      S = S * ms + vsc;
    }
  }
  if (pc.u[14] != 0xFFFFFFFFu) {
    float s = a_f32(pc.u[14] + 4u * h);
    float ms = 1.0, vsc = 1.0;
    if (s > M || first) {
      ms = first ? 0.0 : exp(M - s);
      for (uint r = 0u; r < 4u; ++r) acc[r] *= ms;
    } else {
      vsc = exp(s - M);
    }
    S = S * ms + vsc;
  }
  float inv = S == 0.0 ? 0.0 : 1.0 / S;
  uint od = pc.u[5] + 4u * dv * item;
  for (uint r = 0u; r < 4u; ++r)
    if (tid + 128u * r < dv) a_st(od + 4u * (tid + 128u * r), acc[r] * inv);
}
