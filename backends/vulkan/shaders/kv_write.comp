#version 450
// K and V (F32 [hd, n_kv, T]) -> F16 rows of the device mirror of the cache (one row
// of n_kv*hd halves per position, contiguous by position). One invocation per pair of
// elements (hd is even), so every uint is written by one invocation.
// push: 0 hd, 1 n_kv, 2 T, 3 offK, 4 offV, 5 mirK, 6 mirV, 7 p0 (mirror row of token 0)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  uint hd = pc.u[0], nkv = pc.u[1], T = pc.u[2];
  uint npairs = hd * nkv * T / 2u;
  if (i >= npairs) return;
  uint e = 2u * i;                   // element index in [hd, n_kv, T] order
  uint rowe = hd * nkv;
  uint t = e / rowe, inrow = e % rowe;
  uint dstw = ((pc.u[7] + t) * rowe + inrow) / 2u;
  uint k = f32_to_f16(a_f32(pc.u[3] + 4u * e)) | (f32_to_f16(a_f32(pc.u[3] + 4u * e + 4u)) << 16);
  uint v = f32_to_f16(a_f32(pc.u[4] + 4u * e)) | (f32_to_f16(a_f32(pc.u[4] + 4u * e + 4u)) << 16);
  a[(pc.u[5] >> 2) + dstw] = k;
  a[(pc.u[6] >> 2) + dstw] = v;
}
