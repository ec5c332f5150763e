// The gated delta-net recurrence with AVX-512 (compiled with AVX-512 flags; call
// only after cpu_avx512::usable()).
#pragma once
#include <cstdint>

namespace tessera::cpu_avx512::kern {

// One value head over T tokens of a GatedDeltaNet node (semantics in graph.h).
struct DeltaNetHead {
  const float* q;        // token 0's query head (this value head's key head)
  const float* k;        // token 0's key head
  const float* v;        // token 0's value head
  int64_t qkv_stride;    // floats between tokens of q, k and v
  const float* g;        // token 0's log decay of this head
  const float* beta;     // token 0's beta of this head
  int64_t gb_stride;     // floats between tokens of g and beta
  float* state;          // S x S, row j holds the key-space vector of value index j
  float* out;            // token 0's output head (S floats)
  int64_t out_stride;    // floats between tokens of out
  int64_t S = 0, T = 0;
  float eps = 0.0f;      // L2-norm epsilon
  float* scratch;        // 2 * S floats for the normalized q and k
};

// Per token one pass over the state: each row is decayed, dotted with k, corrected
// by the delta rule and dotted with q while it is in L1.
void gated_delta_net_head(const DeltaNetHead& h);

}  // namespace tessera::cpu_avx512::kern
