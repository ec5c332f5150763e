#version 450
// SsmConv: causal depthwise convolution over the sequence's conv state (its last
// d_conv-1 inputs, mirrored on the device) followed by x; afterwards the state holds
// the last d_conv-1 inputs. One invocation per channel, the reference's sum order.
// push: 0 C, 1 T, 2 d_conv, 3 offX, 4 offW (binding 1), 5 offD, 6 offState
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

void main() {
  uint c = global_index();
  uint C = pc.u[0], T = pc.u[1], dc = pc.u[2], hist = dc - 1u;
  if (c >= C) return;
  uint st = pc.u[6] + 4u * c * hist;
  uint wo = pc.u[4] + 4u * c * dc;
  for (uint t = 0u; t < T; ++t) {
    precise float sum = 0.0;
    for (uint j = 0u; j < dc; ++j) {
      uint p = t + j;  // index in [state, x]
      float v = p < hist ? a_f32(st + 4u * p) : a_f32(pc.u[3] + 4u * ((p - hist) * C + c));
      precise float prod = v * w_f32(wo + 4u * j);
      sum = sum + prod;
    }
    a_st(pc.u[5] + 4u * (t * C + c), sum);
  }
  // New state: window entries T .. T+hist-1 (reads only entries above the one written).
  for (uint j = 0u; j < hist; ++j) {
    uint p = T + j;
    float v = p < hist ? a_f32(st + 4u * p) : a_f32(pc.u[3] + 4u * ((p - hist) * C + c));
    a_st(st + 4u * j, v);
  }
}
