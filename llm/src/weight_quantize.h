// Quantizing a model's float weights at load (EngineOptions::quantize, `--quantize`):
// which weights, and the copies that replace them (decision 66).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/dtype.h"

namespace tessera {
class FastPool;
struct Tensor;
}  // namespace tessera

namespace tessera::detail {

struct WeightGroup;

// The quantized copies the model's weight Tensors point to after quantize_weights();
// the Engine keeps them for as long as the model and the backends may read them.
struct QuantizedWeights {
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte, FreeAligned>> blocks;
  int tensors = 0;               // weights replaced (a tied embedding counts once)
  uint64_t bytes_before = 0, bytes_after = 0;
  bool experts = false;          // a MatMulId (routed-expert) weight was replaced

  // Frees the copies no weight points at any more (a backend's prepare_weight moved
  // the tensor onto a copy of its own); returns the bytes freed.
  size_t drop_unreferenced(const std::vector<Tensor*>& weights);

 private:
  std::vector<size_t> sizes_;  // parallel to blocks
  friend std::unique_ptr<QuantizedWeights> quantize_weights(const std::vector<WeightGroup>&, DType, FastPool&);
};

// Throws tessera::Error unless `target` is one of quantize_targets() (engine.h).
void check_quantize_target(DType target);

// Replaces every F32/F16/BF16 weight of the model (`uses`) that only ever serves as the weight
// operand of MatMul or MatMulId or as the table of GetRows in the model's forward
// graph, has at least two rows and is not an MoE router (`ffn_gate_inp`, kept F32 as
// llama.cpp does), with a copy quantized to `target` by quant::quantize_row, rows in
// parallel on `pool`. The Tensors keep their name and shape; type, strides and data
// change. Weights whose rows are not a multiple of target's block size, and those
// already in another format, are left as they are (said once each). The source data
// is only read. Logs progress for long work and a summary at info level.
// `uses`: weight_uses(model), which the engine computes once for this and for the
// backends' preparation.
std::unique_ptr<QuantizedWeights> quantize_weights(const std::vector<WeightGroup>& uses, DType target,
                                                   FastPool& pool);

}  // namespace tessera::detail
