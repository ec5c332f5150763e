// Factories of the architectures this build supports (one file per architecture).
#pragma once
#include <memory>

#include "tessera/model.h"

namespace tessera::models {
std::unique_ptr<Model> make_llama(const ModelFile& file);
std::unique_ptr<Model> make_qwen2(const ModelFile& file);
std::unique_ptr<Model> make_qwen3(const ModelFile& file);
std::unique_ptr<Model> make_qwen3moe(const ModelFile& file);
std::unique_ptr<Model> make_qwen35moe(const ModelFile& file);
}
