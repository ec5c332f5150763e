#include "model_spec.h"

#include <algorithm>

#include "gguf_writer.h"
#include "tessera/error.h"

namespace tessera::gen {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen3Moe: return "qwen3moe";
    case Arch::Qwen35Moe: return "qwen35moe";
    case Arch::Gemma3: return "gemma3";
    case Arch::Glm4Moe: return "glm4moe";
    case Arch::Deepseek2: return "deepseek2";
    case Arch::GptOss: return "gpt-oss";
  }
  return "?";
}

bool is_moe(Arch a) {
  return a == Arch::Qwen3Moe || a == Arch::Qwen35Moe || a == Arch::Glm4Moe || a == Arch::Deepseek2 ||
         a == Arch::GptOss;
}

const std::vector<PresetInfo>& presets() {
  static const std::vector<PresetInfo> all = {
      {"default", Arch::Llama, "the bundled model: small enough to build in seconds and run anywhere"},
      {"tiny", Arch::Llama, "a 2-layer llama for tests"},
      {"tinyllama-1.1b", Arch::Llama, "TinyLlama-1.1B (22 layers, 2048 wide, GQA 32/4, ff 5632, vocab 32000)"},
      {"llama2-7b", Arch::Llama, "Llama-2-7B (32 layers, 4096 wide, 32 heads, ff 11008, vocab 32000)"},
      {"qwen3moe-tiny", Arch::Qwen3Moe, "the shape of the qwen3moe fixtures (../shared/fixtures/models/qwen3moe-*.gguf)"},
      {"qwen3-30b-a3b", Arch::Qwen3Moe,
       "Qwen/Qwen3-30B-A3B config.json: 48 layers, 2048 wide, GQA 32/4 x 128, 128 experts top-8 x 768, "
       "vocab 151936, rope 1e6, ctx 40960"},
      {"qwen35moe-tiny", Arch::Qwen35Moe, "the shape of the qwen35moe fixtures (../shared/fixtures/models/qwen35moe-*.gguf)"},
      {"qwen3.5-35b-a3b", Arch::Qwen35Moe,
       "Qwen/Qwen3.5-35B-A3B (transformers Qwen3_5MoeTextConfig defaults): 40 layers, full attention every 4th, "
       "2048 wide, GQA 16/2 x 256, rope 64 dims [11,11,10] base 1e7, delta-net 16 key / 32 value heads x 128, "
       "256 experts top-8 x 512 + shared 512, vocab 248320, ctx 262144"},
      {"qwen3.5-397b-a17b", Arch::Qwen35Moe,
       "Qwen/Qwen3.5-397B-A17B config.json (text_config): 60 layers, full attention every 4th, 4096 wide, "
       "GQA 32/2 x 256, rope 64 dims [11,11,10] base 1e7, delta-net 16 key / 64 value heads x 128, "
       "512 experts top-10 x 1024 + shared 1024, vocab 248320, ctx 262144 (--layers N for fewer)"},
      {"gemma3-tiny", Arch::Gemma3, "the shape of the gemma3 fixtures (../shared/fixtures/models/gemma3-*.gguf)"},
      {"gemma-3-27b", Arch::Gemma3,
       "google/gemma-3-27b-it config.json (text_config): 62 layers, every 6th global, 5376 wide, GQA 32/16 x 128, "
       "ff 21504, vocab 262208, sliding window 1024, rope 1e6 linear x8 (global) / 1e4 (local), ctx 131072, tied "
       "(--layers N for fewer)"},
      {"glm4moe-tiny", Arch::Glm4Moe, "the shape of the glm4moe fixtures (../shared/fixtures/models/glm4moe-*.gguf)"},
      {"glm-4.5-air", Arch::Glm4Moe,
       "zai-org/GLM-4.5-Air config.json: 46 layers + 1 NextN, 4096 wide, GQA 96/8 x 128, q/k/v biases, rope 64 "
       "dims base 1e6, 1 dense layer ff 10944, then 128 experts top-8 x 1408 + 1 shared, vocab 151552, "
       "ctx 131072 (--layers N for fewer)"},
      {"deepseek2-tiny", Arch::Deepseek2,
       "the shape of the deepseek2 fixtures (../shared/fixtures/models/deepseek2-*.gguf)"},
      {"deepseek-v3", Arch::Deepseek2,
       "deepseek-ai/DeepSeek-V3 config.json (also DeepSeek-R1): 61 layers (3 dense, ff 18432), 7168 wide, 128 heads, "
       "MLA q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128; 256 experts top-8 x 2048 in 8 groups (4 kept) + 1 "
       "shared, sigmoid x 2.5, vocab 129280, rope 1e4 YaRN x40 over 4096, ctx 163840; MTP layer left out "
       "(--layers N for fewer)"},
      {"kimi-k2", Arch::Deepseek2,
       "moonshotai/Kimi-K2-Instruct config.json: 61 layers (1 dense, ff 18432), 7168 wide, 64 heads, MLA q_lora "
       "1536, kv_lora 512, nope 128 + rope 64, v 128; 384 experts top-8 x 2048, 1 group, + 1 shared, sigmoid x "
       "2.827, vocab 163840, rope 5e4 YaRN x32 over 4096, ctx 131072 (--layers N for fewer)"},
      {"gpt-oss-tiny", Arch::GptOss, "the shape of the gpt-oss fixtures (../shared/fixtures/models/gpt-oss-*.gguf)",
       "mxfp4_moe"},
      {"gpt-oss-20b", Arch::GptOss,
       "openai/gpt-oss-20b config.json: 24 layers, sliding window 128 on every other, 2880 wide, GQA 64/8 x 64, "
       "sinks, biases, 32 experts top-4 x 2880, vocab 201088, rope 1.5e5 YaRN x32 over 4096, ctx 131072; MXFP4 "
       "experts (--type mxfp4_moe, the default here)",
       "mxfp4_moe"},
      {"gpt-oss-120b", Arch::GptOss,
       "openai/gpt-oss-120b config.json: as gpt-oss-20b with 36 layers and 128 experts; MXFP4 experts "
       "(--layers N for fewer)",
       "mxfp4_moe"},
  };
  return all;
}

const PresetInfo& preset_info(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  std::string all;
  for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error("unknown preset '" + name + "' (known: " + all + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const auto& p : presets()) n.push_back(p.name);
  return n;
}

