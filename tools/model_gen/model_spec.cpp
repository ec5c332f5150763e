#include "model_spec.h"

#include <optional>

#include "tessera/error.h"

namespace tessera::gen {

std::vector<std::string> preset_names() { return {"default", "tiny", "tinyllama-1.1b", "llama2-7b"}; }

LlamaShape preset(const std::string& name) {
  LlamaShape s;
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
  } else {
    std::string all;
    for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "' (known: " + all + ")");
  }
  return s;
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
// divide the row fall back to Q8_0, then F16 (as llama.cpp's quantizer does).
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

}  // namespace

std::vector<TensorSpec> llama_tensors(const LlamaShape& s, const std::string& ft) {
  const DType base = base_type(ft);
  const bool quantized = dtype_traits(base).quantized;
  const bool k_mix = ft == "q4_k_m";
  const int64_t E = s.n_embd, F = s.n_ff, hd = s.n_embd / s.n_head;
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

}  // namespace tessera::gen
