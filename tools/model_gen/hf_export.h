// tessera-gen --format hf: the Hugging Face checkpoint of a generated model. config.json
// as transformers writes it for LlamaForCausalLM / Qwen3MoeForCausalLM, and the weights
// under transformers' names, each taken row by row from the GGUF tensor the same flags
// would write (same values, same dtype), so the folder and the GGUF file are one model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model_spec.h"
#include "safetensors_writer.h"

namespace tessera::gen::hf {

// One checkpoint tensor and where its rows come from.
struct HfTensor {
  safetensors::Entry entry;  // HF name, dtype, row-major shape [out, in] (or [n] for vectors)
  size_t spec = 0;           // index of the GGUF tensor (model_tensors()) holding the values
  int64_t row0 = 0;          // its first GGUF row (an expert's slice of an ffn_*_exps batch)
  int64_t rows = 1;          // rows of this tensor (1 for a vector)
  // > 0 for llama's q_proj / k_proj: rows in transformers' rotate-half order within heads
  // of this size, the inverse of llama.cpp's convert permutation.
  int64_t head_size = 0;

  // The GGUF row (of tensor `spec`) that holds row r of this tensor: GGUF row j of a head
  // of size d holds HF row j/2 + (j%2)*(d/2), so HF row h < d/2 is GGUF row 2h and
  // h >= d/2 is 2(h - d/2) + 1.
  int64_t gguf_row(int64_t r) const {
    if (head_size <= 0) return row0 + r;
    const int64_t d = head_size, head = r / d, h = r % d;
    return row0 + head * d + (h < d / 2 ? 2 * h : 2 * (h - d / 2) + 1);
  }
};

// Throws tessera::Error when the folder cannot hold the model: qwen35moe, gemma3,
// glm4moe, deepseek2 or gpt-oss (tessera has no Hugging Face loader for them) or a type
// other than f32, f16 and bf16.
void check_supported(const ModelShape& s, const std::string& file_type);

// The checkpoint's tensors, in transformers' state_dict order (embeddings, then each
// layer's attention, MLP and norms, then the final norm and lm_head), from `specs`
// (model_tensors(s, file_type)); every GGUF tensor is used.
std::vector<HfTensor> hf_tensors(const ModelShape& s, const std::vector<TensorSpec>& specs);

// config.json's text (torch_dtype from the file type).
std::string config_json(const ModelShape& s, const std::string& file_type);

// Names of the files a checkpoint folder of tessera-gen holds (config.json,
// model.safetensors, model-NNNNN-of-NNNNN.safetensors, model.safetensors.index.json).
bool is_checkpoint_file_name(const std::string& name);

}  // namespace tessera::gen::hf
