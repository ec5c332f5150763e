// cpu_avx512: the AVX-512 (F, BW, VL, DQ, VNNI, BF16) CPU backend. Every op of
// graph.h; MatMul for F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K weights with the weights
// dequantized in registers and VNNI integer dot products against activations
// quantized once per row exactly like the reference (cpu_scalar agrees to float
// rounding; repacked Q4_0/Q8_0 bit for bit). prepare_weight() keeps a 16-row
// interleaved copy of Q4_0/Q8_0/Q4_K weights (lane = row: no shuffles in the decode
// loop) next to the untouched tensor; other dtypes, and weights it never saw, are
// read in the GGUF layout. MatMulId (mixture of experts) groups the routed tokens
// by expert and runs the same kernels per expert, with 3-D expert tensors repacked
// per expert. Small ops (RmsNorm, Add, Mul, SwiGlu, Silu, Softmax, Rope, GetRows,
// KvWrite, MoeCombine, Argmax, ...) are native and split over the pool above a size
// threshold; the router and gate ops (TopK, GatherCols, Sigmoid, Softplus, Cont,
// SsmConv) run the reference's scalar formulas here. Every op of graph.h is native;
// supports() declines only shapes the kernels do not take (a weight dtype without a
// kernel, MatMul dst rows not evenly spaced, head_dim above 1024, MoeCombine over more
// than 64 experts, delta-net rows not evenly spaced), and the scheduler sends those to
// the next backend by rank. Node validation is the core's op schema.
#pragma once
#include <memory>
#include <string_view>
#include <string>

#include "tessera/backend.h"
#include "tessera/pool_ref.h"

namespace tessera::cpu_avx512 {

// True when this CPU and OS can run the kernels; otherwise *why names what is missing.
// Safe on any x86-64 CPU (this part is compiled without ISA flags).
bool usable(std::string* why = nullptr);

// Creates the backend (throws tessera::Error when !usable(), decode_tiles is not 0,
// 1, 2 or 4, or decode_prefetch not -1, 0 or 1). `pool` may be null. `repack`:
// prepare_weight() keeps a row-interleaved copy of Q4_0/Q8_0/Q4_K/Q5_K/Q6_K weights (the
// tensor itself is not modified); false reads the GGUF layout directly. `decode_tiles`:
// repacked Q4_0/Q8_0 tiles a one-column product walks side by side; 0 =
// default_decode_tiles(). `decode_prefetch`: 1 = one-column products over repacked or
// F32/F16/BF16 weights request the weight stream in software, 0 = they leave it to the
// hardware prefetchers; -1 = default_decode_prefetch().
std::unique_ptr<Backend> make_backend(PoolRef pool, bool repack = true, int decode_tiles = 0,
                                      int decode_prefetch = -1);

// The create() options (plugins.toml [backend.cpu_avx512] options), which cpu_amx passes
// on to the cpu_avx512 it wraps: `repack` (a switch), `decode_tiles` (1, 2 or 4),
// `decode_prefetch` (a switch); unset, make_backend's defaults for this CPU.
struct Options {
  bool repack = true;
  int decode_tiles = 0;
  int decode_prefetch = -1;
};
// Takes one option into `o`; false when `key` is not one of them. Throws tessera::Error
// naming the option for a value it does not take.
bool take_option(Options& o, std::string_view key, std::string_view value);
inline std::unique_ptr<Backend> make_backend(PoolRef pool, const Options& o) {
  return make_backend(pool, o.repack, o.decode_tiles, o.decode_prefetch);
}

// The tiles a one-column product walks side by side on this CPU: 4 or 1, by the CPU
// families decision 32 lists.
int default_decode_tiles();

// Whether one-column products request their weight stream in software on this CPU, by
// the CPU families decision 35 lists.
bool default_decode_prefetch();

}  // namespace tessera::cpu_avx512
