// Entry points of the AVX-512 kernels (compiled with AVX-512 flags in their own
// translation units). Plain functions over raw pointers only: nothing here may be
// called before cpu_avx512::usable() said yes.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/dtype.h"

namespace tessera::cpu_avx512::kern {

// ---- MatMul -------------------------------------------------------------------
// Weight dtypes with an AVX-512 product.
bool matmul_type_supported(DType wt);
// Bytes of one prepared activation column (64-byte multiple) for weight type wt.
size_t act_bytes(DType wt, int64_t K);
// Converts one F32 activation column to the prepared form of vec_dot_type(wt)
// (quantized exactly like quant::quantize_row), into dst (64-byte aligned).
void prep_act(DType wt, const float* x, int64_t K, uint8_t* dst);

struct MatMulJob {
  DType wt;
  int64_t K;
  const uint8_t* w;      // row 0 of the weight
  int64_t wstride;       // bytes between weight rows
  int64_t M;             // activation columns
  const uint8_t* act;    // M prepared columns
  size_t act_stride;     // bytes between prepared columns
  float* out;            // out[m * out_stride + n]
  int64_t out_stride;    // floats between output columns
  // Optional gathered columns (MatMulId): when set, column m reads act_ptr[m] and
  // writes out_ptr[m][n] instead of act / out above.
  const uint8_t* const* act_ptr = nullptr;
  float* const* out_ptr = nullptr;
  // Repacked Q4_0 / Q8_0, one column: 16-row tiles walked side by side per kernel call
  // (1, 2 or 4; see decision 32 and make_backend).
  int decode_tiles = 1;
  // One column (decode): software prefetch of the weight stream ahead of the kernel,
  // for repacked tiles and F32 / F16 / BF16 rows (see decision 35 and make_backend).
  bool decode_prefetch = true;
  const uint8_t* col_act(int64_t m) const { return act_ptr ? act_ptr[m] : act + size_t(m) * act_stride; }
  float* col_out(int64_t m) const { return out_ptr ? out_ptr[m] : out + m * out_stride; }
};
// Computes rows [r0, r1) of the product for every column. Each output element is
// computed by one fixed code path independent of how rows are split.
void matmul_rows(const MatMulJob& job, int64_t r0, int64_t r1);

// ---- Other ops ----------------------------------------------------------------
void rms_norm_row(const float* x, const float* w, float* y, int64_t K, float eps);
void softmax_row(const float* x, float* y, int64_t K);
void silu_row(const float* x, float* y, int64_t K);
void swiglu_row(const float* g, const float* u, float* y, int64_t K);
// y = gelu(g) * u with the reference's GELU (tanh form on the F16-rounded input,
// result rounded to F16; the identity above 10, zero below -10), through a table of
// every F16 value, so results equal cpu_scalar's bit for bit.
void geglu_row(const float* g, const float* u, float* y, int64_t K);
// gpt-oss's clamped SwiGLU: x = min(g, limit), v = clamp(u, -limit, limit),
// y = x / (1 + exp(-alpha x)) * (v + 1); the reference's operations (bit for bit).
void swiglu_oai_row(const float* g, const float* u, float* y, int64_t K, float alpha, float limit);
// y = x / max(sum of x (in double, in order), min_sum) * scale (NormalizeRows).
void normalize_row(const float* x, float* y, int64_t K, float scale, float min_sum);
void add_row(const float* a, const float* b, float* y, int64_t K);
void mul_row(const float* a, const float* b, float* y, int64_t K);
int64_t argmax_row(const float* x, int64_t K);
// MoeCombine of one token: y[i] = sum over j in order of w[j] * e[j][i] (N outputs).
void moe_combine_row(const float* const* e, const float* w, int64_t k, float* y, int64_t N);
void f32_to_f16_row(const float* x, uint16_t* y, int64_t K);  // == quant::fp32_to_fp16 per element
// y[k] = expf(x[k]) by exp16 (kernels_exp.h): libm's expf bit for bit (its test's entry point).
void exp_row(const float* x, float* y, int64_t K);

// One attention item: q (hd floats), causal over L cached positions whose K/V rows
// for this KV head are krows[j] + off / vrows[j] + off (off: the head's first
// element in a cache row); out: hd floats. With a sink (the head's attention-sink
// logit), the sink joins the softmax's maximum and its denominator, with no value.
void attention_item(const float* q, int64_t hd, const uint16_t* const* krows, const uint16_t* const* vrows,
                    int64_t off, int64_t L, float scale, float* out, const float* sink = nullptr);
// Query rows of one token (`heads` of them, all over the same L positions of one KV
// head) whose value rows have dv values at voff (latent attention: dv < hd, the values
// the leading part of each key row); out[h]: dv floats. Equals cpu_scalar bit for bit:
// 16 positions' dot products are summed at once, each in cpu_scalar's order over d.
void attention_heads_dv(const float* const* q, float* const* out, int heads, int64_t hd, int64_t dv,
                        const uint16_t* const* krows, const uint16_t* const* vrows, int64_t koff, int64_t voff,
                        int64_t L, float scale, const float* sinks = nullptr);
// Up to 16 query rows (tokens x heads) that read the same KV head, row r over the
// first len[r] positions (len non-decreasing, at least 1), with sinks[r] its sink
// where sinks is given: each row's result equals attention_item's bit for bit; head
// sizes 64 and 128 run the rows across the vector lanes, other sizes attention_item
// per row.
void attention_tile(const float* const* q, float* const* out, const int64_t* len, int rows, int64_t hd,
                    const uint16_t* const* krows, const uint16_t* const* vrows, int64_t off, float scale,
                    const float* sinks = nullptr);

}  // namespace tessera::cpu_avx512::kern

