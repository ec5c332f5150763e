// Helpers shared by architectures: typed hyperparameter reads keyed by architecture,
// validated against limits derived from the file's tensor table before anything is
// sized from them, and weight lookup with shape validation.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <unordered_map>
#include <string_view>

#include "tessera/error.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"
#include "tessera/model_description.h"

namespace tessera::models {

// KV geometry of an attention model: one K/V row of n_head_kv * head_dim per layer
// and position, pages enough for n_ctx positions.
KvCacheConfig paged_kv_config(const ModelInfo& info, int64_t n_ctx, int page_tokens);
// The same with the layers flagged in `local` attending to a sliding window of `window`
// positions, their KV in a window pool (as large as the main one here; the engine sizes
// it by the window).
KvCacheConfig windowed_kv_config(const ModelInfo& info, int64_t n_ctx, int page_tokens, int32_t window,
                                 std::vector<uint8_t> local);
// The flags of `layers` (each with a bool `local`) for windowed_kv_config.
template <class Layers>
std::vector<uint8_t> local_layer_flags(const Layers& layers) {
  std::vector<uint8_t> flags;
  for (const auto& L : layers) flags.push_back(L.local ? 1 : 0);
  return flags;
}

class WeightSource;
struct RopeYarn;

// Defaults of the hyperparameters a file may leave out, per architecture.
struct DecoderDefaults {
  int64_t context_length;
  float rms_eps;
  float rope_freq_base;
  // The architecture reads attention.value_length itself (multi-head latent attention,
  // whose cached value is narrower than its cached key); otherwise it must equal the
  // key length.
  bool own_value_length = false;
};
// The architecture's and the model's names, and the hyperparameters every decoder
// shares, checked (block count, width, heads, context, RMS epsilon, RoPE base, head
// size = value size, RoPE dimensions), into `info`; the architecture reads its own
// (feed-forward, experts, ...) after.
void read_decoder_hparams(const WeightSource& w, ModelInfo& info, const DecoderDefaults& defaults);
// expert_group_count (1 when absent) and expert_group_used_count (all groups when
// absent), checked against the expert counts read by read_expert_hparams.
struct ExpertGroups {
  int64_t groups = 1, kept = 1;
};
ExpertGroups read_expert_groups(const WeightSource& w, const ModelInfo& info);
// rope.scaling.*: none, linear (info.rope_freq_scale) or yarn (also the returned YaRN
// parameters: ext_factor 1, attn_factor 1, beta_fast 32 and beta_slow 1 unless the file
// says otherwise, correction dimensions from original_context_length). Other types are
// refused. Call after read_decoder_hparams (it reads rope_dims and rope_freq_base).
RopeYarn read_rope_scaling(const WeightSource& w, ModelInfo& info);
// A routed mixture of experts' sizes: expert_count, expert_used_count (at most the
// count) and the expert width, expert_feed_forward_length (feed_forward_length in
// files that give only that).
void read_expert_hparams(const WeightSource& w, ModelInfo& info);
// attention.sliding_window (`fallback` when absent), at most 2^31 - 1.
int32_t read_sliding_window(const WeightSource& w, int64_t fallback);

// Reads an architecture's hyperparameters and weights from a model description
// (tessera's names; model_description.h). Messages name what the file calls them.
//
// Hostile files: a hyperparameter is a claim the tensor table must back.
// Before an architecture sizes anything from a value it reads it through one of the
// checked getters below, which refuse (tessera::Error naming the key and the value)
//  - a layer count above the number of layers whose tensors exist (blk.N.*),
//  - a size or count above the largest tensor dimension in the file (no tensor could
//    then have the shape it implies), or below 1,
//  - an epsilon, RoPE base or factor that is not a finite positive float,
// and products of sizes go through mul(), which refuses on int64 overflow.
//
// Weights are loaded into the model's own members: load() fills a member and adds its
// address to the model's weight list (Model::weights()), so what a model reads is
// written once. The members must not move afterwards (size layer vectors first).
class WeightSource {
 public:
  WeightSource(const ModelDescription& desc, std::vector<Tensor*>& weights);

