// Plugin entry of the vulkan backend. probe() opens the Vulkan loader at run time
// (nothing links libvulkan), ranks the devices (discrete > integrated > virtual >
// CPU) and reports the chosen one, or why none can be used, in its reason.
#include <cstdio>
#include <exception>
#include <string>

#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"
#include "tessera/plugin_config.h"
#include "vk_context.h"
#include "vulkan_backend.h"

namespace {

// allow_cpu from the environment, or from [backend.vulkan] options of the plugins.toml
// that PluginConfig::discover() finds (probe() has no options of its own).
bool allow_cpu_default() {
  if (tessera::vk::env_allows_cpu()) return true;
  try {
    const tessera::PluginConfig cfg = tessera::PluginConfig::discover();
    if (const tessera::PluginSettings* s = cfg.settings("vulkan")) {
      auto it = s->options.find("allow_cpu");
      if (it != s->options.end()) return tessera::vk::truthy(it->second);
    }
  } catch (...) {
    // A broken plugins.toml is reported by the registry itself.
  }
  return false;
}

int32_t probe(char* reason, size_t reason_size) {
  try {
    const tessera::vk::ProbeResult r = tessera::vk::probe_devices(allow_cpu_default());
    if (reason && reason_size) std::snprintf(reason, reason_size, "%s", r.message.c_str());
    return r.score;
  } catch (const std::exception& e) {
    if (reason && reason_size) std::snprintf(reason, reason_size, "vulkan probe failed: %s", e.what());
  } catch (...) {
    if (reason && reason_size) std::snprintf(reason, reason_size, "vulkan probe failed");
  }
  return 0;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_backend("vulkan", args, error, error_size,
                                        [&](tessera::PoolRef pool, const TesseraCreateArgs* args)
                                            -> std::unique_ptr<tessera::Backend> {
      const char* option = tessera::glue::find_option(args, "allow_cpu");
      return tessera::vk::make_backend(option ? tessera::vk::truthy(option) : allow_cpu_default());
  });
}

const TesseraPluginDescriptor kDescriptor = tessera::glue::backend_descriptor(
    "vulkan", "Vulkan compute: embedded SPIR-V shaders, weights uploaded once, one submission per run of nodes", &probe,
    &create);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
