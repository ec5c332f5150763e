#version 450
// MatMul (USE_IDS 0) and MatMulId (USE_IDS 1). A work group of 64 computes 8 outputs
// (weight row n, output row), 8 invocations each; the 8 partial sums of an output are
// added in shared memory. Plain weights (F32/F16/BF16) are dotted with the F32
// activation (rounded to F16/BF16 like the reference); quantized weights with the
// activation row already quantized to Q8_0 / Q8_K by quant_act.comp: integer sums per
// 32-element chunk, one float scale per chunk (the reference's arithmetic per block).
// Weights and quants are read 4 bytes at a time.
// push: 0 K, 1 N, 2 rows (M, or k*n for ids), 3 offW, 4 w row stride, 5 w expert
//       stride, 6 offX, 7 x row stride (bytes), 8 offD, 9 offIds, 10 k, 11 b, 12 experts
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
shared float red[64];

#define LANES 8u

// The 4 activation quants of chunk c, word q (elements 32c + 4q .. +3).
ivec4 act4(uint xo, uint c, uint q) { return i8x4(a[(xo >> 2) + 8u * c + q]); }

// Dot of the 32 weights of chunk c of the row at ro with the quantized activation row
// at xo (quants) / so (scales).
float chunk_dot(uint ro, uint c, uint xo, uint so) {
#if WTYPE == 8
  uint bo = ro + 34u * c;
  int s = 0;
  for (uint q = 0u; q < 8u; ++q) s += dot4(i8x4(w_u32(bo + 2u + 4u * q)), act4(xo, c, q));
  return float(s) * (f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c));
#elif WTYPE == 2
  uint bo = ro + 18u * c;
  int s = 0;
  for (uint q = 0u; q < 4u; ++q) {
    uint v = w_u32(bo + 2u + 4u * q);
    s += dot4(u8x4(v & 0x0F0F0F0Fu) - 8, act4(xo, c, q));
    s += dot4(u8x4((v >> 4) & 0x0F0F0F0Fu) - 8, act4(xo, c, q + 4u));
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
  uint hbit = 2u * cc + hi;  // bit of qh[l] holding element l's fifth bit
#endif
  int isum = 0, qsum = 0;
  for (uint q = 0u; q < 8u; ++q) {
    uint v = w_u32(qs + 32u * cc + 4u * q);
    ivec4 wq = u8x4((hi != 0u ? (v >> 4) : v) & 0x0F0F0F0Fu);
#if WTYPE == 13
    uint h = w_u32(bo + 16u + 4u * q);
    wq += u8x4((h >> hbit) & 0x01010101u) * 16;
#endif
    ivec4 aq = act4(xo, c, q);
    isum += dot4(wq, aq);
    qsum += sum4(aq);
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
    for (uint q = 4u * half_; q < 4u * half_ + 4u; ++q) {
      uint lo = w_u32(ql + 4u * q);
      lo = (quarter >= 2u ? (lo >> 4) : lo) & 0x0F0F0F0Fu;
      uint hb = (w_u32(qh + 4u * q) >> (2u * quarter)) & 0x03030303u;
      s += dot4(u8x4(lo | (hb << 4)) - 32, act4(xo, c, q));
    }
    isum += w_i8(scb + half_) * s;
  }
  return (f16_to_f32(w_u16(bo + 208u)) * a_f32(so + 4u * b)) * float(isum);
#elif WTYPE == 3 || WTYPE == 7
  // Q4_1 / Q5_1 with Q8_1: (d * da) * isum + m * sa, sa the activation block's s.
#if WTYPE == 3
  uint bo = ro + 20u * c, qs = bo + 4u;
#else
  uint bo = ro + 24u * c, qs = bo + 8u;
  uint qh = w_u32(bo + 4u);
#endif
  int s = 0;
  for (uint q = 0u; q < 4u; ++q) {
    uint v = w_u32(qs + 4u * q);
    uint lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#if WTYPE == 7
    lo |= spread4((qh >> (4u * q)) & 0xFu) << 4;
    hi |= spread4((qh >> (16u + 4u * q)) & 0xFu) << 4;
#endif
    s += dot4(u8x4(lo), act4(xo, c, q)) + dot4(u8x4(hi), act4(xo, c, q + 4u));
  }
  float sa = a_f32(so + 4u * (pc.u[0] / 32u) + 4u * c);
  return (f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c)) * float(s) + f16_to_f32(w_u16(bo + 2u)) * sa;
#elif WTYPE == 6
  uint bo = ro + 22u * c, qs = bo + 6u;
  uint qh = w_u32(bo + 2u);
  int s = 0;
  for (uint q = 0u; q < 4u; ++q) {
    uint v = w_u32(qs + 4u * q);
    uint lo = (v & 0x0F0F0F0Fu) | (spread4((qh >> (4u * q)) & 0xFu) << 4);
    uint hi = ((v >> 4) & 0x0F0F0F0Fu) | (spread4((qh >> (16u + 4u * q)) & 0xFu) << 4);
    s += dot4(u8x4(lo) - 16, act4(xo, c, q)) + dot4(u8x4(hi) - 16, act4(xo, c, q + 4u));
  }
  return (f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c)) * float(s);
#elif WTYPE == 20 || WTYPE == 39
  // IQ4_NL / MXFP4: nibbles as Q4_0's, mapped through the format's code table.
#if WTYPE == 20
  uint bo = ro + 18u * c, qs = bo + 2u;