ModelShape preset(const std::string& name) {
  ModelShape s;
  if (name == "default") {  // small enough to build in seconds and run anywhere
    s.name = "tessera-default (synthetic, random weights)";
    s.n_layer = 4, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 768;
  } else if (name == "tiny") {
    s.name = "synthetic-tiny";
    s.n_layer = 2, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512;
  } else if (name == "tinyllama-1.1b") {
    s.name = "synthetic-tinyllama-1.1b";
    s.n_layer = 22, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 4, s.n_ff = 5632, s.n_vocab = 32000;
  } else if (name == "llama2-7b") {
    s.name = "synthetic-llama2-7b";
    s.n_layer = 32, s.n_embd = 4096, s.n_head = 32, s.n_head_kv = 32, s.n_ff = 11008, s.n_vocab = 32000;
    s.context_length = 4096;
  } else if (name == "qwen3moe-tiny") {
    s.arch = Arch::Qwen3Moe;
    s.name = "synthetic-qwen3moe";
    s.n_layer = 2, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 256;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 256;
    s.n_vocab = 1024, s.context_length = 512, s.rope_base = 10000.f, s.rms_eps = 1e-6f;
  } else if (name == "qwen3-30b-a3b") {
    s.arch = Arch::Qwen3Moe;
    s.name = "synthetic-qwen3-30b-a3b";
    s.n_layer = 48, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 4, s.head_dim = 128, s.n_ff = 6144;
    s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768;
    s.n_vocab = 151936, s.context_length = 40960, s.rope_base = 1000000.f, s.rms_eps = 1e-6f;
  } else if (name == "qwen35moe-tiny") {
    s.arch = Arch::Qwen35Moe;
    s.name = "synthetic-qwen35moe";
    s.n_layer = 4, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 256;
    s.rope_dims = 16, s.rope_sections = {3, 3, 2, 0};
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 256, s.n_ff_shexp = 256;
    s.full_attention_interval = 4, s.ssm_d_conv = 4, s.ssm_d_state = 64, s.ssm_n_group = 2, s.ssm_dt_rank = 4;
    s.n_vocab = 1024, s.context_length = 512, s.rope_base = 10000.f, s.rms_eps = 1e-6f;
  } else if (name == "qwen3.5-35b-a3b") {
    s.arch = Arch::Qwen35Moe;
    s.name = "synthetic-qwen3.5-35b-a3b";
    s.n_layer = 40, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 2, s.head_dim = 256, s.n_ff = 512;
    s.rope_dims = 64, s.rope_sections = {11, 11, 10, 0};  // partial_rotary_factor 0.25, mrope_section
    s.n_expert = 256, s.n_expert_used = 8, s.n_ff_exp = 512, s.n_ff_shexp = 512;
    s.full_attention_interval = 4, s.ssm_d_conv = 4, s.ssm_d_state = 128, s.ssm_n_group = 16, s.ssm_dt_rank = 32;
    s.n_vocab = 248320, s.context_length = 262144, s.rope_base = 10000000.f, s.rms_eps = 1e-6f;
  } else if (name == "qwen3.5-397b-a17b") {
    // Qwen/Qwen3.5-397B-A17B, its Hugging Face config.json (text_config, model_type
    // qwen3_5_moe_text) as quoted by the model card's mlx-community text-only copy and by
    // code that reads the file (hidden_size 4096, num_hidden_layers 60,
    // full_attention_interval 4, num_attention_heads 32, num_key_value_heads 2, head_dim 256,
    // partial_rotary_factor 0.25, mrope_section [11, 11, 10], rope_theta 1e7,
    // linear_num_key_heads 16, linear_num_value_heads 64, linear_key_head_dim and
    // linear_value_head_dim 128, linear_conv_kernel_dim 4, num_experts 512,
    // num_experts_per_tok 10, moe_intermediate_size 1024, shared_expert_intermediate_size
    // 1024, vocab_size 248320, max_position_embeddings 262144, rms_norm_eps 1e-6, untied
    // embeddings). The multi-token-prediction head and the vision tower are left out, as for
    // qwen3.5-35b-a3b; n_ff (only the feed_forward_length key) is the expert size, as there.
    // 396.35 B parameters, 224 GiB at q4_k_m (--dry-run): --layers N writes fewer layers.
    s.arch = Arch::Qwen35Moe;
    s.name = "synthetic-qwen3.5-397b-a17b";
    s.n_layer = 60, s.n_embd = 4096, s.n_head = 32, s.n_head_kv = 2, s.head_dim = 256, s.n_ff = 1024;
    s.rope_dims = 64, s.rope_sections = {11, 11, 10, 0};
    s.n_expert = 512, s.n_expert_used = 10, s.n_ff_exp = 1024, s.n_ff_shexp = 1024;
    s.full_attention_interval = 4, s.ssm_d_conv = 4, s.ssm_d_state = 128, s.ssm_n_group = 16, s.ssm_dt_rank = 64;
    s.n_vocab = 248320, s.context_length = 262144, s.rope_base = 10000000.f, s.rms_eps = 1e-6f;
  } else if (name == "gemma3-tiny") {
    s.arch = Arch::Gemma3;
    s.name = "synthetic-gemma3";
    s.n_layer = 6, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 64, s.n_ff = 256;
    s.sliding_window = 8, s.rope_base_swa = 10000.f, s.rope_scale_linear = 8.f;
    s.n_vocab = 1024, s.context_length = 32768, s.rope_base = 1000000.f, s.rms_eps = 1e-6f;
    s.tied_output = true;
  } else if (name == "gemma-3-27b") {
    // google/gemma-3-27b-it, config.json's text_config (model_type gemma3_text):
    // hidden_size 5376, num_hidden_layers 62, num_attention_heads 32,
    // num_key_value_heads 16, head_dim 128, intermediate_size 21504, vocab_size 262208,
    // sliding_window 1024 (five local layers, then a global one), rope_theta 1e6 with
    // rope_scaling linear factor 8 (global layers), rope_local_base_freq 1e4,
    // rms_norm_eps 1e-6, max_position_embeddings 131072, tied embeddings.
    // query_pre_attn_scalar 168 (n_embd / n_head) has no GGUF key: readers infer it
    // from the 62 layers, so a --layers cut gets 1/sqrt(head_dim). The vision tower is
    // left out.
    s.arch = Arch::Gemma3;
    s.name = "synthetic-gemma-3-27b";
    s.n_layer = 62, s.n_embd = 5376, s.n_head = 32, s.n_head_kv = 16, s.head_dim = 128, s.n_ff = 21504;
    s.sliding_window = 1024, s.rope_base_swa = 10000.f, s.rope_scale_linear = 8.f;
    s.n_vocab = 262208, s.context_length = 131072, s.rope_base = 1000000.f, s.rms_eps = 1e-6f;
    s.tied_output = true;
  } else if (name == "glm4moe-tiny") {
    s.arch = Arch::Glm4Moe;
    s.name = "synthetic-glm4moe";
    s.n_layer = 4, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 256;
    s.rope_dims = 32;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 32, s.n_expert_shared = 1;
    s.n_dense_lead = 1, s.n_nextn = 1, s.expert_weights_scale = 2.5f, s.expert_weights_norm = true;
    s.qk_norm = true;
    s.n_vocab = 1024, s.context_length = 512, s.rope_base = 1000000.f, s.rms_eps = 1e-6f;
  } else if (name == "glm-4.5-air") {
    // zai-org/GLM-4.5-Air config.json (model_type glm4_moe): num_hidden_layers 46 and
    // num_nextn_predict_layers 1 (block_count 47: the NextN layer is the last block),
    // hidden_size 4096, num_attention_heads 96, num_key_value_heads 8, head_dim 128,
    // partial_rotary_factor 0.5, attention_bias true, use_qk_norm false,
    // intermediate_size 10944 (first_k_dense_replace 1 dense layer),
    // moe_intermediate_size 1408, n_routed_experts 128, num_experts_per_tok 8,
    // n_shared_experts 1, routed_scaling_factor 1.0, norm_topk_prob true, n_group and
    // topk_group 1, vocab_size 151552, rope_theta 1e6, max_position_embeddings 131072,
    // rms_norm_eps 1e-5, untied embeddings. --layers N keeps the NextN layer as the last.
    s.arch = Arch::Glm4Moe;
    s.name = "synthetic-glm-4.5-air";
    s.n_layer = 47, s.n_embd = 4096, s.n_head = 96, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 10944;
    s.rope_dims = 64;
    s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 1408, s.n_expert_shared = 1;
    s.n_dense_lead = 1, s.n_nextn = 1, s.expert_weights_scale = 1.f, s.expert_weights_norm = true;
    s.qk_norm = false;
    s.n_vocab = 151552, s.context_length = 131072, s.rope_base = 1000000.f, s.rms_eps = 1e-5f;
  } else if (name == "deepseek2-tiny") {
    s.arch = Arch::Deepseek2;
    s.name = "synthetic-deepseek2";
    s.n_layer = 3, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 48, s.rope_dims = 16, s.n_ff = 256;
    s.q_lora_rank = 96, s.kv_lora_rank = 64, s.v_head_dim = 32;
    s.n_expert = 16, s.n_expert_used = 4, s.n_ff_exp = 32, s.n_expert_shared = 1, s.n_dense_lead = 1;
    s.n_expert_groups = 4, s.n_expert_groups_used = 2, s.expert_weights_scale = 2.5f, s.expert_weights_norm = true;
    s.yarn_factor = 40.f, s.yarn_orig_ctx = 128, s.yarn_log_mul = 0.1f;
    s.n_vocab = 1024, s.context_length = 5120, s.rope_base = 10000.f, s.rms_eps = 1e-6f;
  } else if (name == "deepseek-v3") {
    // deepseek-ai/DeepSeek-V3 config.json (model_type deepseek_v3; DeepSeek-R1 has the
    // same): num_hidden_layers 61, first_k_dense_replace 3, hidden_size 7168,
    // intermediate_size 18432, num_attention_heads 128, q_lora_rank 1536, kv_lora_rank
    // 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, n_routed_experts
    // 256, num_experts_per_tok 8, moe_intermediate_size 2048, n_shared_experts 1, n_group
    // 8, topk_group 4, scoring_func sigmoid, routed_scaling_factor 2.5, norm_topk_prob
    // true, vocab_size 129280, rope_theta 10000, rope_scaling yarn factor 40 over
    // original_max_position_embeddings 4096 with mscale_all_dim 1.0,
    // max_position_embeddings 163840, rms_norm_eps 1e-6, untied embeddings. The
    // multi-token-prediction layer (num_nextn_predict_layers 1) is left out, as llama.cpp's
    // converter leaves it out. --layers N keeps the dense layers first.
    s.arch = Arch::Deepseek2;
    s.name = "synthetic-deepseek-v3";
    s.n_layer = 61, s.n_embd = 7168, s.n_head = 128, s.n_head_kv = 1, s.head_dim = 192, s.rope_dims = 64;
    s.n_ff = 18432, s.q_lora_rank = 1536, s.kv_lora_rank = 512, s.v_head_dim = 128;
    s.n_expert = 256, s.n_expert_used = 8, s.n_ff_exp = 2048, s.n_expert_shared = 1, s.n_dense_lead = 3;
    s.n_expert_groups = 8, s.n_expert_groups_used = 4, s.expert_weights_scale = 2.5f, s.expert_weights_norm = true;
    s.yarn_factor = 40.f, s.yarn_orig_ctx = 4096, s.yarn_log_mul = 0.1f;
    s.n_vocab = 129280, s.context_length = 163840, s.rope_base = 10000.f, s.rms_eps = 1e-6f;
  } else if (name == "kimi-k2") {
    // moonshotai/Kimi-K2-Instruct config.json (model_type kimi_k2, DeepseekV3ForCausalLM):
    // as DeepSeek-V3 but num_attention_heads 64, first_k_dense_replace 1,
    // n_routed_experts 384, n_group 1, topk_group 1, routed_scaling_factor 2.827,
    // vocab_size 163840, rope_theta 50000, rope_scaling yarn factor 32 over 4096 with
    // mscale_all_dim 1.0, max_position_embeddings 131072, no MTP layer. (Kimi-K2-Instruct-0905
    // has YaRN factor 64 and a 262144 context.)
    s = preset("deepseek-v3");
    s.name = "synthetic-kimi-k2";
    s.n_head = 64, s.n_dense_lead = 1, s.n_expert = 384;
    s.n_expert_groups = 1, s.n_expert_groups_used = 1, s.expert_weights_scale = 2.827f;
    s.yarn_factor = 32.f;
    s.n_vocab = 163840, s.context_length = 131072, s.rope_base = 50000.f;
  } else if (name == "gpt-oss-tiny") {
    s.arch = Arch::GptOss;
    s.name = "synthetic-gpt-oss";
    s.n_layer = 2, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 64;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 64, s.sliding_window = 8;
    s.yarn_factor = 32.f, s.yarn_orig_ctx = 256;
    s.n_vocab = 1024, s.context_length = 8192, s.rope_base = 150000.f, s.rms_eps = 1e-5f;
  } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {
    // openai/gpt-oss-20b and -120b config.json (model_type gpt_oss): num_hidden_layers 24
    // / 36, num_local_experts 32 / 128, otherwise alike: hidden_size 2880,
    // intermediate_size 2880, num_attention_heads 64, num_key_value_heads 8, head_dim 64,
    // attention_bias true, num_experts_per_tok 4, sliding_window 128 (layer_types
    // alternating sliding / full), rope_theta 150000, rope_scaling yarn factor 32 over
    // 4096, max_position_embeddings 131072, rms_norm_eps 1e-5, vocab_size 201088,
    // untied embeddings; the experts published in MXFP4 (quantization_config), hence the
    // presets' default --type mxfp4_moe (llama.cpp's MXFP4_MOE: Q8_0 elsewhere).
    const bool big = name == "gpt-oss-120b";
    s.arch = Arch::GptOss;
    s.name = big ? "synthetic-gpt-oss-120b" : "synthetic-gpt-oss-20b";
    s.n_layer = big ? 36 : 24, s.n_embd = 2880, s.n_head = 64, s.n_head_kv = 8, s.head_dim = 64, s.n_ff = 2880;
    s.n_expert = big ? 128 : 32, s.n_expert_used = 4, s.n_ff_exp = 2880, s.sliding_window = 128;
    s.yarn_factor = 32.f, s.yarn_orig_ctx = 4096;
    s.n_vocab = 201088, s.context_length = 131072, s.rope_base = 150000.f, s.rms_eps = 1e-5f;
  } else {
    preset_info(name);  // throws: unknown
  }
  return s;
}

