// The GGUF loader plugin: the GGUF reader behind the C plugin ABI (the loader glue,
// tessera/plugin_glue.h, turns the ModelLoader into the C function table).
#include <cstdio>
#include <memory>

#include "gguf_reader.h"
#include "tessera/model_file.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"

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

void* gguf_create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_loader("gguf", args, error, error_size, [](const TesseraCreateArgs*) {
    return std::make_unique<GgufLoader>();
  });
}

const TesseraPluginDescriptor kDescriptor =
    tessera::glue::loader_descriptor("gguf", "GGUF v2/v3 model files (memory-mapped, fully validated)", &gguf_probe,
                                     &gguf_create);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
