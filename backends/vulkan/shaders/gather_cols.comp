#version 450
// dst[j, t] = src0[ids[j, t], t]; src0 F32 [E, n], ids I32 [k, n].
// push: 0 E, 1 k, 2 n, 3 offX, 4 offIds, 5 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  uint E = pc.u[0], k = pc.u[1], n = pc.u[2];
  if (i >= k * n) return;
  uint t = i / k;
  uint id = min(uint(a_i32(pc.u[4] + 4u * i)), E - 1u);  // ids come from TopK: always in range
  a_st(pc.u[5] + 4u * i, a_f32(pc.u[3] + 4u * (E * t + id)));
}
