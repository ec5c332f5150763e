#version 450
// Routing by expert groups: a row's E values form G groups of E / G (G <= 64); a group
// scores the sum of its two largest values (one value: that value); the `kept` groups
// of highest score stay (the lower group first on equal scores), every value of the
// others becomes -infinity. One invocation per row.
// push: 0 E, 1 G, 2 kept, 3 rows, 4 offX, 5 offY
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"

void main() {
  uint row = global_index();
  uint E = pc.u[0], G = pc.u[1], kept = pc.u[2];
  if (row >= pc.u[3]) return;
  uint per = E / G;
  uint xo = pc.u[4] + 4u * E * row, yo = pc.u[5] + 4u * E * row;
  float ninf = uintBitsToFloat(0xFF800000u);
  float score[64];
  for (uint g = 0u; g < G; ++g) {
    float first = ninf, second = ninf;
    for (uint e = g * per; e < (g + 1u) * per; ++e) {
      float v = a_f32(xo + 4u * e);
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
    precise float s = per == 1u ? first : first + second;
    score[g] = s;
  }
  for (uint g = 0u; g < G; ++g) {
    uint rank = 0u;  // groups ahead of g: higher score, or equal and lower in number
    for (uint h = 0u; h < G; ++h)
      if (score[h] > score[g] || (score[h] == score[g] && h < g)) ++rank;
    bool keep = rank < kept;
    for (uint e = g * per; e < (g + 1u) * per; ++e) a_st(yo + 4u * e, keep ? a_f32(xo + 4u * e) : ninf);
  }
}
