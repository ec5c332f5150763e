// GGUF's names translated into tessera's (model_description.h). tessera's names were
// modelled on GGUF's, so the translation is short: the architecture is
// general.architecture, hyperparameter "<arch>.<key>" is tessera's "<key>", and tensor
// names are the same.
#include "gguf_reader.h"
#include "tessera/error.h"
#include "tessera/model_description.h"

namespace tessera::gguf {

ModelDescription GgufFile::describe() const {
  ModelDescription d;
  d.architecture = meta_.require_string("general.architecture");
  d.name = meta_.get_string("general.name").value_or("");
  const std::string prefix = d.architecture + ".";
  for (const auto& [key, value] : meta_.all()) {
    if (key.size() <= prefix.size() || key.compare(0, prefix.size(), prefix) != 0) continue;
    std::string ours = key.substr(prefix.size());
    d.origin.emplace(ours, key);
    d.hparams.set(std::move(ours), value);
  }
  d.tensors = tensors_;
  return d;
}

}  // namespace tessera::gguf
