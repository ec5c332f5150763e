// The GGUF loader plugin: glue between the plugin ABI and the GGUF reader.
#include <cstdio>
#include <exception>

#include "gguf_reader.h"
#include "tessera/model_file.h"
#include "tessera/plugin_abi.h"

namespace {

class GgufLoader final : public tessera::ModelLoader {
 public:
  std::string name() const override { return "gguf"; }
  bool recognizes(const std::string& path) const override { return tessera::gguf::looks_like_gguf(path); }
  std::unique_ptr<tessera::ModelFile> open(const std::string& path) const override {
    return tessera::gguf::GgufFile::open(path);
  }
};

int32_t gguf_probe(char* reason, size_t reason_size) {
  if (reason && reason_size > 0) std::snprintf(reason, reason_size, "GGUF v2/v3 reader (always available)");
  return 100;
}

void* gguf_create(const TesseraCreateArgs* /*args*/, char* error, size_t error_size) {
  try {
    return static_cast<tessera::ModelLoader*>(new GgufLoader());
  } catch (const std::exception& e) {
    if (error && error_size > 0) std::snprintf(error, error_size, "%s", e.what());
    return nullptr;
  }
}

void gguf_destroy(void* instance) { delete static_cast<tessera::ModelLoader*>(instance); }

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION,
    sizeof(TesseraPluginDescriptor),
    "gguf",
    TESSERA_PLUGIN_LOADER,
    "GGUF v2/v3 model files (memory-mapped, fully validated)",
    &gguf_probe,
    &gguf_create,
    &gguf_destroy,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
