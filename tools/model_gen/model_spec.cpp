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
  }
  return "?";
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
  };
  return all;
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
  } else {
    std::string all;
    for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "' (known: " + all + ")");
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
  if (s.arch == Arch::Llama) return;
  if (s.n_expert <= 0 || s.n_expert_used <= 0 || s.n_ff_exp <= 0)
    throw Error(std::string(arch_name(s.arch)) + ": experts, experts-used and expert-ff must be positive");
  if (s.n_expert_used > s.n_expert) throw Error("experts-used exceeds experts");
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

std::vector<std::string> file_type_names() {
  return {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m"};
}

uint32_t ggml_file_type(const std::string& ft) {
  // llama_ftype values (llama.h): ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q8_0 7, Q4_K_M 15,
  // Q5_K_M 17, Q6_K 18, BF16 32; single-type K files are reported as their _M variant.
  if (ft == "f32") return 0;
  if (ft == "f16") return 1;
  if (ft == "q4_0") return 2;
  if (ft == "q8_0") return 7;
  if (ft == "q4_k" || ft == "q4_k_m") return 15;
  if (ft == "q5_k") return 17;
  if (ft == "q6_k") return 18;
  if (ft == "bf16") return 32;
  throw Error("unknown --type '" + ft + "'");
}

namespace {

// The type for a matrix whose rows have n_in elements: types whose block does not
// divide the row fall back to Q8_0, then F16 (llama.cpp falls back to Q5_0/Q5_1 for
// Q4_K/Q5_K, which tessera does not read; Q8_0 for Q6_K, F16 last as here).
DType fit(DType want, int64_t n_in) {
  if (n_in % dtype_traits(want).block_elems == 0) return want;
  if (n_in % 32 == 0) return DType::Q8_0;
  return DType::F16;
}

DType base_type(const std::string& ft) {
  if (ft == "f32") return DType::F32;
  if (ft == "f16") return DType::F16;
  if (ft == "bf16") return DType::BF16;
  if (ft == "q8_0") return DType::Q8_0;
  if (ft == "q4_0") return DType::Q4_0;
  if (ft == "q4_k" || ft == "q4_k_m") return DType::Q4_K;
  if (ft == "q5_k") return DType::Q5_K;
  if (ft == "q6_k") return DType::Q6_K;
  std::string all;
  for (const auto& n : file_type_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error("unknown --type '" + ft + "' (known: " + all + ")");
}

// llama.cpp's Q4_K_M gives attn_v and ffn_down Q6_K in the first and last eighth of
// the layers and every third layer between.
bool use_more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The dtype of one tensor of a qwen model, following llama.cpp (convert_hf_to_gguf.py
// for the float files, llama-quant.cpp's llama_tensor_get_type for the quantized ones):
// vectors, norms, routers (ffn_gate_inp), ssm_conv1d and tensors not named *.weight
// (ssm_a, ssm_dt.bias) stay F32. q8_0 / q4_0 / q4_k_m apply llama.cpp's per-tensor
// rules; the single-type K files (q4_k, q5_k, q6_k) are "pure" apart from the output.
// `layer` is the tensor's block (-1 outside the blocks).
DType qwen_type(const std::string& ft, const std::string& name, const std::vector<int64_t>& ne, int64_t layer,
                const ModelShape& s) {
  const bool quantizable = ne.size() >= 2 && name.size() > 6 && name.compare(name.size() - 6, 6, "weight") == 0 &&
                           !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight") &&
                           !contains(name, "ssm_conv1d");
  if (!quantizable) return DType::F32;
  const DType base = base_type(ft);
  if (!dtype_traits(base).quantized) return base;
  const bool mix = ft == "q8_0" || ft == "q4_0" || ft == "q4_k_m";
  const bool k_m = ft == "q4_k_m";
  const bool eight_experts = s.n_expert == 8;  // llama.cpp's Mixtral rules test == 8
  DType t = base;
  if (name == "output.weight" || (s.tied_output && name == "token_embd.weight")) {
    if (ne[0] % dtype_traits(base).block_elems != 0) t = DType::Q8_0;
    else if (base != DType::Q8_0) t = DType::Q6_K;
  } else if (name == "token_embd.weight" || !mix) {
    t = base;
  } else if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) {
    // Every layer has exactly one of attn_v / attn_qkv, so llama.cpp's running
    // counter of these tensors is the layer index.
    if (k_m && use_more_bits(layer, s.n_layer)) t = DType::Q6_K;
    if (eight_experts) t = DType::Q8_0;
  } else if (contains(name, "attn_k.weight")) {
    if (eight_experts) t = DType::Q8_0;
  } else if (contains(name, "ffn_down")) {  // routed and shared experts alike
    if (k_m && use_more_bits(layer, s.n_layer)) t = DType::Q6_K;
  } else if (contains(name, "attn_output.weight")) {
    if (k_m && eight_experts) t = DType::Q5_K;
  }
  return fit(t, ne[0]);
}

std::vector<TensorSpec> qwen_tensors(const ModelShape& s, const std::string& ft) {
  using I = TensorSpec::Init;
  const int64_t E = s.n_embd, hd = s.head_size(), V = s.n_vocab, X = s.n_expert, FE = s.n_ff_exp;
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd;
  struct Raw {
    std::string name;
    std::vector<int64_t> ne;
    I init;
  };
  std::vector<TensorSpec> out;
  auto emit = [&](std::vector<Raw> group, int64_t layer) {
    std::sort(group.begin(), group.end(), [](const Raw& a, const Raw& b) { return a.name < b.name; });
    for (auto& r : group) out.push_back({r.name, r.ne, qwen_type(ft, r.name, r.ne, layer, s), r.init});
  };
  std::vector<Raw> top = {{"token_embd.weight", {E, V}, I::Embedding}, {"output_norm.weight", {E}, I::Norm}};
  if (!s.tied_output) top.push_back({"output.weight", {E, V}, I::Matrix});
  emit(top, -1);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<Raw> g = {
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
    emit(std::move(g), l);
  }
  return out;
}

}  // namespace

std::vector<TensorSpec> llama_tensors(const ModelShape& s, const std::string& ft) {
  const DType base = base_type(ft);
  const bool quantized = dtype_traits(base).quantized;
  const bool k_mix = ft == "q4_k_m";
  const int64_t E = s.n_embd, F = s.n_ff, hd = s.head_size();
  const int64_t Q = s.n_head * hd, KV = s.n_head_kv * hd, V = s.n_vocab;
  using I = TensorSpec::Init;
  std::vector<TensorSpec> t;
  // Quantized files keep the output matrix at Q6_K (llama.cpp's default), except Q8_0.
  DType out_type = quantized && base != DType::Q8_0 ? DType::Q6_K : base;
  t.push_back({"token_embd.weight", {E, V}, fit(base, E), I::Embedding});
  t.push_back({"output_norm.weight", {E}, DType::F32, I::Norm});
  if (!s.tied_output) t.push_back({"output.weight", {E, V}, fit(out_type, E), I::Matrix});
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    DType more = k_mix && use_more_bits(l, s.n_layer) ? DType::Q6_K : base;
    t.push_back({p + "attn_norm.weight", {E}, DType::F32, I::Norm});
    t.push_back({p + "attn_q.weight", {E, Q}, fit(base, E), I::Matrix});
    t.push_back({p + "attn_k.weight", {E, KV}, fit(base, E), I::Matrix});
    t.push_back({p + "attn_v.weight", {E, KV}, fit(more, E), I::Matrix});
    t.push_back({p + "attn_output.weight", {Q, E}, fit(base, Q), I::Matrix});
    t.push_back({p + "ffn_norm.weight", {E}, DType::F32, I::Norm});
    t.push_back({p + "ffn_gate.weight", {E, F}, fit(base, E), I::Matrix});
    t.push_back({p + "ffn_up.weight", {E, F}, fit(base, E), I::Matrix});
    t.push_back({p + "ffn_down.weight", {F, E}, fit(more, F), I::Matrix});
  }
  return t;
}

std::vector<TensorSpec> model_tensors(const ModelShape& s, const std::string& ft) {
  base_type(ft);  // rejects an unknown type
  return s.arch == Arch::Llama ? llama_tensors(s, ft) : qwen_tensors(s, ft);
}

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
  u32("attention.key_length", s.head_size());
  u32("attention.value_length", s.head_size());
  u32("rope.dimension_count", s.rope_size());
  if (s.arch == Arch::Qwen35Moe)
    w.set_i32_array(a + ".rope.dimension_sections", {s.rope_sections.begin(), s.rope_sections.end()});
  u32("expert_count", s.n_expert);
  u32("expert_used_count", s.n_expert_used);
  u32("expert_feed_forward_length", s.n_ff_exp);
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
