#version 450
// MatMul (USE_IDS 0) and MatMulId (USE_IDS 1): one work group of 64 per (weight row
// n, output row). Plain weights (F32/F16/BF16) are dotted with the F32 activation
// (rounded to F16/BF16 like the reference); quantized weights with the activation
// row already quantized to Q8_0 / Q8_K by quant_act.comp, integer sums per 32-element
// chunk, one float scale per chunk (the reference's arithmetic per block).
// push: 0 K, 1 N, 2 rows (M, or k*n for ids), 3 offW, 4 w row stride, 5 w expert
//       stride, 6 offX, 7 x row stride (bytes), 8 offD, 9 offIds, 10 k, 11 b, 12 experts
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
shared float red[64];

#if WTYPE == 12 || WTYPE == 13 || WTYPE == 14
#define QK 256u
#else
#define QK 32u
#endif

// Dot of 32 weights starting at chunk c of the row at ro with the quantized activation
// row at xo (quants) / so (scales).
float chunk_dot(uint ro, uint c, uint xo, uint so) {
#if WTYPE == 8
  uint bo = ro + 34u * c;
  int s = 0;
  for (uint j = 0u; j < 32u; ++j) s += w_i8(bo + 2u + j) * a_i8(xo + 32u * c + j);
  return float(s) * (f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c));
#elif WTYPE == 2
  uint bo = ro + 18u * c;
  int s = 0;
  for (uint j = 0u; j < 16u; ++j) {
    uint byt = w_u8(bo + 2u + j);
    s += (int(byt & 0xFu) - 8) * a_i8(xo + 32u * c + j);
    s += (int(byt >> 4) - 8) * a_i8(xo + 32u * c + j + 16u);
  }
  return float(s) * f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c);
#elif WTYPE == 12 || WTYPE == 13
  uint b = c / 8u, sub = c % 8u, cc = sub / 2u, hi = sub & 1u;
#if WTYPE == 12
  uint bo = ro + 144u * b;
  uint qs = bo + 16u;
#else
  uint bo = ro + 176u * b;
  uint qs = bo + 48u;
  uint mask = (hi != 0u ? 2u : 1u) << (2u * cc);
#endif
  int isum = 0, qsum = 0;
  for (uint l = 0u; l < 32u; ++l) {
    uint byt = w_u8(qs + 32u * cc + l);
    int q = int(hi != 0u ? (byt >> 4) : (byt & 0xFu));
#if WTYPE == 13
    if ((w_u8(bo + 16u + l) & mask) != 0u) q += 16;
#endif
    int qa = a_i8(xo + 32u * c + l);
    isum += q * qa;
    qsum += qa;
  }
  uint sc, m;
  scale_min_k4(sub, bo + 4u, sc, m);
  float da = a_f32(so + 4u * b);
  return (f16_to_f32(w_u16(bo)) * da) * float(int(sc) * isum) -
         (f16_to_f32(w_u16(bo + 2u)) * da) * float(int(m) * qsum);
#elif WTYPE == 14
  uint b = c / 8u, r = (c % 8u) * 32u, nh = r / 128u, quarter = (r % 128u) / 32u;
  uint bo = ro + 210u * b;
  uint ql = bo + 64u * nh + ((quarter & 1u) != 0u ? 32u : 0u), qh = bo + 128u + 32u * nh;
  uint scb = bo + 192u + 8u * nh + 2u * quarter;
  int isum = 0;
  for (uint half_ = 0u; half_ < 2u; ++half_) {
    int s = 0;
    for (uint l = 16u * half_; l < 16u * half_ + 16u; ++l) {
      uint lo = w_u8(ql + l);
      lo = quarter >= 2u ? (lo >> 4) : (lo & 0xFu);
      uint hb = (w_u8(qh + l) >> (2u * quarter)) & 3u;
      s += (int(lo | (hb << 4)) - 32) * a_i8(xo + 32u * c + l);
    }
    isum += w_i8(scb + half_) * s;
  }
  return (f16_to_f32(w_u16(bo + 208u)) * a_f32(so + 4u * b)) * float(isum);
#else
  return 0.0;
#endif
}

void main() {
  uint g = wg_index();
  uint K = pc.u[0], N = pc.u[1];
  if (g >= N * pc.u[2]) return;
  uint n = g % N, row = g / N;
  uint tid = gl_LocalInvocationID.x;
  uint ro = pc.u[3] + pc.u[4] * n;
  uint xrow = row;
#if USE_IDS
  uint k = pc.u[10], bcols = pc.u[11];
  uint t = row / k, j = row % k;
  ro += pc.u[5] * min(uint(a_i32(pc.u[9] + 4u * row)), pc.u[12] - 1u);  // ids come from TopK
  xrow = t * bcols + j % bcols;
#endif
  uint xo = pc.u[6] + pc.u[7] * xrow;
  float s = 0.0;
#if WTYPE == 0 || WTYPE == 1 || WTYPE == 30
  for (uint i = tid; i < K; i += 64u) {
    float x = a_f32(xo + 4u * i);
#if WTYPE == 0
    s += w_f32(ro + 4u * i) * x;
#elif WTYPE == 1
    s += f16_to_f32(w_u16(ro + 2u * i)) * round_f16(x);
#else
    s += bf16_to_f32(w_u16(ro + 2u * i)) * round_bf16(x);
#endif
  }
#else
  uint nc = K / 32u;
  for (uint c = tid; c < nc; c += 64u) s += chunk_dot(ro, c, xo, xo + K);
#endif
  red[tid] = s;
  barrier();
  for (uint st = 32u; st > 0u; st >>= 1) {
    if (tid < st) red[tid] += red[tid + st];
    barrier();
  }
  if (tid == 0u) a_st(pc.u[8] + 4u * (N * row + n), red[0]);
}
