#version 450
// One invocation per row of src0 [E, n]: ids of the k largest values, largest first,
// lowest id on ties, NaN ranking last. The j-th pick is the best element strictly
// after the (j-1)-th in that total order: O(k*E), no scratch memory.
// push: 0 E, 1 n, 2 k, 3 offX, 4 offY (I32 [k, n])
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

float key(float v) { return isnan(v) ? uintBitsToFloat(0xFF800000u) : v; }
// a ranks before b
bool before(float ka, uint ia, float kb, uint ib) { return ka > kb || (ka == kb && ia < ib); }

void main() {
  uint t = global_index();
  uint E = pc.u[0], n = pc.u[1], k = pc.u[2];
  if (t >= n) return;
  uint xo = pc.u[3] + 4u * E * t;
  float pk = 0.0;
  uint pi = 0xFFFFFFFFu;
  for (uint j = 0u; j < k; ++j) {
    float bk = 0.0;
    uint bi = 0xFFFFFFFFu;
    for (uint i = 0u; i < E; ++i) {
      float ki = key(a_f32(xo + 4u * i));
      if (pi != 0xFFFFFFFFu && !before(pk, pi, ki, i)) continue;  // not after the previous pick
      if (bi == 0xFFFFFFFFu || before(ki, i, bk, bi)) { bk = ki; bi = i; }
    }
    a[(pc.u[4] >> 2) + k * t + j] = bi;
    pk = bk;
    pi = bi;
  }
}
