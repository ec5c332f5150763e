// Vulkan instance, device choice and the objects every dispatch needs (queue, command
// buffer, descriptor layout, pipelines, pipeline cache on disk), plus buffers.
//
// Device choice: discrete GPU > integrated GPU > virtual GPU > CPU implementation
// (llvmpipe/lavapipe). A CPU implementation is used only when explicitly allowed
// (TESSERA_VULKAN_ALLOW_CPU=1, or `options = { allow_cpu = true }` in plugins.toml).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vk_loader.h"

namespace tessera::vk {

// What probe() found on this machine (no device is created).
struct ProbeResult {
  int score = 0;          // 0 = unusable
  std::string message;    // the device and why it ranks there, or why not usable
};
ProbeResult probe_devices(bool allow_cpu);

// TESSERA_VULKAN_ALLOW_CPU set to something other than "", "0", "false", "no", "off".
bool env_allows_cpu();
// A switch's value: anything but "", "0", "false", "no", "off" (any case) is on.
bool truthy(const std::string& v);

// A buffer with its own memory allocation.
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceSize size = 0;
  void* mapped = nullptr;  // host-visible buffers only
};

class Context {
 public:
  explicit Context(bool allow_cpu);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Functions& fn() const { return f_; }
  VkDevice device() const { return device_; }
  const VkPhysicalDeviceProperties& props() const { return props_; }
  std::string device_summary() const;

  // Device-local storage buffer (falls back to any memory type that fits).
  Buffer create_device_buffer(VkDeviceSize size);
  // Host-visible, coherent (cached when available) buffer, persistently mapped.
  Buffer create_host_buffer(VkDeviceSize size);
  void destroy(Buffer& b);

  // The compute pipeline of an embedded shader (created on first use).
  VkPipeline pipeline(const std::string& name);
  VkPipelineLayout pipeline_layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }

  // One command buffer: begin, record, submit_and_wait.
  VkCommandBuffer begin();
  void submit_and_wait();

  // Limits checked by supports()/execute().
  uint64_t max_storage_range() const { return props_.limits.maxStorageBufferRange; }

 private:
  uint32_t find_memory(uint32_t type_bits, VkMemoryPropertyFlags need, VkMemoryPropertyFlags want) const;
  Buffer create_buffer(VkDeviceSize size, VkBufferUsageFlags usage, VkMemoryPropertyFlags need,
                       VkMemoryPropertyFlags want, bool map);
  void release();
  void load_pipeline_cache();
  void save_pipeline_cache();

  Functions f_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties mem_props_{};
  uint32_t queue_family_ = 0;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string cache_path_;
  bool cache_dirty_ = false;
  std::map<std::string, VkPipeline> pipelines_;
};

// Throws tessera::Error("vulkan: <what>: <VkResult name>") unless r == VK_SUCCESS.
void check(VkResult r, const char* what);

constexpr uint32_t kPushConstantBytes = 128;
constexpr uint32_t kBindings = 4;  // 0: the run's arena, 1: a weight, 2 and 3: KV storage (else the arena again)

}  // namespace tessera::vk
