#version 450
// dst[:, i] = dequantize(table row ids[i]); one invocation per output element, the
// reference's arithmetic per dtype (WTYPE = GGUF type id). Table in binding 1.
// push: 0 K, 1 n, 2 V, 3 offTab, 4 table row stride, 5 offIds, 6 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

float deq(uint ro, uint k) {
#if WTYPE == 0
  return w_f32(ro + 4u * k);
#elif WTYPE == 1
  return f16_to_f32(w_u16(ro + 2u * k));
#elif WTYPE == 30
  return bf16_to_f32(w_u16(ro + 2u * k));
#elif WTYPE == 8
  uint bo = ro + 34u * (k / 32u);
  precise float y = float(w_i8(bo + 2u + k % 32u)) * f16_to_f32(w_u16(bo));
  return y;
#elif WTYPE == 2
  uint bo = ro + 18u * (k / 32u);
  uint j = k % 32u;
  uint q = j < 16u ? (w_u8(bo + 2u + j) & 0xFu) : (w_u8(bo + 2u + j - 16u) >> 4);
  precise float y = float(int(q) - 8) * f16_to_f32(w_u16(bo));
  return y;
#elif WTYPE == 12 || WTYPE == 13
#if WTYPE == 12
  uint bo = ro + 144u * (k / 256u);
  uint qs = bo + 16u;
#else
  uint bo = ro + 176u * (k / 256u);
  uint qs = bo + 48u;
#endif
  uint e = k % 256u, c = e / 64u, l = e % 32u;
  uint hi = (e % 64u) >= 32u ? 1u : 0u;
  uint byt = w_u8(qs + 32u * c + l);
  uint q = hi != 0u ? (byt >> 4) : (byt & 0xFu);
#if WTYPE == 13
  uint mask = (hi != 0u ? 2u : 1u) << (2u * c);
  if ((w_u8(bo + 16u + l) & mask) != 0u) q += 16u;
#endif
  uint sc, m;
  scale_min_k4(2u * c + hi, bo + 4u, sc, m);
  precise float d1 = f16_to_f32(w_u16(bo)) * float(sc);
  precise float m1 = f16_to_f32(w_u16(bo + 2u)) * float(m);
  precise float y = d1 * float(q) - m1;
  return y;
#elif WTYPE == 14
  uint bo = ro + 210u * (k / 256u);
  uint e = k % 256u, nh = e / 128u, r = e % 128u, quarter = r / 32u, l = r % 32u;
  uint ql = bo + 64u * nh, qh = bo + 128u + 32u * nh, scb = bo + 192u + 8u * nh;
  uint lo = (quarter & 1u) != 0u ? w_u8(ql + l + 32u) : w_u8(ql + l);
  lo = quarter >= 2u ? (lo >> 4) : (lo & 0xFu);
  uint hb = (w_u8(qh + l) >> (2u * quarter)) & 3u;
  int q = int(lo | (hb << 4)) - 32;
  int sc = w_i8(scb + l / 16u + 2u * quarter);
  precise float y = f16_to_f32(w_u16(bo + 208u)) * float(sc) * float(q);
  return y;
#elif WTYPE == 3 || WTYPE == 6 || WTYPE == 7
  // Q4_1, Q5_0, Q5_1: byte j of qs holds element j (low nibble) and j + 16 (high);
  // element j's fifth bit is bit j of qh.
  uint j = k % 32u;
#if WTYPE == 3
  uint bo = ro + 20u * (k / 32u), qs = bo + 4u;
#elif WTYPE == 6
  uint bo = ro + 22u * (k / 32u), qs = bo + 6u;
#else
  uint bo = ro + 24u * (k / 32u), qs = bo + 8u;
#endif
  uint q = j < 16u ? (w_u8(qs + j) & 0xFu) : (w_u8(qs + j - 16u) >> 4);
#if WTYPE == 6
  q |= ((w_u32(bo + 2u) >> j) & 1u) << 4;
  precise float y = float(int(q) - 16) * f16_to_f32(w_u16(bo));
#else
#if WTYPE == 7
  q |= ((w_u32(bo + 4u) >> j) & 1u) << 4;
#endif
  precise float y = float(q) * f16_to_f32(w_u16(bo)) + f16_to_f32(w_u16(bo + 2u));
#endif
  return y;
#elif WTYPE == 20 || WTYPE == 39
  uint j = k % 32u;
#if WTYPE == 20
  uint bo = ro + 18u * (k / 32u), qs = bo + 2u;
#else
  uint bo = ro + 17u * (k / 32u), qs = bo + 1u;
#endif
  uint q = j < 16u ? (w_u8(qs + j) & 0xFu) : (w_u8(qs + j - 16u) >> 4);
#if WTYPE == 20
  precise float y = f16_to_f32(w_u16(bo)) * float(kIQ4NL[q]);
#else
  precise float y = float(kMXFP4[q]) * e8m0_half(w_u8(bo));
#endif
  return y;
#elif WTYPE == 10 || WTYPE == 11
  // Q2_K / Q3_K: element 128n + 32j + l is bit pair j of qs byte 32n + l; its scale is
  // sub-block 8n + 2j + l / 16; Q3_K's third bit is hmask bit 4n + j of byte l.
  uint e = k % 256u, n = e / 128u, j = (e % 128u) / 32u, l = e % 32u, is = 8u * n + 2u * j + l / 16u;
#if WTYPE == 10
  uint bo = ro + 84u * (k / 256u);
  uint sc = w_u8(bo + is);
  uint q = (w_u8(bo + 16u + 32u * n + l) >> (2u * j)) & 3u;
  precise float dl = f16_to_f32(w_u16(bo + 80u)) * float(sc & 0xFu);
  precise float ml = f16_to_f32(w_u16(bo + 82u)) * float(sc >> 4);
  precise float y = dl * float(q) - ml;
#else
  uint bo = ro + 110u * (k / 256u);
  int q = int((w_u8(bo + 32u + 32u * n + l) >> (2u * j)) & 3u) - (((w_u8(bo + l) >> (4u * n + j)) & 1u) != 0u ? 0 : 4);
  precise float dl = f16_to_f32(w_u16(bo + 108u)) * float(q3k_scale(bo + 96u, is));
  precise float y = dl * float(q);
#endif
  return y;
#elif WTYPE == 23
  uint bo = ro + 136u * (k / 256u);
  uint e = k % 256u, ib = e / 32u, j = e % 32u;
  uint ls = ((w_u8(bo + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((w_u16(bo + 2u) >> (2u * ib)) & 3u) << 4);
  uint qs = bo + 8u + 16u * ib;
  uint q = j < 16u ? (w_u8(qs + j) & 0xFu) : (w_u8(qs + j - 16u) >> 4);
  precise float dl = f16_to_f32(w_u16(bo)) * float(int(ls) - 32);
  precise float y = dl * float(kIQ4NL[q]);
  return y;
#else
#error unknown WTYPE
#endif
}

void main() {
  uint i = global_index();
  uint K = pc.u[0], n = pc.u[1];
  if (i >= K * n) return;
  uint k = i % K, r = i / K;
  uint id = uint(a_i32(pc.u[5] + 4u * r));
  if (id >= pc.u[2]) id = 0u;  // the host checked the ids it uploaded
  a_st(pc.u[6] + 4u * i, deq(pc.u[3] + pc.u[4] * id, k));
}