#else
  uint bo = ro + 17u * c, qs = bo + 1u;
#endif
  int s = 0;
  for (uint q = 0u; q < 4u; ++q) {
    uint v = w_u32(qs + 4u * q);
#if WTYPE == 20
    s += dot4(iq4nl_x4(v), act4(xo, c, q)) + dot4(iq4nl_x4(v >> 4), act4(xo, c, q + 4u));
#else
    s += dot4(mxfp4_x4(v), act4(xo, c, q)) + dot4(mxfp4_x4(v >> 4), act4(xo, c, q + 4u));
#endif
  }
#if WTYPE == 20
  return (f16_to_f32(w_u16(bo)) * a_f32(so + 4u * c)) * float(s);
#else
  return (a_f32(so + 4u * c) * e8m0_half(w_u8(bo))) * float(s);
#endif
#elif WTYPE == 10
  // Q2_K: chunk cb of a block = bit pair cb % 4 of the 32 bytes at 32 * (cb / 4),
  // sub-blocks 2cb and 2cb + 1 (16 elements each).
  uint b = c / 8u, cb = c % 8u;
  uint bo = ro + 84u * b, q2 = bo + 16u + 32u * (cb / 4u), shift = 2u * (cb % 4u);
  int isum = 0, msum = 0;
  for (uint half_ = 0u; half_ < 2u; ++half_) {
    uint sc = w_u8(bo + 2u * cb + half_);
    int s = 0, qs = 0;
    for (uint q = 4u * half_; q < 4u * half_ + 4u; ++q) {
      ivec4 aq = act4(xo, c, q);
      s += dot4(u8x4((w_u32(q2 + 4u * q) >> shift) & 0x03030303u), aq);
      qs += sum4(aq);
    }
    isum += int(sc & 0xFu) * s;
    msum += int(sc >> 4) * qs;
  }
  float da = a_f32(so + 4u * b);
  return (da * f16_to_f32(w_u16(bo + 80u))) * float(isum) - (da * f16_to_f32(w_u16(bo + 82u))) * float(msum);
#elif WTYPE == 11
  // Q3_K: low bits as Q2_K's, the third bit from hmask bit cb (clear: minus 4).
  uint b = c / 8u, cb = c % 8u;
  uint bo = ro + 110u * b, q3 = bo + 32u + 32u * (cb / 4u), shift = 2u * (cb % 4u);
  int isum = 0;
  for (uint half_ = 0u; half_ < 2u; ++half_) {
    int s = 0;
    for (uint q = 4u * half_; q < 4u * half_ + 4u; ++q) {
      uint lo = (w_u32(q3 + 4u * q) >> shift) & 0x03030303u;
      uint hb = (w_u32(bo + 4u * q) >> cb) & 0x01010101u;
      s += dot4(u8x4(lo | (hb << 2)) - 4, act4(xo, c, q));
    }
    isum += q3k_scale(bo + 96u, 2u * cb + half_) * s;
  }
  return (f16_to_f32(w_u16(bo + 108u)) * a_f32(so + 4u * b)) * float(isum);
#elif WTYPE == 23
  // IQ4_XS: chunk ib of a block has its own 6-bit scale ls; nibbles as IQ4_NL's.
  uint b = c / 8u, ib = c % 8u;
  uint bo = ro + 136u * b, qs = bo + 8u + 16u * ib;
  int ls = int(((w_u8(bo + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((w_u16(bo + 2u) >> (2u * ib)) & 3u) << 4));
  int s = 0;
  for (uint q = 0u; q < 4u; ++q) {
    uint v = w_u32(qs + 4u * q);
    s += dot4(iq4nl_x4(v), act4(xo, c, q)) + dot4(iq4nl_x4(v >> 4), act4(xo, c, q + 4u));
  }
  return ((f16_to_f32(w_u16(bo)) * a_f32(so + 4u * b)) * float(ls - 32)) * float(s);
#else
  return 0.0;
#endif
}

void main() {
  uint tid = gl_LocalInvocationID.x;
  uint lane = tid % LANES;
  uint o = wg_index() * (64u / LANES) + tid / LANES;
  uint K = pc.u[0], N = pc.u[1];
  bool live = o < N * pc.u[2];
  float s = 0.0;
  uint n = 0u, row = 0u;
  if (live) {
    n = o % N;
    row = o / N;
    uint ro = pc.u[3] + pc.u[4] * n;
    uint xrow = row;
#if USE_IDS
    uint k = pc.u[10], bcols = pc.u[11];
    uint t = row / k, j = row % k;
    ro += pc.u[5] * min(uint(a_i32(pc.u[9] + 4u * row)), pc.u[12] - 1u);  // ids come from TopK
    xrow = t * bcols + j % bcols;
#endif
    uint xo = pc.u[6] + pc.u[7] * xrow;
#if WTYPE == 0 || WTYPE == 1 || WTYPE == 30
    for (uint i = lane; i < K; i += LANES) {
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
    for (uint c = lane; c < nc; c += LANES) s += chunk_dot(ro, c, xo, xo + K);
#endif
  }
  red[tid] = s;
  barrier();
  for (uint st = LANES / 2u; st > 0u; st >>= 1) {
    if (lane < st) red[tid] += red[tid + st];
    barrier();
  }
  if (live && lane == 0u) a_st(pc.u[8] + 4u * (N * row + n), red[tid]);
}
