// What tessera-gen writes: an architecture's hyperparameters (presets or flags), the
// GGUF metadata, the tensor list with shapes, and the weight dtype of each tensor for a
// file type (the mixed types follow llama.cpp's quantizer per tensor).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::gguf {
class GgufWriter;
}

namespace tessera::gen {

enum class Arch { Llama, Qwen3Moe, Qwen35Moe, Gemma3, Glm4Moe, Deepseek2, GptOss };
const char* arch_name(Arch a);  // the GGUF general.architecture string
bool is_moe(Arch a);             // has routed experts (the --experts flags apply)

struct ModelShape {
  Arch arch = Arch::Llama;
  std::string name = "synthetic-llama";
  int64_t n_layer = 4, n_embd = 256, n_head = 4, n_head_kv = 2;
  int64_t head_dim = 0;  // 0: n_embd / n_head
  int64_t n_ff = 768;    // dense feed-forward size (MoE: only the feed_forward_length key)
  int64_t n_vocab = 0;   // 0: the vocabulary's size
  int64_t context_length = 2048;
  float rope_base = 10000.f, rms_eps = 1e-5f;
  bool tied_output = false;  // no output.weight: the embedding is reused

  // Mixture of experts (qwen3moe, qwen35moe, glm4moe, deepseek2, gpt-oss).
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  int64_t n_ff_shexp = 0;  // qwen35moe: the shared expert

  // gemma3: local sliding-window layers between global ones. The files do not record
  // the pattern (every 6th layer global: llama.cpp and tessera assume it), only the
  // window, the local layers' RoPE base and the global layers' linear RoPE scaling.
  // gpt-oss: sliding-window and full layers alternate (even layers windowed), also
  // unrecorded.
  int64_t sliding_window = 0;
  float rope_base_swa = 10000.f;
  float rope_scale_linear = 0.f;  // 0: no rope.scaling keys

  // glm4moe and deepseek2: the first n_dense_lead layers dense (n_ff wide), the others
  // MoE with n_expert_shared shared experts of n_ff_exp beside the routed ones; glm4moe's
  // last n_nextn blocks are NextN (multi-token prediction) layers, counted in n_layer
  // (block_count).
  int64_t n_expert_shared = 0, n_dense_lead = 0, n_nextn = 0;
  float expert_weights_scale = 1.f;  // routed_scaling_factor
  bool expert_weights_norm = true;   // norm_topk_prob
  // deepseek2: sigmoid routing picks the best n_expert_groups_used of n_expert_groups
  // groups first (n_group, topk_group).
  int64_t n_expert_groups = 1, n_expert_groups_used = 1;

  // deepseek2: multi-head latent attention in the split conversion llama.cpp writes
  // (attn_k_b / attn_v_b, one key/value head). head_dim is a query head, nope + rope
  // (qk_nope_head_dim + qk_rope_head_dim), rope_dims the roped part.
  int64_t q_lora_rank = 0;  // 0: attn_q straight from the embedding (no query latent)
  int64_t kv_lora_rank = 0;
  int64_t v_head_dim = 0;   // v_head_dim (value_length_mla)

  // YaRN RoPE scaling (deepseek2, gpt-oss): factor 0 for none.
  float yarn_factor = 0.f;
  int64_t yarn_orig_ctx = 0;   // original_max_position_embeddings
  float yarn_log_mul = 0.f;    // deepseek2: 0.1 x mscale_all_dim, as llama.cpp's converter writes it
  bool qk_norm = true;               // glm4moe's use_qk_norm (the qwen and gemma3 files always have them)

  // qwen35moe: gated delta-net layers, with a gated full-attention layer every
  // full_attention_interval-th layer ((il + 1) % interval == 0).
  int64_t rope_dims = 0;  // 0: head_dim (partial rotary below it)
  std::array<int32_t, 4> rope_sections{};
  int64_t full_attention_interval = 4;
  int64_t ssm_d_conv = 4;     // ssm.conv_kernel
  int64_t ssm_d_state = 0;    // ssm.state_size: head_k_dim (= head_v_dim)
  int64_t ssm_n_group = 0;    // ssm.group_count: key heads
  int64_t ssm_dt_rank = 0;    // ssm.time_step_rank: value heads

  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t rope_size() const { return rope_dims > 0 ? rope_dims : head_size(); }
  int64_t qk_nope() const { return head_size() - rope_size(); }  // deepseek2
  int64_t ssm_key_dim() const { return ssm_d_state * ssm_n_group; }
  int64_t ssm_value_dim() const { return ssm_d_state * ssm_dt_rank; }  // ssm.inner_size
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  bool is_recurrent(int64_t layer) const {
    return arch == Arch::Qwen35Moe && (layer + 1) % full_attention_interval != 0;
  }
  bool is_nextn(int64_t layer) const { return arch == Arch::Glm4Moe && layer >= n_layer - n_nextn; }
};

struct PresetInfo {
  std::string name;
  Arch arch;
  std::string source;          // where the shape comes from
  std::string type = "q8_0";   // --type when none is given (the published files' format)
};
// Every preset, in the order --help and the docs list them.
const std::vector<PresetInfo>& presets();
std::vector<std::string> preset_names();
ModelShape preset(const std::string& name);  // throws tessera::Error for an unknown name
const PresetInfo& preset_info(const std::string& name);  // throws tessera::Error for an unknown name

// Throws tessera::Error with the reason when the shape cannot describe a valid model.
void validate(const ModelShape& s);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  DType type;
  // How the values are drawn: Matrix uniform with std 1/sqrt(ne[0]) (fan-in), Embedding
  // std 1, Norm 1 +- a little, Bias std 0.5 (gpt-oss's attention sinks too), NegExp
  // -exp(uniform(-1, 1)) (ssm_a, the delta-net decay A = -exp(A_log), always negative),
  // SmallBias std 0.05 (the biases of glm4moe's and gpt-oss's projections, routers and
  // experts and the expert-score correction: a nudge, not a shift of the activations).
  enum class Init { Matrix, Embedding, Norm, Bias, NegExp, SmallBias } init;
  int64_t nelements_rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
};

// File types, in --help's order: f32 f16 bf16 (float); q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl
// q2_k q3_k_m q4_k_m q5_k_m iq4_xs (llama.cpp's per-tensor mixes of those ftypes);
// q3_k q4_k q5_k q6_k mxfp4 (one type apart from the output); mxfp4_moe (llama.cpp's
// MXFP4_MOE: expert tensors MXFP4, every other matrix Q8_0).
std::vector<std::string> file_type_names();
// The tensors of a model: llama in its historical order; the other architectures in
// llama.cpp's quantizer order (non-block tensors, then layer by layer, each by name).
std::vector<TensorSpec> model_tensors(const ModelShape& s, const std::string& file_type);
std::vector<TensorSpec> llama_tensors(const ModelShape& s, const std::string& file_type);
// GGUF general.file_type value for a file type name (llama_ftype).
uint32_t ggml_file_type(const std::string& file_type);
// The architecture's hyperparameter keys (<arch>.*), as llama.cpp names them.
void write_hparams(gguf::GgufWriter& w, const ModelShape& s);

}  // namespace tessera::gen
