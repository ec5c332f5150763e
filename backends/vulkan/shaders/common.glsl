// Shared by every tessera compute shader.
//
// Binding 0 is the run's arena (activations, scratch), binding 1 a weight buffer (or
// the arena again); bindings 2 and 3 hold a layer's K and V storage for the KV shaders
// (kv_write.comp, attention.comp declare them). All are plain uint arrays addressed by
// *byte* offsets passed as push constants, so tensors and GGUF blocks (34-, 18-,
// 210-byte blocks) need no particular alignment beyond what their element type
// implies. Bindings may alias the same buffer: none is declared restrict.
layout(std430, set = 0, binding = 0) buffer Arena { uint a[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weights { uint w[]; };
layout(push_constant) uniform PC { uint u[32]; } pc;

#define PF(i) uintBitsToFloat(pc.u[i])

// Work-group / invocation index over a 2-D dispatch (x limited to 65535 groups).
uint wg_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }
uint global_index() { return wg_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; }

float a_f32(uint off) { return uintBitsToFloat(a[off >> 2]); }
void a_st(uint off, float v) { a[off >> 2] = floatBitsToUint(v); }
int a_i32(uint off) { return int(a[off >> 2]); }
uint a_u8(uint off) { return (a[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu; }
int a_i8(uint off) { return int(a_u8(off) << 24) >> 24; }

uint w_u8(uint off) { return (w[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu; }
int w_i8(uint off) { return int(w_u8(off) << 24) >> 24; }
uint w_u16(uint off) { return (w[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu; }  // off even
float w_f32(uint off) { return uintBitsToFloat(w[off >> 2]); }
// 4 bytes of the weight buffer at any byte offset (little-endian).
uint w_u32(uint off) {
  uint i = off >> 2, sh = (off & 3u) * 8u;
  if (sh == 0u) return w[i];
  return (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}
ivec4 i8x4(uint v) {
  return ivec4(bitfieldExtract(int(v), 0, 8), bitfieldExtract(int(v), 8, 8), bitfieldExtract(int(v), 16, 8),
               bitfieldExtract(int(v), 24, 8));
}
ivec4 u8x4(uint v) { return ivec4(int(v & 0xFFu), int((v >> 8) & 0xFFu), int((v >> 16) & 0xFFu), int(v >> 24)); }
int dot4(ivec4 a, ivec4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
int sum4(ivec4 a) { return a.x + a.y + a.z + a.w; }

// IEEE half <-> float in integer arithmetic (bit-exact with tessera::quant, subnormals
// included, independent of the device's denormal and rounding modes).
float f16_to_f32(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1Fu;
  uint m = h & 0x3FFu;
  if (e == 0x1Fu) return uintBitsToFloat(sign | 0x7F800000u | (m << 13));
  if (e != 0u) return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0u) return uintBitsToFloat(sign);
  int msb = findMSB(m);                 // 0..9
  uint shift = uint(10 - msb);
  m = (m << shift) & 0x3FFu;
  uint fe = uint(113 - int(shift));
  return uintBitsToFloat(sign | (fe << 23) | (m << 13));
}

uint f32_to_f16(float f) {
  uint u = floatBitsToUint(f);
  uint sign = (u >> 16) & 0x8000u;
  uint x = u & 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00u;
  if (x >= 0x477FF000u) return sign | 0x7C00u;
  if (x >= 0x38800000u) {
    uint r = x - 0x38000000u;
    r += 0xFFFu + ((r >> 13) & 1u);
    return sign | (r >> 13);
  }
  if (x < 0x33000000u) return sign;
  uint e = x >> 23;
  uint m = (x & 0x7FFFFFu) | 0x800000u;
  uint shift = 126u - e;
  uint q = m >> shift;
  uint rem = m & ((1u << shift) - 1u);
  uint half_ = 1u << (shift - 1u);
  if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) q += 1u;
  return sign | q;
}

float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

float bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }
uint f32_to_bf16(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// C's roundf: halves away from zero (v - trunc(v) is exact in float).
float round_away(float v) {
  float t = trunc(v);
  if (abs(v - t) >= 0.5) t += sign(v);
  return t;
}

// Q4_K / Q5_K: 6-bit scale and min j of the 12 scale bytes at byte offset `off` of `w`.
void scale_min_k4(uint j, uint off, out uint sc, out uint m) {
  if (j < 4u) {
    sc = w_u8(off + j) & 63u;
    m = w_u8(off + j + 4u) & 63u;
  } else {
    sc = (w_u8(off + j + 4u) & 0xFu) | ((w_u8(off + j - 4u) >> 6) << 4);
    m = (w_u8(off + j + 4u) >> 4) | ((w_u8(off + j) >> 6) << 4);
  }
}

// The 4-bit code tables of IQ4_NL / IQ4_XS and MXFP4 (tessera::quant's kIQ4NLValues,
// kMXFP4Values).
const int kIQ4NL[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
const int kMXFP4[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
// The 4 nibbles v & 0x0F0F0F0F (4 bytes) mapped through a code table.
ivec4 iq4nl_x4(uint v) { return ivec4(kIQ4NL[v & 0xFu], kIQ4NL[(v >> 8) & 0xFu], kIQ4NL[(v >> 16) & 0xFu], kIQ4NL[(v >> 24) & 0xFu]); }
ivec4 mxfp4_x4(uint v) { return ivec4(kMXFP4[v & 0xFu], kMXFP4[(v >> 8) & 0xFu], kMXFP4[(v >> 16) & 0xFu], kMXFP4[(v >> 24) & 0xFu]); }
// 2^(e-128), half the E8M0 scale e (tessera::quant::e8m0_to_fp32_half), exact.
float e8m0_half(uint e) { return uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23)); }
// Bits 0-3 of b as bit 0 of each of 4 bytes (the fifth bits of 4 Q5 elements).
uint spread4(uint b) { return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21); }
// Q3_K's 6-bit scale j (0..15) from the 12 packed bytes at off, minus 32.
int q3k_scale(uint off, uint j) {
  uint lo = (w_u8(off + j % 8u) >> (4u * (j / 8u))) & 0xFu;
  uint hi = (w_u8(off + 8u + j % 4u) >> (2u * (j / 4u))) & 3u;
  return int(lo | (hi << 4)) - 32;
}
