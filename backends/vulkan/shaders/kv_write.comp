#version 450
// x (F32 [hd, n_kv, T]: T rows of `rowe` elements) -> F16 rows of one layer's K or V
// storage in device memory (binding 2), each token's row at its slot: row slot % pt
// of page slot / pt. One invocation per pair of elements (rowe is even), so every uint
// is written by one invocation.
// push: 0 rowe, 1 T, 2 offX, 3 offSlots, 4 row stride (bytes), 5 page stride (bytes),
//       6 page_tokens
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"
layout(std430, set = 0, binding = 2) buffer KvStore { uint kv[]; };

void main() {
  uint i = global_index();
  uint rowe = pc.u[0], T = pc.u[1], pt = pc.u[6];
  if (i >= rowe * T / 2u) return;
  uint e = 2u * i;
  uint t = e / rowe, inrow = e % rowe;
  uint slot = a[(pc.u[3] >> 2) + t];
  uint byte = (slot / pt) * pc.u[5] + (slot % pt) * pc.u[4] + 2u * inrow;
  uint x = pc.u[2] + 4u * e;
  kv[byte >> 2] = f32_to_f16(a_f32(x)) | (f32_to_f16(a_f32(x + 4u)) << 16);
}
