// The Hugging Face checkpoint loader plugin: the checkpoint reader (hf_model.h) behind
// the C plugin ABI (the loader glue, tessera/plugin_glue.h, turns the ModelLoader into
// the C function table).
#include <cstdio>
#include <memory>

#include "hf_model.h"
#include "safetensors_reader.h"
#include "tessera/model_file.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"

namespace {

class SafetensorsLoader final : public tessera::ModelLoader {
 public:
  std::string name() const override { return "safetensors"; }
  bool recognizes(const std::string& path) const override {
    return tessera::safetensors::looks_like_checkpoint(path);
  }
  std::unique_ptr<tessera::ModelFile> open(const std::string& path) const override {
    return tessera::hf::CheckpointFile::open(path);
  }
};

int32_t safetensors_probe(char* reason, size_t reason_size) {
  if (reason && reason_size > 0)
    std::snprintf(reason, reason_size, "Hugging Face checkpoint folders: safetensors, config.json (always available)");
  return 100;
}

void* safetensors_create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_loader("safetensors", args, error, error_size, [](const TesseraCreateArgs*) {
    return std::make_unique<SafetensorsLoader>();
  });
}

const TesseraPluginDescriptor kDescriptor = tessera::glue::loader_descriptor(
    "safetensors", "Hugging Face checkpoint folders (config.json, safetensors shards, tokenizer.json)",
    &safetensors_probe, &safetensors_create);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
