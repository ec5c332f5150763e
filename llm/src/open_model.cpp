#include "tessera/open_model.h"

#include <filesystem>

#include "tessera/error.h"
#include "tessera/plugin_registry.h"

namespace tessera {

OpenedModel open_model_file(const PluginRegistry& registry, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(path + ": no such file or directory");
  auto loaders = registry.create_loaders();
  if (loaders.empty()) throw Error("no usable model loader plugin found (see `tessera backends`)");
  std::string tried;
  for (auto& loader : loaders) {
    if (loader->recognizes(path)) {
      OpenedModel m;
      m.loader = loader;
      m.file = loader->open(path);
      return m;
    }
    tried += (tried.empty() ? "" : ", ") + loader->name();
  }
  throw Error(path + ": not a model file any loader recognizes (tried: " + tried + ")");
}

}  // namespace tessera
