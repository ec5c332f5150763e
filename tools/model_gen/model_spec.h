// What tessera-gen writes: an architecture's hyperparameters (presets or flags),
// the tensor list with shapes, and the weight dtype of each tensor for a file type
// (q4_k_m mixes types per tensor the way llama.cpp's quantizer does).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::gen {

struct LlamaShape {
  std::string name = "synthetic-llama";
  int64_t n_layer = 4, n_embd = 256, n_head = 4, n_head_kv = 2, n_ff = 768;
  int64_t n_vocab = 0;  // 0: the vocabulary's size
  int64_t context_length = 2048;
  float rope_base = 10000.f, rms_eps = 1e-5f;
  bool tied_output = false;  // no output.weight: the embedding is reused
};

// Named shapes: "default" (the bundled model), "tinyllama-1.1b", "llama-7b-ish"...
std::vector<std::string> preset_names();
LlamaShape preset(const std::string& name);  // throws tessera::Error for an unknown name

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  DType type;
  enum class Init { Matrix, Embedding, Norm } init;
  int64_t nelements_rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
};

// File types: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m.
std::vector<std::string> file_type_names();
std::vector<TensorSpec> llama_tensors(const LlamaShape& s, const std::string& file_type);
// GGUF general.file_type value for a file type name (llama_ftype).
uint32_t ggml_file_type(const std::string& file_type);

}  // namespace tessera::gen
