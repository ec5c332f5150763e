#include "gen_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/quant.h"

namespace tessera::gen {
namespace {

using namespace tessera::quant;

// Round to fp16 and back: the per-element step uses the scale the file stores.
float f16_round(float v, uint16_t& bits) {
  bits = fp32_to_fp16(v);
  return fp16_to_fp32(bits);
}

int nearest(float v, int lo, int hi) { return std::clamp(int(std::lround(v)), lo, hi); }

// The element of largest magnitude, with its sign (0 for an all-zero span).
float signed_absmax(const float* x, int n) {
  float best = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  return best;
}

// Q2_K / Q3_K element e of a 256-block: 2 low bits at bit 2 * ((e % 128) / 32) of
// qs[(e / 128) * 32 + e % 32]; Q3_K's high bit at bit (e / 128) * 4 + (e % 128) / 32
// of hmask[e % 32] (the layout core/src/quant/dequantize.cpp reads).
void put_low2(uint8_t* qs, int e, int q) { qs[(e / 128) * 32 + e % 32] |= uint8_t((q & 3) << (2 * ((e % 128) / 32))); }

}  // namespace

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ2_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, src += QK_K) {
    BlockQ2_K& blk = y[b];
    std::memset(&blk, 0, sizeof blk);
    // value = d * sc * q - dmin * m, q in [0, 3]: each sub-block of 16 spans [-min, max].
    float scale[16], mins[16], max_scale = 0.f, max_min = 0.f;
    for (int j = 0; j < 16; ++j) {
      const float* x = src + 16 * j;
      float lo = 0.f, hi = 0.f;
      for (int i = 0; i < 16; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      scale[j] = (hi - lo) / 3.f;
      mins[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float d = f16_round(max_scale / 15.f, blk.d), dmin = f16_round(max_min / 15.f, blk.dmin);
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0.f ? nearest(scale[j] / d, 0, 15) : 0;
      const int m = dmin > 0.f ? nearest(mins[j] / dmin, 0, 15) : 0;
      blk.scales[j] = uint8_t(sc | (m << 4));
      const float dl = d * float(sc), ml = dmin * float(m);
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i;
        put_low2(blk.qs, e, dl > 0.f ? nearest((src[e] + ml) / dl, 0, 3) : 0);
      }
    }
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, src += QK_K) {
    BlockQ3_K& blk = y[b];
    std::memset(&blk, 0, sizeof blk);
    // value = d * (sc - 32) * q, q in [-4, 3]: a sub-block's largest value maps to -4.
    float scale[16], max_scale = 0.f;
    for (int j = 0; j < 16; ++j) {
      scale[j] = signed_absmax(src + 16 * j, 16) / -4.f;
      if (std::fabs(scale[j]) > std::fabs(max_scale)) max_scale = scale[j];
    }
    // The largest scale maps to -32 (the signed 6-bit range is [-32, 31]).
    const float d = f16_round(max_scale / -32.f, blk.d);
    for (int j = 0; j < 16; ++j) {
      const int l = d != 0.f ? nearest(scale[j] / d, -32, 31) : 0;
      const int sc = l + 32;
      blk.scales[j % 8] |= uint8_t((sc & 0xF) << (4 * (j / 8)));
      blk.scales[8 + j % 4] |= uint8_t((sc >> 4) << (2 * (j / 4)));
      const float dl = d * float(l);
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i;
        const int u = (dl != 0.f ? nearest(src[e] / dl, -4, 3) : 0) + 4;  // [0, 7]
        put_low2(blk.qs, e, u & 3);
        if (u & 4) blk.hmask[e % 32] |= uint8_t(1u << ((e / 128) * 4 + (e % 128) / 32));
      }
    }
  }
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b, src += QK_K) {
    BlockIQ4_XS& blk = y[b];
    std::memset(&blk, 0, sizeof blk);
    // value = d * (ls - 32) * grid[nibble]: a sub-block's largest value maps to -127.
    float scale[8], max_scale = 0.f;
    for (int j = 0; j < 8; ++j) {
      scale[j] = signed_absmax(src + 32 * j, 32) / float(kIQ4NLValues[0]);
      if (std::fabs(scale[j]) > std::fabs(max_scale)) max_scale = scale[j];
    }
    const float d = f16_round(max_scale / -32.f, blk.d);
    for (int j = 0; j < 8; ++j) {
      const int l = d != 0.f ? nearest(scale[j] / d, -32, 31) : 0;
      const int ls = l + 32;
      blk.scales_l[j / 2] |= uint8_t((ls & 0xF) << (4 * (j % 2)));
      blk.scales_h |= uint16_t((ls >> 4) << (2 * j));
      const float dl = d * float(l);
      for (int i = 0; i < 32; ++i) {
        // The grid value nearest to x / dl (index 8, the value 1, for a zero scale).
        int best = 8;
        if (dl != 0.f) {
          const float v = src[32 * j + i] / dl;
          for (int k = 0; k < 16; ++k)
            if (std::fabs(v - kIQ4NLValues[k]) < std::fabs(v - kIQ4NLValues[best])) best = k;
        }
        // Bytes 0..15 of the sub-block: element i (low nibble) and i + 16 (high).
        blk.qs[16 * j + i % 16] |= uint8_t(best << (4 * (i / 16)));
      }
    }
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  (void)row_bytes(t, n);  // throws unless n is a multiple of the block size
  switch (t) {
    case DType::Q2_K: quantize_row_q2_k(src, dst, n); return;
    case DType::Q3_K: quantize_row_q3_k(src, dst, n); return;
    case DType::IQ4_XS: quantize_row_iq4_xs(src, dst, n); return;
    default: quant::quantize_row(t, src, dst, n); return;
  }
}

}  // namespace tessera::gen