void validate(const ModelShape& s) {
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.context_length <= 0 ||
      s.head_dim < 0 || s.rope_dims < 0)
    throw Error("every size must be positive");
  if (s.n_head % s.n_head_kv) throw Error("heads must be a multiple of kv-heads");
  if (s.head_dim == 0 && s.n_embd % s.n_head) throw Error("embd must be a multiple of heads");
  if (s.head_size() % 2 || s.rope_size() % 2 || s.rope_size() > s.head_size())
    throw Error("the head size and the rope dimensions must be even, rope no larger than the head");
  if (s.arch == Arch::Gemma3) {
    if (s.sliding_window <= 0 || !(s.rope_base_swa > 0.f) || !(s.rope_scale_linear >= 0.f))
      throw Error("gemma3: the sliding window and the local rope base must be positive");
    return;
  }
  if (!is_moe(s.arch)) return;
  if (s.n_expert <= 0 || s.n_expert_used <= 0 || s.n_ff_exp <= 0)
    throw Error(std::string(arch_name(s.arch)) + ": experts, experts-used and expert-ff must be positive");
  if (s.n_expert_used > s.n_expert) throw Error("experts-used exceeds experts");
  if (!(s.yarn_factor >= 0.f) || (s.yarn_factor > 0.f && s.yarn_orig_ctx <= 0))
    throw Error("the YaRN factor and original context must be positive");
  if (s.arch == Arch::GptOss) {
    if (s.sliding_window <= 0) throw Error("gpt-oss: the sliding window must be positive");
    return;
  }
  if (s.arch == Arch::Deepseek2) {
    // What tessera's and llama.cpp's deepseek2 loaders require of the split-MLA files.
    if (s.n_head_kv != 1)
      throw Error("deepseek2: the latent-attention files have one key/value head (--kv-heads 1)");
    if (s.q_lora_rank < 0 || s.kv_lora_rank <= 0 || s.v_head_dim <= 0)
      throw Error("deepseek2: the kv latent and the value head must be positive, the query latent >= 0");
    if (s.rope_dims <= 0 || s.qk_nope() <= 0)
      throw Error("deepseek2: the head size must exceed the rope dimensions (both parts positive)");
    if (s.n_dense_lead < 0 || s.n_dense_lead > s.n_layer)
      throw Error("deepseek2: the leading dense layers must be 0 .. layers");
    if (s.n_expert_shared < 0) throw Error("deepseek2: the shared expert count must not be negative");
    if (s.n_expert_groups < 1 || s.n_expert % s.n_expert_groups != 0)
      throw Error("deepseek2: " + std::to_string(s.n_expert_groups) + " expert groups do not divide " +
                  std::to_string(s.n_expert) + " experts (--expert-groups)");
    if (s.n_expert_groups_used < 1 || s.n_expert_groups_used > s.n_expert_groups)
      throw Error("deepseek2: the expert groups kept must be 1 .. expert groups (--expert-groups-used)");
    if (s.n_expert_groups_used * (s.n_expert / s.n_expert_groups) < s.n_expert_used)
      throw Error("deepseek2: " + std::to_string(s.n_expert_groups_used) + " of " +
                  std::to_string(s.n_expert_groups) + " expert groups hold fewer than the " +
                  std::to_string(s.n_expert_used) + " experts used (--expert-groups, --expert-groups-used)");
    return;
  }
  if (s.arch == Arch::Glm4Moe) {
    if (s.n_nextn < 0 || s.n_nextn >= s.n_layer)
      throw Error("glm4moe: " + std::to_string(s.n_layer) + " layers leave none beside the " +
                  std::to_string(s.n_nextn) + " NextN layer(s), which block_count counts (--layers)");
    if (s.n_dense_lead < 0 || s.n_dense_lead > s.n_layer - s.n_nextn)
      throw Error("glm4moe: more leading dense layers than layers");
    if (s.n_expert_shared < 0) throw Error("glm4moe: the shared expert count must not be negative");
    return;
  }
  if (s.arch != Arch::Qwen35Moe) return;
  if (s.n_ff_shexp <= 0 || s.full_attention_interval <= 0 || s.ssm_d_conv <= 0 || s.ssm_d_state <= 0 ||
      s.ssm_n_group <= 0 || s.ssm_dt_rank <= 0)
    throw Error("qwen35moe: shared-expert ff, the full-attention interval and the ssm sizes must be positive");
  if (s.ssm_dt_rank % s.ssm_n_group) throw Error("qwen35moe: value heads must be a multiple of key heads");
  int64_t pairs = 0;
  for (int32_t v : s.rope_sections) pairs += v;
  if (pairs != 0 && pairs != s.rope_size() / 2)
    throw Error("qwen35moe: the rope sections must add up to rope dimensions / 2");
}

