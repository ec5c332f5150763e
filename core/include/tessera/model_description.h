// The model as tessera's architectures read it, whatever file format it came from:
// tessera's architecture name, hyperparameters under tessera's keys and tensors under
// tessera's names (docs/model_names.md lists them). Each loader translates its
// format's names into these (ModelFile::describe); the architectures never see a
// format's own names.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/model_file.h"

namespace tessera {

struct ModelDescription {
  std::string architecture;  // "llama", "qwen2", "qwen3", "qwen3moe", "qwen35moe"
  std::string name;          // a display name; may be empty
  // Hyperparameters under tessera's keys ("block_count", "embedding_length",
  // "rope.freq_base", ...), typed as Metadata values.
  Metadata hparams;
  // Tensors under tessera's names ("token_embd.weight", "blk.N.attn_q.weight", ...),
  // in ggml order (ne[0] contiguous). Their data stays valid while the ModelFile that
  // described them lives.
  std::vector<TensorInfo> tensors;
  // What the file calls a hyperparameter key or tensor name, where that differs
  // (messages name what the user can find in their file).
  std::map<std::string, std::string, std::less<>> origin;

  // The file's name for a tessera key or tensor name.
  std::string origin_of(std::string_view tessera_name) const {
    auto it = origin.find(tessera_name);
    return it == origin.end() ? std::string(tessera_name) : it->second;
  }
};

}  // namespace tessera
