// A Hugging Face checkpoint folder (config.json, safetensors weights, tokenizer.json)
// presented as a ModelFile: metadata() shows config.json's values as "hf.<key>" and
// the tokenizer as tessera's tokenizer.* keys; tensors() lists the weights under
// their own names; describe() translates both into tessera's names.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "safetensors_reader.h"
#include "tessera/model_description.h"
#include "tessera/model_file.h"

namespace tessera::hf {

class CheckpointFile final : public ModelFile {
 public:
  // Opens the folder `path` names (or the folder of a config.json path); throws
  // tessera::Error with one line naming the file and the problem.
  static std::unique_ptr<CheckpointFile> open(const std::string& path);
  ~CheckpointFile() override;

  std::string format() const override { return "safetensors"; }
  std::string path() const override { return folder_; }
  const Metadata& metadata() const override { return meta_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  ModelDescription describe() const override;

 private:
  CheckpointFile() = default;
  ModelDescription translate() const;
  // A buffer this file owns (64-byte aligned, freed with the file) for tensors that are
  // not the file's bytes as they are: expert batches, RoPE factors, misaligned data.
  void* own(size_t bytes) const;

  std::string folder_;
  std::unique_ptr<safetensors::Checkpoint> ckpt_;
  Metadata meta_;
  nlohmann::json config_;
  std::vector<TensorInfo> tensors_;

  mutable std::mutex mu_;
  mutable std::optional<ModelDescription> desc_;  // built once, on first describe()
  mutable std::vector<void*> owned_;
};

}  // namespace tessera::hf