namespace {

// How a file type picks each tensor's type: Float files keep every matrix in the base
// type; Pure files too, apart from output; LlamaCpp files follow llama.cpp's
// llama_tensor_get_type for that ftype; Mxfp4Moe is llama.cpp's MXFP4_MOE.
enum class Mix { Float, Pure, LlamaCpp, Mxfp4Moe };

struct FileTypeInfo {
  const char* name;
  DType base;
  uint32_t ftype;  // general.file_type (llama_ftype); single-type K files as their _M variant
  Mix mix;
};

const std::vector<FileTypeInfo>& file_types() {
  static const std::vector<FileTypeInfo> all = {
      {"f32", DType::F32, 0, Mix::Float},        {"f16", DType::F16, 1, Mix::Float},
      {"bf16", DType::BF16, 32, Mix::Float},     {"q8_0", DType::Q8_0, 7, Mix::LlamaCpp},
      {"q4_0", DType::Q4_0, 2, Mix::LlamaCpp},   {"q4_1", DType::Q4_1, 3, Mix::LlamaCpp},
      {"q5_0", DType::Q5_0, 8, Mix::LlamaCpp},   {"q5_1", DType::Q5_1, 9, Mix::LlamaCpp},
      {"iq4_nl", DType::IQ4_NL, 25, Mix::LlamaCpp},
      {"q2_k", DType::Q2_K, 10, Mix::LlamaCpp},  {"q3_k", DType::Q3_K, 12, Mix::Pure},
      {"q4_k", DType::Q4_K, 15, Mix::Pure},      {"q5_k", DType::Q5_K, 17, Mix::Pure},
      {"q6_k", DType::Q6_K, 18, Mix::Pure},      {"q3_k_m", DType::Q3_K, 12, Mix::LlamaCpp},
      {"q4_k_m", DType::Q4_K, 15, Mix::LlamaCpp}, {"q5_k_m", DType::Q5_K, 17, Mix::LlamaCpp},
      {"iq4_xs", DType::IQ4_XS, 30, Mix::LlamaCpp},
      {"mxfp4", DType::MXFP4, 38, Mix::Pure},    {"mxfp4_moe", DType::MXFP4, 38, Mix::Mxfp4Moe},
  };
  return all;
}

const FileTypeInfo& file_type(const std::string& ft) {
  for (const auto& f : file_types())
    if (ft == f.name) return f;
  std::string all;
  for (const auto& n : file_type_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error("unknown --type '" + ft + "' (known: " + all + ")");
}

}  // namespace

std::vector<std::string> file_type_names() {
  std::vector<std::string> n;
  for (const auto& f : file_types()) n.push_back(f.name);
  return n;
}

uint32_t ggml_file_type(const std::string& ft) { return file_type(ft).ftype; }

namespace {

// A row whose length the type's block does not divide falls back as llama.cpp's
// tensor_type_fallback does: IQ4_XS -> IQ4_NL, Q2_K / Q3_K -> Q4_0, Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0; F16 when that does not fit either (rows not a multiple
// of 32, where llama.cpp's quantizer gives up for the 32-element types).
DType fit(DType want, int64_t n_in) {
  if (n_in % dtype_traits(want).block_elems == 0) return want;
  DType r = DType::F16;
  switch (want) {
    case DType::IQ4_XS: r = DType::IQ4_NL; break;
    case DType::Q2_K:
    case DType::Q3_K: r = DType::Q4_0; break;
    case DType::Q4_K: r = DType::Q5_0; break;
    case DType::Q5_K: r = DType::Q5_1; break;
    case DType::Q6_K: r = DType::Q8_0; break;
    default: break;
  }
  return n_in % dtype_traits(r).block_elems == 0 ? r : DType::F16;
}

// llama.cpp's Q4_K_M / Q5_K_M give attn_v and ffn_down Q6_K in the first and last
// eighth of the layers and every third layer between.
bool use_more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// llama.cpp's tensor categories (tensor_get_category), tested in its order.
enum class Cat { Output, TokenEmbd, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Other };

Cat category(const std::string& name) {
  if (name == "output.weight") return Cat::Output;
  if (name == "token_embd.weight") return Cat::TokenEmbd;
  // attn_qkv (qwen35moe's delta-net input) counts as attn_v, as in llama.cpp.
  if (contains(name, "attn_qkv.weight") || contains(name, "attn_v.weight")) return Cat::AttnV;
  if (contains(name, "attn_k.weight")) return Cat::AttnK;
  if (contains(name, "attn_q.weight")) return Cat::AttnQ;
  if (contains(name, "attn_output.weight")) return Cat::AttnOutput;
  if (contains(name, "ffn_up")) return Cat::FfnUp;
  if (contains(name, "ffn_gate")) return Cat::FfnGate;
  if (contains(name, "ffn_down")) return Cat::FfnDown;
  return Cat::Other;
}

// llama.cpp's llama_tensor_get_type_impl for the mixed ftypes tessera-gen writes, for
// a tensor that is neither output nor token_embd. `layer` is the tensor's block:
// every layer has exactly one attn_v / attn_qkv and llama.cpp counts ffn_down by the
// block in its name for MoE models, so its running counters are the layer index. Not
// modelled: the 70B and Falcon rules, and imatrix-only rules.
DType llama_cpp_type(const std::string& ft, DType base, Cat c, int64_t layer, const ModelShape& s) {
  const bool eight_experts = s.n_expert == 8;  // llama.cpp's Mixtral rules test == 8
  const int64_t n_gqa = s.n_head / s.n_head_kv, L = s.n_layer;
  const bool iq4 = ft == "iq4_nl" || ft == "iq4_xs";
  DType t = base;
  switch (c) {
    case Cat::AttnV:
      if (ft == "q2_k") t = n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
      else if (ft == "q3_k_m") t = layer < 2 ? DType::Q5_K : DType::Q4_K;
      else if (iq4 && n_gqa >= 4) t = DType::Q5_K;
      else if ((ft == "q4_k_m" || ft == "q5_k_m") && use_more_bits(layer, L)) t = DType::Q6_K;
      if (eight_experts) t = DType::Q8_0;
      break;
    case Cat::AttnK:
      if (eight_experts) t = DType::Q8_0;
      break;
    case Cat::FfnDown:  // routed and shared experts alike
      if (ft == "q2_k") t = DType::Q3_K;
      else if (ft == "q3_k_m") t = layer < L / 16 ? DType::Q5_K : DType::Q4_K;
      else if (ft == "q4_k_m") t = use_more_bits(layer, L) ? DType::Q6_K : base;
      else if (iq4 && layer < L / 8) t = DType::Q5_K;
      else if (ft == "q5_k_m" && use_more_bits(layer, L)) t = DType::Q6_K;
      break;
    case Cat::AttnOutput:
      if (eight_experts) {
        if (ft == "q2_k" || ft == "q3_k_m" || ft == "q4_k_m" || iq4) t = DType::Q5_K;
      } else if (ft == "q2_k") {
        t = DType::Q3_K;
      } else if (ft == "q3_k_m") {
        t = DType::Q4_K;
      }
      break;
    default: break;
  }
  return t;
}

// The dtype of one tensor (`layer` is its block, -1 outside the blocks), as llama.cpp
// gives it: vectors, norms, routers (ffn_gate_inp), ssm_conv1d and tensors not named
// *.weight (ssm_a, ssm_dt.bias) stay F32 (convert_hf_to_gguf.py and llama-quant.cpp
// agree); output (and token_embd when it is the output) Q6_K, Q8_0 in q8_0 and the
// mxfp4 files and where the base block does not divide the row; then the file type's
// rules; then the fallback for rows the chosen block does not divide.
DType tensor_type(const std::string& ft_name, const std::string& name, const std::vector<int64_t>& ne, int64_t layer,
                  const ModelShape& s) {
  const bool quantizable = ne.size() >= 2 && name.size() > 6 && name.compare(name.size() - 6, 6, "weight") == 0 &&
                           !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight") &&
                           !contains(name, "ssm_conv1d");
  if (!quantizable) return DType::F32;
  const FileTypeInfo& ft = file_type(ft_name);
  const DType base = ft.base;
  if (ft.mix == Mix::Float) return base;
  const Cat c = category(name);
  DType t = base;
  if (c == Cat::Output || (s.tied_output && c == Cat::TokenEmbd)) {
    if (base == DType::MXFP4 || ne[0] % dtype_traits(base).block_elems != 0) t = DType::Q8_0;
    else if (base != DType::Q8_0) t = DType::Q6_K;
  } else if (ft.mix == Mix::Mxfp4Moe) {
    t = ne.size() >= 3 && ne[2] > 1 ? DType::MXFP4 : DType::Q8_0;  // experts MXFP4, the rest Q8_0
  } else if (ft.mix == Mix::LlamaCpp && c != Cat::TokenEmbd) {
    t = llama_cpp_type(ft_name, base, c, layer, s);
  }
  return fit(t, ne[0]);
}

// One tensor before its dtype is chosen.
struct RawTensor {
  std::string name;
  std::vector<int64_t> ne;
  TensorSpec::Init init;
};

// A qwen3moe / qwen35moe block.
std::vector<RawTensor> qwen_block(const ModelShape& s, int64_t l) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, hd = s.head_size(), X = s.n_expert, FE = s.n_ff_exp;
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  const std::string p = "blk." + std::to_string(l) + ".";
  std::vector<RawTensor> g = {
      {p + "attn_norm.weight", {E}, I::Norm},
      {p + "ffn_gate_inp.weight", {E, X}, I::Matrix},
      {p + "ffn_gate_exps.weight", {E, FE, X}, I::Matrix},
      {p + "ffn_up_exps.weight", {E, FE, X}, I::Matrix},
      {p + "ffn_down_exps.weight", {FE, E, X}, I::Matrix},
  };
  if (s.arch == Arch::Qwen3Moe) {
    g.push_back({p + "ffn_norm.weight", {E}, I::Norm});
  } else {
    const int64_t FS = s.n_ff_shexp;
    g.push_back({p + "post_attention_norm.weight", {E}, I::Norm});
    g.push_back({p + "ffn_gate_inp_shexp.weight", {E}, I::Matrix});
    g.push_back({p + "ffn_gate_shexp.weight", {E, FS}, I::Matrix});
    g.push_back({p + "ffn_up_shexp.weight", {E, FS}, I::Matrix});
    g.push_back({p + "ffn_down_shexp.weight", {FS, E}, I::Matrix});
  }
  if (s.is_recurrent(l)) {
    const int64_t KD = s.ssm_key_dim(), VD = s.ssm_value_dim(), NV = s.ssm_dt_rank;
    g.push_back({p + "attn_qkv.weight", {E, 2 * KD + VD}, I::Matrix});
    g.push_back({p + "attn_gate.weight", {E, VD}, I::Matrix});
    g.push_back({p + "ssm_conv1d.weight", {s.ssm_d_conv, s.ssm_conv_dim()}, I::Matrix});
    g.push_back({p + "ssm_dt.bias", {NV}, I::Bias});
    g.push_back({p + "ssm_a", {NV}, I::NegExp});
    g.push_back({p + "ssm_alpha.weight", {E, NV}, I::Matrix});
    g.push_back({p + "ssm_beta.weight", {E, NV}, I::Matrix});
    g.push_back({p + "ssm_norm.weight", {s.ssm_d_state}, I::Norm});
    g.push_back({p + "ssm_out.weight", {VD, E}, I::Matrix});
  } else {
    // qwen35moe's full-attention layers are gated: attn_q holds query and gate.
    const int64_t QO = s.arch == Arch::Qwen35Moe ? 2 * Q : Q;
    g.push_back({p + "attn_q.weight", {E, QO}, I::Matrix});
    g.push_back({p + "attn_k.weight", {E, KV}, I::Matrix});
    g.push_back({p + "attn_v.weight", {E, KV}, I::Matrix});
    g.push_back({p + "attn_output.weight", {Q, E}, I::Matrix});
    g.push_back({p + "attn_q_norm.weight", {hd}, I::Norm});
    g.push_back({p + "attn_k_norm.weight", {hd}, I::Norm});
  }
  return g;
}

// A gemma3 block: norms before and after both the attention and the feed-forward, q/k
// norms; local and global layers have the same tensors.
std::vector<RawTensor> gemma3_block(const ModelShape& s, int64_t l) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, F = s.n_ff, hd = s.head_size();
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  const std::string p = "blk." + std::to_string(l) + ".";
  return {
      {p + "attn_norm.weight", {E}, I::Norm},
      {p + "attn_q.weight", {E, Q}, I::Matrix},
      {p + "attn_k.weight", {E, KV}, I::Matrix},
      {p + "attn_v.weight", {E, KV}, I::Matrix},
      {p + "attn_q_norm.weight", {hd}, I::Norm},
      {p + "attn_k_norm.weight", {hd}, I::Norm},
      {p + "attn_output.weight", {Q, E}, I::Matrix},
      {p + "post_attention_norm.weight", {E}, I::Norm},
      {p + "ffn_norm.weight", {E}, I::Norm},
      {p + "ffn_gate.weight", {E, F}, I::Matrix},
      {p + "ffn_up.weight", {E, F}, I::Matrix},
      {p + "ffn_down.weight", {F, E}, I::Matrix},
      {p + "post_ffw_norm.weight", {E}, I::Norm},
  };
}

