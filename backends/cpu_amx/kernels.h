// Entry points of the cpu_amx matrix products. Two builds of one algorithm
// (kernel_impl.h): kernels_amx.cpp with the real tile instructions and AVX-512 for
// the scaling (compiled with the AMX and AVX-512 flags, entered only after the probe
// found AMX usable), kernels_emu.cpp with the tile emulator and plain C++ (no ISA
// flags). Both give the same bits, and those of cpu_scalar.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/dtype.h"

namespace tessera::cpu_amx::kern {

// Weights: cpu_avx512's repacked layout (16-row tiles; per 32-weight block the 16
// rows' F16 scales, 32 bytes, then Q8_0: 8 x 64 bytes, vector g lane i = row i's
// bytes 4g..4g+3, which is the VNNI B-tile layout of TDPBSSD as it stands; Q4_0: 4 x
// 64 bytes, vector g lane i = row i's qs[4g..4g+3], whose low nibbles are weights
// 4g.. and high nibbles 16 + 4g.., unpacked to bytes minus 8 when the B tile is built).
constexpr int kTileRows = 16;
constexpr int64_t kBlock = 32;
bool weight_type_supported(DType wt);          // Q8_0, Q4_0
int64_t tile_block_bytes(DType wt);            // 32 + 512 (Q8_0), 32 + 256 (Q4_0)
size_t repacked_bytes(DType wt, int64_t K, int64_t N);
// Repacks rows of GGUF blocks (row r at w + r * wstride) into dst (repacked_bytes).
void repack(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, uint8_t* dst);
// True when the first and last tile of `rep` hold w's scales and bytes in this layout.
bool layout_matches(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, const uint8_t* rep);

// Activations quantized to Q8_0 exactly as quant::quantize_row, in A-tile order: rows
// in groups of 16, and for group g and block b the 16 rows' 32 int8 values back to back
// (512 bytes at q + (g * nb + b) * 512, so a tile load reads 8 whole cache lines);
// row m's block scales (F16-rounded, as floats) at d + m * ldd. The rows of the last
// group past M must exist (the tile loads read them; zero them) and are never written.
struct Job {
  DType wt = DType::Q8_0;
  int64_t K = 0, N = 0;
  const uint8_t* w = nullptr;  // repacked weight (one expert's)
  const int8_t* q = nullptr;
  const float* d = nullptr;
  int64_t ldd = 0;
  int64_t M = 0;               // valid activation rows
  float* out = nullptr;        // row m at out + m * out_stride ...
  int64_t out_stride = 0;
  float* const* out_ptr = nullptr;  // ... or at out_ptr[m] when set
  float* out_row(int64_t m) const { return out_ptr ? out_ptr[m] : out + m * out_stride; }
};
// Bytes of q for `rows` activation rows of length K (rows rounded up to 16).
inline size_t act_q_bytes(int64_t rows, int64_t K) { return size_t((rows + 15) / 16 * 16) * size_t(K); }
// Where row m's block b starts in q.
inline size_t act_q_offset(int64_t m, int64_t b, int64_t K) {
  return size_t(((m / 16) * (K / kBlock) + b) * 512 + (m % 16) * kBlock);
}
// Quantizes one F32 row (K a multiple of 32) as row m of q, its scales to d (K / 32 floats).
void quantize_row_q8_0(const float* x, int64_t K, int8_t* q, int64_t m, float* d);
// The same with cpu_avx512's vectorized quantizer (the same bits: tested); only where
// cpu_avx512::usable().
void quantize_row_q8_0_avx512(const float* x, int64_t K, int8_t* q, int64_t m, float* d);

// Output rows of weight tiles [t0, t1) for every activation row of the job.
void matmul_tiles_real(const Job& job, int64_t t0, int64_t t1);
void matmul_tiles_emulated(const Job& job, int64_t t0, int64_t t1);

}  // namespace tessera::cpu_amx::kern