namespace tessera::cpu_avx512::kern {

// ---- Repacked Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights (prepare_weight) -----------
// 16-row tiles, per block: the 16 rows' F16 scales (and K-quant sub-block scales),
// then their quantized bytes interleaved in 4-byte groups (lane i of each 64-byte
// vector = row i), so one vpdpbusd covers 16 rows x 4 (Q8_0, Q6_K) or 8 (Q4_0, Q4_K,
// Q5_K: both nibbles) weights with no shuffles. Every layout keeps the GGUF size (16 x
// the block's bytes), as decode reads each byte once; kernels_matmul.cpp describes them.
constexpr int kTileRows = 16;
bool repack_supported(DType wt);
size_t repacked_bytes(DType wt, int64_t K, int64_t N);
// Repacks tiles [t0, t1) (of (N + 15) / 16) into dst (repacked_bytes(wt, K, N) bytes).
void repack(DType wt, const uint8_t* w, int64_t wstride, int64_t K, int64_t N, uint8_t* dst, int64_t t0, int64_t t1);
size_t act_bytes_repacked(DType wt, int64_t K);
void prep_act_repacked(DType wt, const float* x, int64_t K, uint8_t* dst);
// Tiles [t0, t1) of the product for every column (job.w = repacked data).
void matmul_tiles_repacked(const MatMulJob& job, int64_t N, int64_t t0, int64_t t1);
// The same for a weight in the file's layout (job.w = row 0, job.wstride): each tile is
// repacked into scratch (repacked_bytes(wt, K, kTileRows) bytes, 64-byte aligned) just
// before its kernels read it, so the results equal matmul_tiles_repacked's over a copy
// repacked at load without a copy of the whole weight. For more than a few columns,
// where the repacking of a tile is shared by enough of them.
void matmul_tiles_repacking(const MatMulJob& job, int64_t N, int64_t t0, int64_t t1, uint8_t* scratch);
// The columns from which matmul_tiles_repacking beats the row kernels (the repacking
// of a tile costs what the tiles' kernels save on a few columns of Q4_0 / Q8_0, on
// many more of the K-quants, whose row kernels are closer to the tiles' speed).
int64_t repacking_columns(DType wt);

}  // namespace tessera::cpu_avx512::kern

namespace tessera::cpu_avx512::kern {

// The formats without a repacked kernel (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K,
// IQ4_XS): read in their GGUF layout by the row kernels of kernels_matmul_formats.cpp.
bool format_supported(DType wt);

}  // namespace tessera::cpu_avx512::kern
