#include "hf_export.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "tessera/error.h"

namespace tessera::gen::hf {

namespace {

using ordered_json = nlohmann::ordered_json;

// The shortest decimal that reads back as the same float (1e-05, not the double
// 9.999999747378752e-06 a plain widening would print).
double shortest(float v) {
  char buf[32];
  for (int p = 6; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

const char* torch_dtype(const std::string& ft) {
  if (ft == "f32") return "float32";
  if (ft == "f16") return "float16";
  return "bfloat16";
}

}  // namespace

void check_supported(const ModelShape& s, const std::string& file_type) {
  if (s.arch != Arch::Llama && s.arch != Arch::Qwen3Moe)
    throw Error(std::string("--format hf: ") + arch_name(s.arch) +
                " is not supported (tessera has no Hugging Face loader for it; llama and qwen3moe presets only)");
  if (file_type != "f32" && file_type != "f16" && file_type != "bf16")
    throw Error("--format hf writes f32, f16 or bf16 weights (safetensors has no GGUF quantized types), not '" +
                file_type + "'");
}

std::vector<HfTensor> hf_tensors(const ModelShape& s, const std::vector<TensorSpec>& specs) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < specs.size(); ++i) by_name[specs[i].name] = i;
  std::vector<HfTensor> out;
  size_t used = 0;
  // Tensor `gguf` (rows row0 .. row0 + rows of it; all of it when rows is 0) as `name`.
  auto add = [&](const std::string& name, const std::string& gguf, int64_t head_size = 0, int64_t row0 = 0,
                 int64_t rows = 0) {
    auto it = by_name.find(gguf);
    if (it == by_name.end()) return;  // absent in this model (output with --tied, q/k norms in llama)
    const TensorSpec& t = specs[it->second];
    HfTensor h;
    h.spec = it->second;
    h.row0 = row0;
    h.rows = rows > 0 ? rows : t.nelements_rows();
    h.head_size = head_size;
    h.entry.name = name;
    h.entry.type = t.type;
    h.entry.shape = t.ne.size() == 1 ? std::vector<int64_t>{t.ne[0]} : std::vector<int64_t>{h.rows, t.ne[0]};
    if (rows == 0 && t.ne.size() > 2) throw Error("hf export: " + gguf + " has more than 2 dimensions");
    out.push_back(std::move(h));
    if (row0 + (rows > 0 ? rows : t.nelements_rows()) == t.nelements_rows()) ++used;  // its last part
  };
  const bool llama = s.arch == Arch::Llama;
  const int64_t hd = s.head_size();
  add("model.embed_tokens.weight", "token_embd.weight");
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    add(h + "self_attn.q_proj.weight", g + "attn_q.weight", llama ? hd : 0);
    add(h + "self_attn.k_proj.weight", g + "attn_k.weight", llama ? hd : 0);
    add(h + "self_attn.v_proj.weight", g + "attn_v.weight");
    add(h + "self_attn.o_proj.weight", g + "attn_output.weight");
    add(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight");
    add(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight");
    if (llama) {
      add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight");
      add(h + "mlp.up_proj.weight", g + "ffn_up.weight");
      add(h + "mlp.down_proj.weight", g + "ffn_down.weight");
    } else {
      add(h + "mlp.gate.weight", g + "ffn_gate_inp.weight");
      // ffn_*_exps is [in, out, experts] in ggml order: expert e is rows e*out .. (e+1)*out.
      for (int64_t e = 0; e < s.n_expert; ++e) {
        const std::string x = h + "mlp.experts." + std::to_string(e) + ".";
        for (const char* proj : {"gate", "up", "down"}) {
          const std::string gguf = g + "ffn_" + proj + "_exps.weight";
          auto it = by_name.find(gguf);
          if (it == by_name.end()) throw Error("hf export: " + gguf + " is missing");
          const int64_t per = specs[it->second].ne[1];
          add(x + proj + "_proj.weight", gguf, 0, e * per, per);
        }
      }
    }
    add(h + "input_layernorm.weight", g + "attn_norm.weight");
    add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight");
  }
  add("model.norm.weight", "output_norm.weight");
  add("lm_head.weight", "output.weight");
  // Every GGUF tensor has its place: a tensor the list above misses would be a model
  // that differs from the GGUF file of the same flags.
  if (used != specs.size())
    throw Error("hf export: " + std::to_string(specs.size() - used) + " GGUF tensors have no Hugging Face name");
  return out;
}

std::string config_json(const ModelShape& s, const std::string& file_type) {
  const bool moe = s.arch == Arch::Qwen3Moe;
  ordered_json j;
  j["architectures"] = {moe ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = moe ? "qwen3_moe" : "llama";
  j["hidden_size"] = s.n_embd;
  j["num_hidden_layers"] = s.n_layer;
  j["num_attention_heads"] = s.n_head;
  j["num_key_value_heads"] = s.n_head_kv;
  j["head_dim"] = s.head_size();
  j["intermediate_size"] = s.n_ff;
  if (moe) {
    j["num_experts"] = s.n_expert;
    j["num_experts_per_tok"] = s.n_expert_used;
    j["moe_intermediate_size"] = s.n_ff_exp;
    // tessera's qwen3moe: every layer sparse, the chosen experts' weights renormalized.
    j["norm_topk_prob"] = true;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = ordered_json::array();
    j["use_sliding_window"] = false;
  }
  j["rms_norm_eps"] = shortest(s.rms_eps);
  j["rope_theta"] = shortest(s.rope_base);
  j["max_position_embeddings"] = s.context_length;
  j["vocab_size"] = s.n_vocab;
  j["tie_word_embeddings"] = s.tied_output;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (!moe) j["mlp_bias"] = false;
  // The built-in vocabulary's <s> and </s>.
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  j["torch_dtype"] = torch_dtype(file_type);
  return j.dump(2) + "\n";
}

bool is_checkpoint_file_name(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
         std::regex_match(name, shard);
}

}  // namespace tessera::gen::hf
