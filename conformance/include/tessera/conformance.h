// The conformance suite: proves that a backend computes what the cpu_scalar oracle
// computes, op by op, in the spirit of llama.cpp's test-backend-ops.
//
// A ConformanceCase is one small graph (one op, or KvWrite + Attention for a
// prefill then a decode step, or a batch of sequences doing both through row views
// of shared batch tensors) with a dtype and a shape. run_case() builds it twice
// from the same seeded random inputs, once for the backend under test and once for
// the reference, calls prepare_weight() on the weight tensors (so repacked layouts
// are exercised), executes both and compares the outputs:
//   - NMSE = sum((ref-test)^2) / sum(ref^2) against a per-op limit (1e-7 for
//     elementwise ops, GetRows, Rope, RmsNorm, Softmax and the KV cache contents;
//     5e-4 for MatMul and Attention); Argmax must be identical;
//   - NaN or Inf in the tested output fails, as does an output element left unwritten
//     (outputs start as NaN);
//   - every tensor sits between guard bytes; a write before or after a tensor, or
//     into an input or weight, fails;
//   - a node the backend's supports() refuses is a SKIP with the backend's reason,
//     never a pass. An exception from the backend is a FAIL.
// See docs/conformance.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include <array>

#include "tessera/graph.h"

namespace tessera {

class Backend;

struct ConformanceCase {
  std::string op;     // op_name(kind), e.g. "MatMul"
  std::string dtype;  // weight / table dtype for MatMul and GetRows, else "F32"
  std::string shape;  // e.g. "K256_N7_M3" (only [A-Za-z0-9_])

  Op kind = Op::Count;
  DType type = DType::F32;
  // Shape parameters; meaning per op:
  //   MatMul    k = K (row length), n = N (weight rows), m = M (tokens)
  //   GetRows   k = K, n = V (table rows), m = number of ids
  //   RmsNorm   k = K, n = rows; flag = with weight
  //   Rope      k = head_dim, n = heads, m = tokens; n_dims, mode, pos0, freq_scale
  //   Softmax / Silu / SwiGlu / Add / Mul: x is [k, n, m]; Mul flag = src1 one row
  //   Argmax    k = V, n = rows; flag = many ties
  //   KvWrite   k = head_dim, n_kv, m = tokens written at pos0, page = page tokens
  //   Attention k = head_dim, n_head, n_kv, page, pos0 (positions already cached),
  //             m = prefill tokens, then one decode token; window > 0: a sliding
  //             window (the table's pages wholly before it are -1, as if released).
  //             With flag: a batch of n sequences in one cache (n = 3 or 4 picks the
  //             layout of histories, forks and slices, see docs/conformance.md), m =
  //             rows of the first (mixed prefill / decode) step, then one decode row
  //             per sequence; pos0 = 0
  //   Rope with mode kRopeImrope: also sections (t, h, w, e); yarn_ctx > 0: YaRN over
  //             that original context (ext_factor 1, attn_factor 1, betas 32 and 1)
  //   Attention with sinks: per-head sink logits (some above every score, some below)
  //   Attention with latent > 0: multi-head latent attention: one KV head of k values,
  //             V the first `latent` values of each K row (no V planes), dst [latent, n_head, m]
  //   Concat    rows of k values followed by rows of n values, m rows
  //   GroupLimit k = experts, n = rows, n_head = groups, n_kv = groups kept; flag = two
  //             groups of equal score in every row
  //   SwiGluOai as SwiGlu (alpha 1.702, limit 7; values span the clamps)
  //   GeGlu     as SwiGlu; NormalizeRows k = values per row, n = rows; flag = sums
  //             below the floor
  //   Sigmoid / Softplus: as Silu; Cont: a [k, n, m] view taking every other k-block
  //             of its source (offset flag ? k : 0)
  //   SsmConv   k = channels, n_dims = d_conv, m = prefill tokens, then one token
  //   GatedDeltaNet k = head size, n_head = key heads, n_kv = value heads, m = prefill
  //             tokens, then one token (both from a non-zero recurrent state)
  int64_t k = 1, n = 1, m = 1;
  bool flag = false;
  int32_t n_dims = 0, mode = 0, pos0 = 0;
  int32_t n_head = 0, n_kv = 0, page = 0, window = 0, yarn_ctx = 0, latent = 0;
  bool sinks = false;
  float freq_scale = 1.0f;
  std::array<int32_t, 4> sections{};
  uint64_t seed = 0;  // derived from name()

  // "<op>_<dtype>_<shape>": unique, usable as a GoogleTest test name.
  std::string name() const { return op + "_" + dtype + "_" + shape; }
};

// NMSE = sum((ref-got)^2) / sum(ref^2), llama.cpp test-backend-ops' metric; an
// all-zero reference gives 0 for an exact match and infinity otherwise.
double nmse(const float* ref, const float* got, size_t n);

enum class ConformanceStatus { Pass, Fail, Skip };
const char* conformance_status_name(ConformanceStatus s);  // "PASS" / "FAIL" / "SKIP"

struct ConformanceResult {
  ConformanceCase c;
  ConformanceStatus status = ConformanceStatus::Fail;
  double nmse = 0.0;   // worst compared output (for Argmax: fraction of ids that differ)
  double limit = 0.0;  // the limit that output was held to
  // Largest |got - reference| of any output element over that output's RMS, and its
  // limit: one wrong element fails even where the NMSE over many elements would not.
  double max_err = 0.0;
  double max_err_limit = 0.0;
  std::string message; // why it failed / was skipped; empty on a clean pass
};

// Which cases to run. `op`: comma-separated op names (case-insensitive, exact), or
// any other text, which then must occur in the case name. `dtype`: comma-separated
// dtype names (case-insensitive). Empty = everything.
struct ConformanceFilter {
  std::string op;
  std::string dtype;
  bool matches(const ConformanceCase& c) const;
};

// Every case, in a fixed order: every Op in graph.h x the relevant dtypes x shapes.
const std::vector<ConformanceCase>& conformance_cases();
std::vector<ConformanceCase> conformance_cases(const ConformanceFilter& filter);

// Run one case on `test` and on `reference` (a cpu_scalar instance) and compare.
// Never throws for a backend's failure (that is a FAIL result).
ConformanceResult run_conformance_case(const ConformanceCase& c, Backend& test, Backend& reference);

std::vector<ConformanceResult> run_conformance(Backend& test, Backend& reference,
                                               const ConformanceFilter& filter = {});

// NMSE limits by op, as above (0 for Argmax: identical).
// The limits a case is held to, from what a correct implementation achieves (see
// docs/conformance.md): NMSE over each output, and the largest element error relative
// to the output's RMS. 0 = exact.
struct ConformanceLimits {
  double nmse = 0.0;
  double element = 0.0;
};
ConformanceLimits conformance_limits(Op op, DType weight);

}  // namespace tessera
