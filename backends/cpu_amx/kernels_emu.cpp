// The emulated build of the cpu_amx products (tile emulator, plain C++ scaling) and
// the layout helpers both builds share. Compiled without ISA flags and with
// -ffp-contract=off: runs on any x86-64 CPU and rounds as cpu_scalar does.
#include <cstring>
#include <cstdlib>
#include <vector>

#include "kernel_impl.h"
#include "../cpu_avx512/kernels.h"  // cpu_avx512::kern::prep_act_repacked
#include "tessera/error.h"
#include "tessera/quant.h"

namespace tessera::cpu_amx::kern {

bool weight_type_supported(DType wt) { return wt == DType::Q8_0 || wt == DType::Q4_0; }
int64_t tile_block_bytes(DType wt) { return wt == DType::Q4_0 ? 32 + 256 : 32 + 512; }

size_t repacked_bytes(DType wt, int64_t K, int64_t N) {
  return size_t((N + kTileRows - 1) / kTileRows) * size_t(K / kBlock) * size_t(tile_block_bytes(wt));
}

void repack(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, uint8_t* dst) {
  const int64_t nb = K / kBlock, TB = tile_block_bytes(wt), tiles = (N + kTileRows - 1) / kTileRows;
  const int64_t BS = wt == DType::Q4_0 ? 18 : 34, QB = BS - 2;  // GGUF block bytes, quantized bytes
  std::memset(dst, 0, repacked_bytes(wt, K, N));                 // rows past N: scale 0
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = dst + (t * nb + b) * TB;
      for (int i = 0; i < kTileRows && t * kTileRows + i < N; ++i) {
        const uint8_t* blk = w + (t * kTileRows + i) * wstride + b * BS;
        std::memcpy(o + 2 * i, blk, 2);
        for (int64_t g = 0; g < QB / 4; ++g) std::memcpy(o + 32 + 64 * g + 4 * i, blk + 2 + 4 * g, 4);
      }
    }
}

bool layout_matches(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, const uint8_t* rep) {
  const int64_t nb = K / kBlock, TB = tile_block_bytes(wt), tiles = (N + kTileRows - 1) / kTileRows;
  const int64_t BS = wt == DType::Q4_0 ? 18 : 34, QB = BS - 2;
  for (int64_t t : {int64_t(0), tiles - 1})
    for (int64_t b : {int64_t(0), nb - 1}) {
      const uint8_t* o = rep + (t * nb + b) * TB;
      for (int i = 0; i < kTileRows && t * kTileRows + i < N; ++i) {
        const uint8_t* blk = w + (t * kTileRows + i) * wstride + b * BS;
        if (std::memcmp(o + 2 * i, blk, 2) != 0) return false;
        for (int64_t g = 0; g < QB / 4; ++g)
          if (std::memcmp(o + 32 + 64 * g + 4 * i, blk + 2 + 4 * g, 4) != 0) return false;
      }
    }
  return true;
}

void quantize_row_q8_0(const float* x, int64_t K, int8_t* q, int64_t m, float* d) {
  thread_local std::vector<quant::BlockQ8_0> blocks;
  const int64_t nb = K / kBlock;
  if (blocks.size() < size_t(nb)) blocks.resize(size_t(nb));
  quant::quantize_row(DType::Q8_0, x, blocks.data(), K);
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(q + act_q_offset(m, b, K), blocks[size_t(b)].qs, kBlock);
    d[b] = quant::fp16_to_fp32(blocks[size_t(b)].d);
  }
}

void quantize_row_q8_0_avx512(const float* x, int64_t K, int8_t* q, int64_t m, float* d) {
  // cpu_avx512's prepared Q8_0 activation: int8 values in natural order, then at the
  // next 64-byte multiple the blocks' F16-rounded scales as floats (then corrections).
  thread_local uint8_t* buf = nullptr;
  thread_local size_t cap = 0;
  const size_t need = cpu_avx512::kern::act_bytes_repacked(DType::Q8_0, K);
  if (need > cap) {
    std::free(buf);
    cap = (need + 4095) & ~size_t(4095);
    buf = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
    if (!buf) throw Error("cpu_amx: out of memory quantizing activations");
  }
  cpu_avx512::kern::prep_act_repacked(DType::Q8_0, x, K, buf);
  const int64_t nb = K / kBlock;
  const auto* dd = reinterpret_cast<const float*>(buf + ((size_t(K) + 63) & ~size_t(63)));
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(q + act_q_offset(m, b, K), buf + b * kBlock, kBlock);
    d[b] = dd[b];
  }
}

namespace {

// The emulator, one thread's tile state; the same tile numbers as the real build.
struct EmuTiles {
  static void configure(const tile::Config& c) { tile::thread_emulator().ldtilecfg(c); }
  static void release() { tile::thread_emulator().release(); }
  template <int T>
  static void load(const void* p, int64_t stride) { tile::thread_emulator().loadd(T, p, stride); }
  template <int T>
  static void store(void* p, int64_t stride) { tile::thread_emulator().stored(T, p, stride); }
  template <int T>
  static void zero() { tile::thread_emulator().zero(T); }
  template <int D, int A, int B>
  static void dp() { tile::thread_emulator().dpb(tile::Dp::SS, D, A, B); }
  // 4 x 64 nibble bytes -> 8 x 64 bytes (value - 8).
  static void unpack_q4(const uint8_t* v, int8_t* out) {
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 64; ++l) {
        out[64 * g + l] = int8_t((v[64 * g + l] & 0x0F) - 8);
        out[64 * (4 + g) + l] = int8_t((v[64 * g + l] >> 4) - 8);
      }
  }
  // acc[m][n] += Q4 ? (float(c) * dw[n]) * dy[m] : float(c) * (dw[n] * dy[m]).
  template <bool Q4>
  static void scale(const int32_t* c, const uint16_t* dw16, const float* dy, int64_t ldd, int rows, float* acc,
                    int64_t acc_stride) {
    float dw[16];
    for (int n = 0; n < 16; ++n) dw[n] = quant::fp16_to_fp32(dw16[n]);
    for (int m = 0; m < rows; ++m) {
      const float y = dy[m * ldd];
      for (int n = 0; n < 16; ++n) {
        const float sv = float(c[m * 16 + n]);
        acc[m * acc_stride + n] += Q4 ? (sv * dw[n]) * y : sv * (dw[n] * y);
      }
    }
  }
};

}  // namespace

void matmul_tiles_emulated(const Job& job, int64_t t0, int64_t t1) { impl::matmul_tiles<EmuTiles>(job, t0, t1); }

}  // namespace tessera::cpu_amx::kern
