#version 450
// Cont: a strided F32 view -> the same values, contiguous. One invocation per element.
// push: 0 n, 1 offS, 2 offD, 3..6 ne, 7..9 nb[1..3] of the source (bytes)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

void main() {
  uint i = global_index();
  if (i >= pc.u[0]) return;
  uint ne0 = pc.u[3], ne1 = pc.u[4], ne2 = pc.u[5];
  uint i0 = i % ne0, r = i / ne0;
  uint i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
  uint so = pc.u[1] + 4u * i0 + pc.u[7] * i1 + pc.u[8] * i2 + pc.u[9] * i3;
  a[(pc.u[2] >> 2) + i] = a[so >> 2];
}
