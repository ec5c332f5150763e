// Open a model file with the first loader plugin that recognizes it.
#pragma once
#include <memory>
#include <string>

#include "tessera/model_file.h"

namespace tessera {

class PluginRegistry;

struct OpenedModel {
  std::shared_ptr<ModelLoader> loader;  // declared first: outlives the file it mapped
  std::unique_ptr<ModelFile> file;
};

// Throws tessera::Error if the path is missing, no loader recognizes it, or the
// loader rejects it.
OpenedModel open_model_file(const PluginRegistry& registry, const std::string& path);

}  // namespace tessera