// A glm4moe block: attention with q/k/v biases (q/k norms when the model has them),
// post_attention_norm before the feed-forward (glm4moe has no ffn_norm), a dense
// feed-forward in the leading layers and experts with a sigmoid router, its correction
// bias and the shared experts in the others. A NextN layer is a full block plus the
// projection of [embedding; hidden state] and its three norms.
std::vector<RawTensor> glm4moe_block(const ModelShape& s, int64_t l) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, F = s.n_ff, hd = s.head_size(), X = s.n_expert, FE = s.n_ff_exp;
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  const std::string p = "blk." + std::to_string(l) + ".";
  std::vector<RawTensor> g = {
      {p + "attn_norm.weight", {E}, I::Norm},
      {p + "attn_q.weight", {E, Q}, I::Matrix},
      {p + "attn_q.bias", {Q}, I::SmallBias},
      {p + "attn_k.weight", {E, KV}, I::Matrix},
      {p + "attn_k.bias", {KV}, I::SmallBias},
      {p + "attn_v.weight", {E, KV}, I::Matrix},
      {p + "attn_v.bias", {KV}, I::SmallBias},
      {p + "attn_output.weight", {Q, E}, I::Matrix},
      {p + "post_attention_norm.weight", {E}, I::Norm},
  };
  if (s.qk_norm) {
    g.push_back({p + "attn_q_norm.weight", {hd}, I::Norm});
    g.push_back({p + "attn_k_norm.weight", {hd}, I::Norm});
  }
  if (l < s.n_dense_lead) {
    g.push_back({p + "ffn_gate.weight", {E, F}, I::Matrix});
    g.push_back({p + "ffn_up.weight", {E, F}, I::Matrix});
    g.push_back({p + "ffn_down.weight", {F, E}, I::Matrix});
  } else {
    g.push_back({p + "ffn_gate_inp.weight", {E, X}, I::Matrix});
    g.push_back({p + "exp_probs_b.bias", {X}, I::SmallBias});
    g.push_back({p + "ffn_gate_exps.weight", {E, FE, X}, I::Matrix});
    g.push_back({p + "ffn_up_exps.weight", {E, FE, X}, I::Matrix});
    g.push_back({p + "ffn_down_exps.weight", {FE, E, X}, I::Matrix});
    if (s.n_expert_shared > 0) {
      // The shared experts side by side, as one feed-forward (llama.cpp's layout).
      const int64_t FS = FE * s.n_expert_shared;
      g.push_back({p + "ffn_gate_shexp.weight", {E, FS}, I::Matrix});
      g.push_back({p + "ffn_up_shexp.weight", {E, FS}, I::Matrix});
      g.push_back({p + "ffn_down_shexp.weight", {FS, E}, I::Matrix});
    }
  }
  if (s.is_nextn(l)) {
    g.push_back({p + "nextn.eh_proj.weight", {2 * E, E}, I::Matrix});
    g.push_back({p + "nextn.enorm.weight", {E}, I::Norm});
    g.push_back({p + "nextn.hnorm.weight", {E}, I::Norm});
    g.push_back({p + "nextn.shared_head_norm.weight", {E}, I::Norm});
  }
  return g;
}

