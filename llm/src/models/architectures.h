// Factories of the architectures this build supports (one file per architecture).
#pragma once
#include <memory>

#include "tessera/model.h"
#include "tessera/model_description.h"

namespace tessera::models {
std::unique_ptr<Model> make_llama(const ModelDescription& desc);
std::unique_ptr<Model> make_qwen2(const ModelDescription& desc);
std::unique_ptr<Model> make_qwen3(const ModelDescription& desc);
std::unique_ptr<Model> make_qwen3moe(const ModelDescription& desc);
std::unique_ptr<Model> make_qwen35moe(const ModelDescription& desc);
std::unique_ptr<Model> make_glm4moe(const ModelDescription& desc);
std::unique_ptr<Model> make_gemma3(const ModelDescription& desc);
std::unique_ptr<Model> make_gpt_oss(const ModelDescription& desc);
std::unique_ptr<Model> make_deepseek2(const ModelDescription& desc);
}
