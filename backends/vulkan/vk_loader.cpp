#include "vk_loader.h"

#include <dlfcn.h>
#include <volk.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace tessera::vk {

namespace {
void* g_lib = nullptr;
std::string g_error;
std::once_flag g_once;
}  // namespace

bool load_library(Functions& f, std::string* why) {
  std::call_once(g_once, [] {
    // Never unloaded: the ICDs it loads may register process-wide state.
    // TESSERA_VULKAN_LOADER names another loader library (a custom install, or a
    // missing file to check the "no Vulkan" path).
    std::vector<std::string> names{"libvulkan.so.1", "libvulkan.so"};
    if (const char* e = std::getenv("TESSERA_VULKAN_LOADER"); e && *e) names = {e};
    for (const std::string& name : names) {
      g_lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (g_lib) break;
      const char* e = dlerror();
      if (g_error.empty()) g_error = e ? e : "dlopen failed";
    }
    if (!g_lib) return;
    auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(g_lib, "vkGetInstanceProcAddr"));
    if (!gipa) {
      g_error = "the library has no vkGetInstanceProcAddr";
      g_lib = nullptr;
      return;
    }
    volkInitializeCustom(gipa);  // volk's global entry points from now on
  });
  if (!g_lib) {
    if (why) *why = "no Vulkan loader (libvulkan.so.1 not usable: " + g_error + ")";
    return false;
  }
  f.vkGetInstanceProcAddr = ::vkGetInstanceProcAddr;
  f.vkCreateInstance = ::vkCreateInstance;
  // Vulkan 1.1+: absent on a 1.0 loader, which we then treat as 1.0.
  f.vkEnumerateInstanceVersion = ::vkEnumerateInstanceVersion;
  if (!f.vkCreateInstance) {
    if (why) *why = "the Vulkan loader has no vkCreateInstance";
    return false;
  }
  return true;
}

bool load_instance(Functions& f, VkInstance instance, std::string* why) {
  // volk keeps one instance's functions in its globals; the table keeps ours.
  volkLoadInstanceOnly(instance);
  bool ok = true;
#define TESSERA_VK_LOAD(name)                                        \
  f.name = ::name;                                                   \
  if (!f.name) {                                                     \
    ok = false;                                                      \
    if (why) *why = "Vulkan instance function " #name " is missing"; \
  }
  TESSERA_VK_INSTANCE_FUNCS(TESSERA_VK_LOAD)
#undef TESSERA_VK_LOAD
  return ok;
}

bool load_device(Functions& f, VkDevice device, std::string* why) {
  VolkDeviceTable t{};
  volkLoadDeviceTable(&t, device);
  bool ok = true;
#define TESSERA_VK_LOAD(name)                                      \
  f.name = t.name;                                                 \
  if (!f.name) {                                                   \
    ok = false;                                                    \
    if (why) *why = "Vulkan device function " #name " is missing"; \
  }
  TESSERA_VK_DEVICE_FUNCS(TESSERA_VK_LOAD)
#undef TESSERA_VK_LOAD
  return ok;
}

const char* result_name(VkResult r) {
  switch (r) {
#define C(x) case x: return #x;
    C(VK_SUCCESS) C(VK_NOT_READY) C(VK_TIMEOUT) C(VK_INCOMPLETE) C(VK_ERROR_OUT_OF_HOST_MEMORY)
    C(VK_ERROR_OUT_OF_DEVICE_MEMORY) C(VK_ERROR_INITIALIZATION_FAILED) C(VK_ERROR_DEVICE_LOST)
    C(VK_ERROR_MEMORY_MAP_FAILED) C(VK_ERROR_LAYER_NOT_PRESENT) C(VK_ERROR_EXTENSION_NOT_PRESENT)
    C(VK_ERROR_FEATURE_NOT_PRESENT) C(VK_ERROR_INCOMPATIBLE_DRIVER) C(VK_ERROR_TOO_MANY_OBJECTS)
    C(VK_ERROR_FORMAT_NOT_SUPPORTED) C(VK_ERROR_FRAGMENTED_POOL) C(VK_ERROR_OUT_OF_POOL_MEMORY)
    C(VK_ERROR_INVALID_SHADER_NV) C(VK_PIPELINE_COMPILE_REQUIRED)
#undef C
    default: return "VkResult (unknown)";
  }
}

}  // namespace tessera::vk