// A deepseek2 block in the split multi-head-latent-attention conversion: the query from
// its own latent (attn_q_a, normed, then attn_q_b) or straight from the embedding
// (attn_q, q_lora_rank 0); attn_kv_a_mqa makes the kv latent and the shared roped key
// part; attn_k_b carries each head's non-roped query into latent space, attn_v_b each
// head's attention result out of it (both 3-D, one matrix per head). The feed-forward is
// dense in the leading layers, then routed experts with a sigmoid router, its correction
// bias (exp_probs_b) and the shared experts side by side.
std::vector<RawTensor> deepseek2_block(const ModelShape& s, int64_t l) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, H = s.n_head, F = s.n_ff, X = s.n_expert, FE = s.n_ff_exp;
  const int64_t rope = s.rope_size(), nope = s.qk_nope(), kvl = s.kv_lora_rank, vh = s.v_head_dim;
  const int64_t Q = H * (nope + rope);
  const std::string p = "blk." + std::to_string(l) + ".";
  std::vector<RawTensor> g = {
      {p + "attn_norm.weight", {E}, I::Norm},
      {p + "attn_kv_a_mqa.weight", {E, kvl + rope}, I::Matrix},
      {p + "attn_kv_a_norm.weight", {kvl}, I::Norm},
      {p + "attn_k_b.weight", {nope, kvl, H}, I::Matrix},
      {p + "attn_v_b.weight", {kvl, vh, H}, I::Matrix},
      {p + "attn_output.weight", {H * vh, E}, I::Matrix},
      {p + "ffn_norm.weight", {E}, I::Norm},
  };
  if (s.q_lora_rank > 0) {
    g.push_back({p + "attn_q_a.weight", {E, s.q_lora_rank}, I::Matrix});
    g.push_back({p + "attn_q_a_norm.weight", {s.q_lora_rank}, I::Norm});
    g.push_back({p + "attn_q_b.weight", {s.q_lora_rank, Q}, I::Matrix});
  } else {
    g.push_back({p + "attn_q.weight", {E, Q}, I::Matrix});
  }
  if (l < s.n_dense_lead) {
    g.push_back({p + "ffn_gate.weight", {E, F}, I::Matrix});
    g.push_back({p + "ffn_up.weight", {E, F}, I::Matrix});
    g.push_back({p + "ffn_down.weight", {F, E}, I::Matrix});
    return g;
  }
  g.push_back({p + "ffn_gate_inp.weight", {E, X}, I::Matrix});
  g.push_back({p + "exp_probs_b.bias", {X}, I::SmallBias});
  g.push_back({p + "ffn_gate_exps.weight", {E, FE, X}, I::Matrix});
  g.push_back({p + "ffn_up_exps.weight", {E, FE, X}, I::Matrix});
  g.push_back({p + "ffn_down_exps.weight", {FE, E, X}, I::Matrix});
  if (s.n_expert_shared > 0) {
    const int64_t FS = FE * s.n_expert_shared;
    g.push_back({p + "ffn_gate_shexp.weight", {E, FS}, I::Matrix});
    g.push_back({p + "ffn_up_shexp.weight", {E, FS}, I::Matrix});
    g.push_back({p + "ffn_down_shexp.weight", {FS, E}, I::Matrix});
  }
  return g;
}

