// Per-sequence state of recurrent (state-space / linear-attention) layers: for each
// recurrent layer a convolution state (the last d_conv-1 inputs of the causal conv)
// and a recurrent state (one matrix per value head), in F32. Unlike the KV cache
// this state describes the whole prefix at once: it exists only at the sequence's
// current end, so it can be copied (a fork at the end), reset (back to position 0)
// or freed, never rewound to an earlier position. The KvCache owns one and creates,
// forks, truncates and frees its slots together with the sequence's pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tessera {

struct RecurrentStateConfig {
  int n_layers = 0;        // recurrent layers (0: the model has none)
  int64_t conv_elems = 0;  // floats of conv state per layer and sequence
  int64_t state_elems = 0; // floats of recurrent state per layer and sequence
};

class RecurrentState {
 public:
  explicit RecurrentState(const RecurrentStateConfig& cfg);
  const RecurrentStateConfig& config() const { return cfg_; }
  bool empty() const { return cfg_.n_layers == 0; }

  // Slots are indexed by the KV cache's sequence ids.
  void create(int32_t seq);           // zeroed state (position 0)
  void copy(int32_t from, int32_t to);
  void reset(int32_t seq);            // back to zero (position 0)
  void free(int32_t seq);

  float* conv(int layer, int32_t seq);
  float* state(int layer, int32_t seq);

 private:
  std::vector<float>& slot(int32_t seq, int layer);
  RecurrentStateConfig cfg_;
  size_t per_layer_ = 0;
  std::vector<std::unique_ptr<std::vector<float>>> slots_;  // by sequence id
};

}  // namespace tessera
