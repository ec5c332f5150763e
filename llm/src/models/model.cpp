#include "tessera/model.h"

#include <unordered_set>

#include <spdlog/spdlog.h>

#include "models/architectures.h"
#include "models/model_loader_util.h"
#include "tessera/error.h"
#include "tessera/model_description.h"
#include "tessera/model_file.h"

namespace tessera {
namespace {
struct Architecture {
  const char* name;
  std::unique_ptr<Model> (*make)(const ModelDescription&);
};
// tessera's architecture name -> factory.
constexpr Architecture kArchitectures[] = {
    {"llama", models::make_llama},
    {"qwen2", models::make_qwen2},
    {"qwen3", models::make_qwen3},
    {"qwen3moe", models::make_qwen3moe},
    {"qwen35moe", models::make_qwen35moe},
    {"glm4moe", models::make_glm4moe},
    {"gemma3", models::make_gemma3},
    {"gpt-oss", models::make_gpt_oss},
    {"deepseek2", models::make_deepseek2},
};
}  // namespace

KvCacheConfig Model::kv_config(int64_t n_ctx, int page_tokens) const {
  return models::paged_kv_config(info(), n_ctx, page_tokens);
}

std::vector<std::string> Model::supported_architectures() {
  std::vector<std::string> names;
  for (const auto& a : kArchitectures) names.emplace_back(a.name);
  return names;
}

std::unique_ptr<Model> Model::load(const ModelFile& file) {
  const ModelDescription desc = file.describe();
  const std::string& arch = desc.architecture;
  for (const auto& a : kArchitectures) {
    if (arch != a.name) continue;
    std::unique_ptr<Model> m = a.make(desc);
    // A tensor the architecture does not read is reported, never ignored silently: it
    // may be a feature this build lacks, or a sign of a wrong architecture.
    std::unordered_set<std::string_view> used;
    for (const Tensor* t : m->weights()) used.insert(t->name);
    const std::vector<std::string> skipped = m->skipped_tensors();
    for (const std::string& name : skipped) used.insert(name);
    if (!skipped.empty())
      spdlog::info("{}: {} tensor{} that {} recognises and leaves out of the forward pass", printable(file.path(), 200),
                   skipped.size(), skipped.size() == 1 ? "" : "s", arch);
    for (const TensorInfo& t : desc.tensors)
      if (!used.count(t.name)) m->unused_tensors_.push_back(desc.origin_of(t.name));
    if (const size_t n = m->unused_tensors_.size()) {
      std::string list;
      for (size_t i = 0; i < n && i < 8; ++i) list += (i ? ", " : "") + printable(m->unused_tensors_[i], 80);
      if (n > 8) list += ", ... (" + std::to_string(n - 8) + " more)";
      spdlog::warn("{}: {} tensor{} that {} does not use (ignored): {}", printable(file.path(), 200), n,
                   n == 1 ? "" : "s", arch, list);
    }
    return m;
  }
  std::string known;
  for (const auto& n : supported_architectures()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unsupported architecture '" + printable(arch, 80) + "' (this build supports: " + known + ")");
}

}  // namespace tessera
