#include "tessera/model.h"

#include "models/architectures.h"
#include "tessera/error.h"
#include "tessera/model_file.h"

namespace tessera {
namespace {
struct Architecture {
  const char* name;
  std::unique_ptr<Model> (*make)(const ModelFile&);
};
// general.architecture -> factory.
constexpr Architecture kArchitectures[] = {
    {"llama", models::make_llama},
    {"qwen2", models::make_qwen2},
    {"qwen3", models::make_qwen3},
    {"qwen3moe", models::make_qwen3moe},
    {"qwen35moe", models::make_qwen35moe},
};
}  // namespace

std::vector<std::string> Model::supported_architectures() {
  std::vector<std::string> names;
  for (const auto& a : kArchitectures) names.emplace_back(a.name);
  return names;
}

std::unique_ptr<Model> Model::load(const ModelFile& file) {
  std::string arch = file.metadata().require_string("general.architecture");
  for (const auto& a : kArchitectures)
    if (arch == a.name) return a.make(file);
  std::string known;
  for (const auto& n : supported_architectures()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unsupported architecture '" + arch + "' (this build supports: " + known + ")");
}

}  // namespace tessera