  const ModelDescription& desc() const { return desc_; }
  const Metadata& md() const { return desc_.hparams; }  // tessera's keys
  const std::string& arch() const { return desc_.architecture; }
  // What the file calls hyperparameter `suffix` ("llama.block_count", "num_hidden_layers").
  std::string key(const std::string& suffix) const { return desc_.origin_of(suffix); }

  // Optional hyperparameters that size nothing: nullopt when absent; a wrong type is
  // refused naming the file's key.
  bool hp_has(const std::string& suffix) const { return md().find(suffix) != nullptr; }
  std::optional<std::string> hp_string(const std::string& suffix) const;
  std::optional<bool> hp_bool(const std::string& suffix) const;
  const MetaValue* hp_value(const std::string& suffix) const { return md().find(suffix); }

  // Hyperparameter `suffix` as integer/float, unchecked; `fallback` when absent (required if
  // no fallback). Use only for values that size nothing.
  int64_t hp_int(const std::string& suffix) const;
  int64_t hp_int(const std::string& suffix, int64_t fallback) const;

  // A size or count (embedding length, heads, head size, experts, ...): required, or
  // `fallback` when absent; refused unless 1 <= value <= max_dim().
  int64_t hp_size(const std::string& suffix) const;
  int64_t hp_size(const std::string& suffix, int64_t fallback) const;
  // block_count: required, 1 <= value <= layers_in_file().
  int64_t hp_block_count() const;
  // context_length: `fallback` when absent; 1 <= value <= 2^31 - 1 (positions are int32).
  int64_t hp_context_length(int64_t fallback) const;
  // An epsilon, RoPE base or scaling factor: `fallback` when absent; refused unless it
  // is finite, positive and stays positive and finite as a float.
  float hp_positive_float(const std::string& suffix, float fallback) const;

  // Refuse hyperparameter `suffix` holding `value`, saying why.
  [[noreturn]] void refuse(const std::string& suffix, const std::string& value, const std::string& why) const;
  // a * b for a size derived from hyperparameters (both >= 0); refuses naming `what`
  // (e.g. "attention.head_count x attention.key_length") if it overflows int64.
  int64_t mul(int64_t a, int64_t b, const std::string& what) const;

  // Distinct N for which the file has a tensor named "blk.N.*".
  int64_t layers_in_file() const { return layers_in_file_; }
  // The largest dimension of any tensor in the file (at least 1).
  int64_t max_dim() const { return max_dim_; }

  // `into` becomes the tensor `name`, which must have exactly this shape (ggml order;
  // throws naming the tensor and both shapes otherwise), and is a weight of the model.
  void load(Tensor& into, const std::string& name, std::initializer_list<int64_t> shape);
  // load(), and the tensor must be F32 (biases, sinks, routing corrections).
  void load_f32(Tensor& into, const std::string& name, std::initializer_list<int64_t> shape);
  // `into` is a second member for weight `from` (a tied output matrix): a weight of
  // its own, so that preparing the weights updates it too.
  void tie(Tensor& into, const Tensor& from);
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const TensorInfo* find(const std::string& name) const;

 private:
  Tensor require(const std::string& name, std::initializer_list<int64_t> shape) const;
  int64_t check_size(const std::string& suffix, int64_t v, bool present) const;
  // md().get_*(suffix) with errors naming the file's key instead of tessera's.
  template <class F>
  auto read(const std::string& suffix, F&& get) const -> decltype(get());

  const ModelDescription& desc_;
  std::vector<Tensor*>& weights_;
  std::unordered_map<std::string_view, const TensorInfo*> by_name_;  // the description's tensors, indexed
  int64_t layers_in_file_ = 0, max_dim_ = 1;
};

}  // namespace tessera::models
