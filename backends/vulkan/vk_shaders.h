// The SPIR-V modules compiled from shaders/*.comp at build time (glslangValidator)
// and embedded by embed_spirv.cmake into the generated vk_shaders_data.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera::vk {

struct ShaderBlob {
  const char* name;       // e.g. "matmul_q4_k" (see CMakeLists.txt)
  const uint32_t* code;   // SPIR-V words
  size_t bytes;
};
extern const ShaderBlob kShaders[];
extern const size_t kShaderCount;

}  // namespace tessera::vk
