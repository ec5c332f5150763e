// Run-time Vulkan loading through volk (libvulkan-volk-dev, compiled into the plugin):
// we dlopen the loader library ourselves (so a missing one is reported with dlerror's
// words and TESSERA_VULKAN_LOADER can name another), hand its vkGetInstanceProcAddr to
// volk, and keep a table of the entry points this backend uses, filled from volk's
// instance functions and a per-device VolkDeviceTable. Nothing links against
// libvulkan, so the plugin loads where Vulkan is absent and its probe says so.
#pragma once
#include <string>

#include <vulkan/vulkan_core.h>

namespace tessera::vk {

#define TESSERA_VK_GLOBAL_FUNCS(X) \
  X(vkCreateInstance)              \
  X(vkEnumerateInstanceVersion)

#define TESSERA_VK_INSTANCE_FUNCS(X)           \
  X(vkDestroyInstance)                         \
  X(vkEnumeratePhysicalDevices)                \
  X(vkGetPhysicalDeviceProperties)             \
  X(vkGetPhysicalDeviceMemoryProperties)       \
  X(vkGetPhysicalDeviceQueueFamilyProperties)  \
  X(vkCreateDevice)                            \
  X(vkGetDeviceProcAddr)

#define TESSERA_VK_DEVICE_FUNCS(X)       \
  X(vkDestroyDevice)                     \
  X(vkGetDeviceQueue)                    \
  X(vkDeviceWaitIdle)                    \
  X(vkQueueSubmit)                       \
  X(vkAllocateMemory)                    \
  X(vkFreeMemory)                        \
  X(vkMapMemory)                         \
  X(vkUnmapMemory)                       \
  X(vkCreateBuffer)                      \
  X(vkDestroyBuffer)                     \
  X(vkGetBufferMemoryRequirements)       \
  X(vkBindBufferMemory)                  \
  X(vkCreateShaderModule)                \
  X(vkDestroyShaderModule)               \
  X(vkCreatePipelineCache)               \
  X(vkDestroyPipelineCache)              \
  X(vkGetPipelineCacheData)              \
  X(vkCreateComputePipelines)            \
  X(vkDestroyPipeline)                   \
  X(vkCreatePipelineLayout)              \
  X(vkDestroyPipelineLayout)             \
  X(vkCreateDescriptorSetLayout)         \
  X(vkDestroyDescriptorSetLayout)        \
  X(vkCreateDescriptorPool)              \
  X(vkDestroyDescriptorPool)             \
  X(vkResetDescriptorPool)               \
  X(vkAllocateDescriptorSets)            \
  X(vkUpdateDescriptorSets)              \
  X(vkCreateCommandPool)                 \
  X(vkDestroyCommandPool)                \
  X(vkAllocateCommandBuffers)            \
  X(vkBeginCommandBuffer)                \
  X(vkEndCommandBuffer)                  \
  X(vkResetCommandBuffer)                \
  X(vkCreateFence)                       \
  X(vkDestroyFence)                      \
  X(vkWaitForFences)                     \
  X(vkResetFences)                       \
  X(vkCmdBindPipeline)                   \
  X(vkCmdBindDescriptorSets)             \
  X(vkCmdPushConstants)                  \
  X(vkCmdDispatch)                       \
  X(vkCmdCopyBuffer)                     \
  X(vkCmdPipelineBarrier)

struct Functions {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define TESSERA_VK_DECLARE(name) PFN_##name name = nullptr;
  TESSERA_VK_GLOBAL_FUNCS(TESSERA_VK_DECLARE)
  TESSERA_VK_INSTANCE_FUNCS(TESSERA_VK_DECLARE)
  TESSERA_VK_DEVICE_FUNCS(TESSERA_VK_DECLARE)
#undef TESSERA_VK_DECLARE
};

// Opens libvulkan.so.1 (once per process; the library stays loaded) and fills the
// global entry points. Returns false with *why set when there is no usable loader.
bool load_library(Functions& f, std::string* why);
// Fills the instance-level entry points (after vkCreateInstance).
bool load_instance(Functions& f, VkInstance instance, std::string* why);
// Fills the device-level entry points (after vkCreateDevice).
bool load_device(Functions& f, VkDevice device, std::string* why);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" etc.
const char* result_name(VkResult r);

}  // namespace tessera::vk