// A gpt-oss block: attention with biases on q/k/v/o and a learned sink logit per head,
// post_attention_norm before the feed-forward (no ffn_norm), experts with biases and a
// router with a bias. Sliding-window and full layers have the same tensors.
std::vector<RawTensor> gpt_oss_block(const ModelShape& s, int64_t l) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, hd = s.head_size(), X = s.n_expert, FE = s.n_ff_exp;
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  const std::string p = "blk." + std::to_string(l) + ".";
  return {
      {p + "attn_norm.weight", {E}, I::Norm},
      {p + "attn_q.weight", {E, Q}, I::Matrix},
      {p + "attn_q.bias", {Q}, I::SmallBias},
      {p + "attn_k.weight", {E, KV}, I::Matrix},
      {p + "attn_k.bias", {KV}, I::SmallBias},
      {p + "attn_v.weight", {E, KV}, I::Matrix},
      {p + "attn_v.bias", {KV}, I::SmallBias},
      {p + "attn_output.weight", {Q, E}, I::Matrix},
      {p + "attn_output.bias", {E}, I::SmallBias},
      {p + "attn_sinks.weight", {s.n_head}, I::Bias},
      {p + "post_attention_norm.weight", {E}, I::Norm},
      {p + "ffn_gate_inp.weight", {E, X}, I::Matrix},
      {p + "ffn_gate_inp.bias", {X}, I::SmallBias},
      {p + "ffn_gate_exps.weight", {E, FE, X}, I::Matrix},
      {p + "ffn_gate_exps.bias", {FE, X}, I::SmallBias},
      {p + "ffn_up_exps.weight", {E, FE, X}, I::Matrix},
      {p + "ffn_up_exps.bias", {FE, X}, I::SmallBias},
      {p + "ffn_down_exps.weight", {FE, E, X}, I::Matrix},
      {p + "ffn_down_exps.bias", {E, X}, I::SmallBias},
  };
}

// Every architecture but llama, in llama.cpp's quantizer order: the non-block tensors,
// then block by block, each group by name.
std::vector<TensorSpec> sorted_tensors(const ModelShape& s, const std::string& ft) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, V = s.n_vocab;
  std::vector<TensorSpec> out;
  auto emit = [&](std::vector<RawTensor> group, int64_t layer) {
    std::sort(group.begin(), group.end(), [](const RawTensor& a, const RawTensor& b) { return a.name < b.name; });
    for (auto& r : group) out.push_back({r.name, r.ne, tensor_type(ft, r.name, r.ne, layer, s), r.init});
  };
  // gemma3 scales the embeddings by sqrt(n_embd) and reuses them as the output: drawn
  // as a matrix (std 1/sqrt(n_embd)), both the scaled input and the logits are of
  // order one.
  const I embd_init = s.arch == Arch::Gemma3 ? I::Matrix : I::Embedding;
  std::vector<RawTensor> top = {{"token_embd.weight", {E, V}, embd_init}, {"output_norm.weight", {E}, I::Norm}};
  if (!s.tied_output) top.push_back({"output.weight", {E, V}, I::Matrix});
  emit(top, -1);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    switch (s.arch) {
      case Arch::Gemma3: emit(gemma3_block(s, l), l); break;
      case Arch::Glm4Moe: emit(glm4moe_block(s, l), l); break;
      case Arch::Deepseek2: emit(deepseek2_block(s, l), l); break;
      case Arch::GptOss: emit(gpt_oss_block(s, l), l); break;
      default: emit(qwen_block(s, l), l); break;
    }
  }
  return out;
}

}  // namespace

