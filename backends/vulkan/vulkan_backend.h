// vulkan: the Vulkan compute backend. See docs/vulkan.md for the design: our own
// run-time loader (vk_loader.h), embedded SPIR-V (shaders/*.comp), one command
// buffer per execute() with barriers only between dependent dispatches, weights
// uploaded once (cached by host pointer + fingerprint), activations mirrored through
// a per-run device arena (host tensors in, host tensors out), the paged F16 KV cache
// mirrored per (layer, sequence) for the positions a run touches.
#pragma once
#include <memory>

#include "tessera/backend.h"

namespace tessera::vk {

// Creates the backend on the best Vulkan device (throws tessera::Error when there is
// none; a CPU implementation only with allow_cpu).
std::unique_ptr<Backend> make_backend(bool allow_cpu);

}  // namespace tessera::vk