std::vector<TensorSpec> llama_tensors(const ModelShape& s, const std::string& ft) {
  const int64_t E = s.n_embd, F = s.n_ff, hd = s.head_size();
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd, V = s.n_vocab;
  using I = TensorSpec::Init;
  std::vector<TensorSpec> t;
  auto add = [&](std::string name, std::vector<int64_t> ne, I init, int64_t layer) {
    DType type = tensor_type(ft, name, ne, layer, s);
    t.push_back({std::move(name), std::move(ne), type, init});
  };
  add("token_embd.weight", {E, V}, I::Embedding, -1);
  add("output_norm.weight", {E}, I::Norm, -1);
  if (!s.tied_output) add("output.weight", {E, V}, I::Matrix, -1);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, I::Norm, l);
    add(p + "attn_q.weight", {E, Q}, I::Matrix, l);
    add(p + "attn_k.weight", {E, KV}, I::Matrix, l);
    add(p + "attn_v.weight", {E, KV}, I::Matrix, l);
    add(p + "attn_output.weight", {Q, E}, I::Matrix, l);
    add(p + "ffn_norm.weight", {E}, I::Norm, l);
    add(p + "ffn_gate.weight", {E, F}, I::Matrix, l);
    add(p + "ffn_up.weight", {E, F}, I::Matrix, l);
    add(p + "ffn_down.weight", {F, E}, I::Matrix, l);
  }
  return t;
}

std::vector<TensorSpec> model_tensors(const ModelShape& s, const std::string& ft) {
  file_type(ft);  // rejects an unknown type
  return s.arch == Arch::Llama ? llama_tensors(s, ft) : sorted_tensors(s, ft);
}

namespace {

void write_yarn(gguf::GgufWriter& w, const ModelShape& s) {
  if (s.yarn_factor <= 0.f) return;
  const std::string a = arch_name(s.arch);
  w.set_string(a + ".rope.scaling.type", "yarn");
  w.set_f32(a + ".rope.scaling.factor", s.yarn_factor);
  w.set_u32(a + ".rope.scaling.original_context_length", uint32_t(s.yarn_orig_ctx));
  if (s.yarn_log_mul > 0.f) w.set_f32(a + ".rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
}

// deepseek2's keys after the common ones, as llama.cpp's converter writes them for the
// latent-attention conversion: key_length / value_length are the cached row (latent +
// rope, latent), key_length_mla / value_length_mla a head's query-key and value sizes.
void write_deepseek2_hparams(gguf::GgufWriter& w, const ModelShape& s) {
  const std::string a = arch_name(s.arch);
  auto u32 = [&](const std::string& key, int64_t v) { w.set_u32(a + "." + key, uint32_t(v)); };
  u32("vocab_size", s.n_vocab);
  u32("leading_dense_block_count", s.n_dense_lead);
  if (s.q_lora_rank > 0) u32("attention.q_lora_rank", s.q_lora_rank);  // absent without a query latent
  u32("attention.kv_lora_rank", s.kv_lora_rank);
  u32("attention.key_length", s.kv_lora_rank + s.rope_size());
  u32("attention.value_length", s.kv_lora_rank);
  u32("attention.key_length_mla", s.head_size());
  u32("attention.value_length_mla", s.v_head_dim);
  u32("rope.dimension_count", s.rope_size());
  u32("expert_feed_forward_length", s.n_ff_exp);
  u32("expert_count", s.n_expert);
  u32("expert_used_count", s.n_expert_used);
  u32("expert_shared_count", s.n_expert_shared);
  w.set_f32(a + ".expert_weights_scale", s.expert_weights_scale);
  w.set_bool(a + ".expert_weights_norm", s.expert_weights_norm);
  u32("expert_gating_func", 2);  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
  u32("expert_group_count", s.n_expert_groups);
  u32("expert_group_used_count", s.n_expert_groups_used);
  write_yarn(w, s);
}

}  // namespace

void write_hparams(gguf::GgufWriter& w, const ModelShape& s) {
  const std::string a = arch_name(s.arch);
  auto u32 = [&](const std::string& key, int64_t v) { w.set_u32(a + "." + key, uint32_t(v)); };
  u32("context_length", s.context_length);
  u32("embedding_length", s.n_embd);
  u32("block_count", s.n_layer);
  u32("feed_forward_length", s.n_ff);
  u32("attention.head_count", s.n_head);
  u32("attention.head_count_kv", s.n_head_kv);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set_f32(a + ".rope.freq_base", s.rope_base);
  if (s.arch == Arch::Llama) {
    u32("rope.dimension_count", s.rope_size());
    u32("vocab_size", s.n_vocab);
    return;
  }
  if (s.arch == Arch::Deepseek2) {
    write_deepseek2_hparams(w, s);
    return;
  }
  u32("attention.key_length", s.head_size());
  u32("attention.value_length", s.head_size());
  if (s.arch == Arch::GptOss) {
    write_yarn(w, s);
    u32("attention.sliding_window", s.sliding_window);
    u32("expert_count", s.n_expert);
    u32("expert_used_count", s.n_expert_used);
    u32("expert_feed_forward_length", s.n_ff_exp);
    return;
  }
  if (s.arch == Arch::Gemma3) {  // rope on the whole head: no rope.dimension_count
    w.set_f32(a + ".rope.freq_base_swa", s.rope_base_swa);
    if (s.rope_scale_linear > 0.f) {
      w.set_string(a + ".rope.scaling.type", "linear");
      w.set_f32(a + ".rope.scaling.factor", s.rope_scale_linear);
    }
    u32("attention.sliding_window", s.sliding_window);
    return;
  }
  u32("rope.dimension_count", s.rope_size());
  if (s.arch == Arch::Qwen35Moe)
    w.set_i32_array(a + ".rope.dimension_sections", {s.rope_sections.begin(), s.rope_sections.end()});
  u32("expert_count", s.n_expert);
  u32("expert_used_count", s.n_expert_used);
  u32("expert_feed_forward_length", s.n_ff_exp);
  if (s.arch == Arch::Glm4Moe) {
    u32("expert_shared_count", s.n_expert_shared);
    u32("leading_dense_block_count", s.n_dense_lead);
    u32("expert_gating_func", 2);  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    w.set_f32(a + ".expert_weights_scale", s.expert_weights_scale);
    w.set_bool(a + ".expert_weights_norm", s.expert_weights_norm);
    // GLM-4.5 routes without expert groups (n_group and topk_group 1).
    u32("expert_group_count", 1);
    u32("expert_group_used_count", 1);
    u32("nextn_predict_layers", s.n_nextn);
    return;
  }
  if (s.arch != Arch::Qwen35Moe) return;
  u32("expert_shared_feed_forward_length", s.n_ff_shexp);
  u32("ssm.conv_kernel", s.ssm_d_conv);
  u32("ssm.state_size", s.ssm_d_state);
  u32("ssm.group_count", s.ssm_n_group);
  u32("ssm.time_step_rank", s.ssm_dt_rank);
  u32("ssm.inner_size", s.ssm_value_dim());
  u32("full_attention_interval", s.full_attention_interval);
}

}  // namespace tessera::gen
