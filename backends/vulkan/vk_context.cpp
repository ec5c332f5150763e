#include "vk_context.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <dlfcn.h>
#include <sstream>
#include <unistd.h>

#include "tessera/error.h"
#include "tessera/plugin_glue.h"
#include "tessera/plugin_abi.h"
#include "vk_shaders.h"

namespace tessera::vk {

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw Error(std::string("vulkan: ") + what + ": " + result_name(r));
}

bool truthy(const std::string& v) { return glue::option_flag(v).value_or(!v.empty()); }

bool env_allows_cpu() {
  const char* e = std::getenv("TESSERA_VULKAN_ALLOW_CPU");
  return e && truthy(e);
}

namespace {

const char* kind_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU implementation";
    default: return "other device";
  }
}

// Preference order of device types (higher is better); 0 = never chosen.
int kind_order(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
  }
}

// Probe scores (cpu_scalar 1, cpu_avx512 50): a discrete GPU beats the CPU backends,
// an integrated or virtual GPU ranks between AVX-512 and the scalar reference, and a
// CPU implementation (explicitly allowed) ranks last: it is always slower than the
// native CPU backends (use `rank` in plugins.toml to prefer it).
int kind_score(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return TESSERA_SCORE_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return TESSERA_SCORE_GPU_SHARED;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return TESSERA_SCORE_GPU_SHARED / 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return TESSERA_SCORE_FALLBACK;
    default: return 0;
  }
}

const char* kind_why(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "a discrete GPU ranks above the CPU backends";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "an integrated GPU ranks below cpu_avx512 and above cpu_scalar (shared memory bandwidth)";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "a virtual GPU ranks below cpu_avx512 and above cpu_scalar";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "a CPU Vulkan implementation, allowed explicitly, ranks last (slower than the native CPU backends)";
    default: return "";
  }
}

std::string version_str(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

struct Candidate {
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props{};
  uint32_t queue_family = 0;
};

// Creates an instance (Vulkan 1.1) with the global functions loaded; throws on failure.
VkInstance make_instance(Functions& f) {
  std::string why;
  if (!load_library(f, &why)) throw Error(why);
  uint32_t api = VK_API_VERSION_1_0;
  if (f.vkEnumerateInstanceVersion) f.vkEnumerateInstanceVersion(&api);
  if (api < VK_API_VERSION_1_1)
    throw Error("the Vulkan loader supports only Vulkan " + version_str(api) + " (1.1 needed)");
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "tessera";
  app.pEngineName = "tessera";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  VkInstance inst = VK_NULL_HANDLE;
  VkResult r = f.vkCreateInstance(&ci, nullptr, &inst);
  if (r != VK_SUCCESS) throw Error(std::string("vkCreateInstance failed: ") + result_name(r));
  if (!load_instance(f, inst, &why)) {
    auto destroy = reinterpret_cast<PFN_vkDestroyInstance>(f.vkGetInstanceProcAddr(inst, "vkDestroyInstance"));
    if (destroy) destroy(inst, nullptr);
    throw Error(why);
  }
  return inst;
}

// Every device with a compute queue and Vulkan 1.1, best first (type order, then the
// enumeration order).
std::vector<Candidate> candidates(const Functions& f, VkInstance inst) {
  uint32_t n = 0;
  f.vkEnumeratePhysicalDevices(inst, &n, nullptr);
  std::vector<VkPhysicalDevice> pds(n);
  if (n) f.vkEnumeratePhysicalDevices(inst, &n, pds.data());
  std::vector<Candidate> out;
  for (VkPhysicalDevice pd : pds) {
    Candidate c;
    c.pd = pd;
    f.vkGetPhysicalDeviceProperties(pd, &c.props);
    if (c.props.apiVersion < VK_API_VERSION_1_1 || kind_order(c.props.deviceType) == 0) continue;
    uint32_t nq = 0;
    f.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qs(nq);
    f.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qs.data());
    bool found = false;
    for (uint32_t i = 0; i < nq && !found; ++i)
      if (qs[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
        c.queue_family = i;
        found = true;
      }
    if (found) out.push_back(c);
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return kind_order(a.props.deviceType) > kind_order(b.props.deviceType);
  });
  return out;
}

std::string describe(const VkPhysicalDeviceProperties& p) {
  return std::string(p.deviceName) + " (" + kind_name(p.deviceType) + ", Vulkan " + version_str(p.apiVersion) + ")";
}

// The chosen device, or nullptr with *why when none may be used.
const Candidate* choose(const std::vector<Candidate>& cs, bool allow_cpu, std::string* why) {
  if (cs.empty()) {
    *why = "no Vulkan device with a compute queue and Vulkan 1.1";
    return nullptr;
  }
  for (const auto& c : cs)
    if (c.props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU || allow_cpu) return &c;
  *why = std::string("only a CPU Vulkan device (") + cs.front().props.deviceName +
         "); set TESSERA_VULKAN_ALLOW_CPU=1 (or options = { allow_cpu = true } under [backend.vulkan] in "
         "plugins.toml) to use it";
  return nullptr;
}

}  // namespace

namespace {

ProbeResult probe_uncached(bool allow_cpu) {
  ProbeResult res;
  Functions f;
  VkInstance inst = VK_NULL_HANDLE;
  try {
    inst = make_instance(f);
  } catch (const std::exception& e) {
    res.message = e.what();
    return res;
  }
  std::vector<Candidate> cs = candidates(f, inst);
  std::string why;
  if (const Candidate* c = choose(cs, allow_cpu, &why)) {
    res.score = kind_score(c->props.deviceType);
    res.message = describe(c->props) + ": " + kind_why(c->props.deviceType);
  } else {
    res.message = why;
  }
  f.vkDestroyInstance(inst, nullptr);
  return res;
}

std::string cache_dir();

// What the probe's answer depends on, from cheap stat() calls only: the allow flag, the
// loader's environment, the GPU device nodes, the driver manifests (name, size, mtime)
// and this plugin file. Creating a Vulkan instance loads every installed driver (Mesa's
// pull in LLVM): a cost every tessera process would pay in its plugin scan.
std::string probe_fingerprint(bool allow_cpu) {
  namespace fs = std::filesystem;
  std::string fp = std::string("tessera-vulkan-probe-1|cpu=") + (allow_cpu ? "1" : "0");
  for (const char* v : {"VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "VK_LOADER_DRIVERS_SELECT",
                        "VK_LOADER_DRIVERS_DISABLE", "TESSERA_VULKAN_LOADER", "XDG_DATA_DIRS", "XDG_CONFIG_DIRS",
                        "MESA_VK_DEVICE_SELECT", "LD_LIBRARY_PATH", "HOME"}) {
    const char* e = std::getenv(v);
    fp += std::string("|") + v + "=" + (e ? e : "");
  }
  auto add_file = [&](const fs::path& p) {
    std::error_code ec;
    const auto st = fs::status(p, ec);
    if (ec) return;
    const auto t = fs::last_write_time(p, ec);
    fp += "|" + p.string();
    if (fs::is_regular_file(st))
      fp += ":" + std::to_string(fs::file_size(p, ec)) + ":" + std::to_string(t.time_since_epoch().count());
  };
  auto add_dir = [&](const fs::path& d, const char* prefix) {
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec))
      if (!prefix || it->path().filename().string().rfind(prefix, 0) == 0) names.push_back(it->path().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) add_file(n);
  };
  add_dir("/dev/dri", nullptr);
  for (const char* p : {"nvidia", "dxg", "kgsl", "mali"}) add_dir("/dev", p);
  std::vector<std::string> data_dirs{"/usr/local/share", "/usr/share"};
  if (const char* x = std::getenv("XDG_DATA_DIRS"); x && *x) {
    data_dirs.clear();
    std::stringstream ss(x);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) data_dirs.push_back(d);
  }
  if (const char* h = std::getenv("HOME")) data_dirs.push_back(std::string(h) + "/.local/share");
  for (const auto& d : data_dirs) add_dir(fs::path(d) / "vulkan" / "icd.d", nullptr);
  add_dir("/etc/vulkan/icd.d", nullptr);
  for (const char* lib : {"/usr/lib/x86_64-linux-gnu/libvulkan.so.1", "/usr/lib/aarch64-linux-gnu/libvulkan.so.1",
                          "/usr/lib64/libvulkan.so.1", "/usr/lib/libvulkan.so.1", "/usr/local/lib/libvulkan.so.1"})
    add_file(lib);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&probe_uncached), &info) && info.dli_fname) add_file(info.dli_fname);
  return fp;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// The probe result is cached on disk ($XDG_CACHE_HOME/tessera/vulkan-probe-<hash>.txt)
// under the fingerprint above; TESSERA_VULKAN_PROBE_CACHE=0 turns the cache off.
ProbeResult probe_devices(bool allow_cpu) {
  const char* off = std::getenv("TESSERA_VULKAN_PROBE_CACHE");
  const std::string dir = cache_dir();
  if ((off && !truthy(off)) || dir.empty()) return probe_uncached(allow_cpu);
  const std::string fp = probe_fingerprint(allow_cpu);
  char name[64];
  std::snprintf(name, sizeof name, "vulkan-probe-%016llx.txt", static_cast<unsigned long long>(fnv1a(fp)));
  const std::filesystem::path path = std::filesystem::path(dir) / name;
  {
    std::ifstream in(path);
    std::string line_fp, line_score, line_msg;
    if (in && std::getline(in, line_fp) && std::getline(in, line_score) && std::getline(in, line_msg) && line_fp == fp) {
      ProbeResult r;
      try {
        r.score = std::stoi(line_score);
        r.message = line_msg;
        return r;
      } catch (...) {
      }
    }
  }
  ProbeResult r = probe_uncached(allow_cpu);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string tmp = path.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    std::string msg = r.message;
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    out << fp << "\n" << r.score << "\n" << msg << "\n";
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return r;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return r;
}

Context::Context(bool allow_cpu) {
  instance_ = make_instance(f_);
  try {
    std::vector<Candidate> cs = candidates(f_, instance_);
    std::string why;
    const Candidate* c = choose(cs, allow_cpu, &why);
    if (!c) throw Error(why);
    phys_ = c->pd;
    props_ = c->props;
    queue_family_ = c->queue_family;
    f_.vkGetPhysicalDeviceMemoryProperties(phys_, &mem_props_);

    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = queue_family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    check(f_.vkCreateDevice(phys_, &dci, nullptr, &device_), "vkCreateDevice");
    if (!load_device(f_, device_, &why)) throw Error(why);
    f_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = queue_family_;
    check(f_.vkCreateCommandPool(device_, &pci, nullptr, &cmd_pool_), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = cmd_pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(f_.vkAllocateCommandBuffers(device_, &cai, &cmd_), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(f_.vkCreateFence(device_, &fci, nullptr, &fence_), "vkCreateFence");

    VkDescriptorSetLayoutBinding b[kBindings]{};
    for (uint32_t i = 0; i < kBindings; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dl.bindingCount = kBindings;
    dl.pBindings = b;
    check(f_.vkCreateDescriptorSetLayout(device_, &dl, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");
    VkPushConstantRange pc{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
    VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pl.setLayoutCount = 1;
    pl.pSetLayouts = &set_layout_;
    pl.pushConstantRangeCount = 1;
    pl.pPushConstantRanges = &pc;
    check(f_.vkCreatePipelineLayout(device_, &pl, nullptr, &layout_), "vkCreatePipelineLayout");
    load_pipeline_cache();
  } catch (...) {
    release();
    throw;
  }
}

Context::~Context() { release(); }

void Context::release() {
  if (device_) {
    f_.vkDeviceWaitIdle(device_);
    save_pipeline_cache();
    for (auto& [n, p] : pipelines_) f_.vkDestroyPipeline(device_, p, nullptr);
    pipelines_.clear();
    if (cache_) f_.vkDestroyPipelineCache(device_, cache_, nullptr);
    if (layout_) f_.vkDestroyPipelineLayout(device_, layout_, nullptr);
    if (set_layout_) f_.vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
    if (fence_) f_.vkDestroyFence(device_, fence_, nullptr);
    if (cmd_pool_) f_.vkDestroyCommandPool(device_, cmd_pool_, nullptr);
    f_.vkDestroyDevice(device_, nullptr);
    device_ = VK_NULL_HANDLE;
    cache_ = VK_NULL_HANDLE;
    layout_ = VK_NULL_HANDLE;
    set_layout_ = VK_NULL_HANDLE;
    fence_ = VK_NULL_HANDLE;
    cmd_pool_ = VK_NULL_HANDLE;
  }
  if (instance_) {
    f_.vkDestroyInstance(instance_, nullptr);
    instance_ = VK_NULL_HANDLE;
  }
}

std::string Context::device_summary() const { return describe(props_); }

uint32_t Context::find_memory(uint32_t bits, VkMemoryPropertyFlags need, VkMemoryPropertyFlags want) const {
  uint32_t best = UINT32_MAX;
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    if (!(bits & (1u << i))) continue;
    const VkMemoryPropertyFlags fl = mem_props_.memoryTypes[i].propertyFlags;
    if ((fl & need) != need) continue;
    if ((fl & want) == want) return i;
    if (best == UINT32_MAX) best = i;
  }
  return best;
}

Buffer Context::create_buffer(VkDeviceSize size, VkBufferUsageFlags usage, VkMemoryPropertyFlags need,
                              VkMemoryPropertyFlags want, bool map) {
  Buffer b;
  b.size = std::max<VkDeviceSize>(size, 16);
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = b.size;
  bci.usage = usage;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(f_.vkCreateBuffer(device_, &bci, nullptr, &b.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  f_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  const uint32_t type = find_memory(req.memoryTypeBits, need, want);
  if (type == UINT32_MAX) {
    f_.vkDestroyBuffer(device_, b.buffer, nullptr);
    throw Error("vulkan: no memory type for a buffer of " + std::to_string(size) + " bytes");
  }
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  VkResult r = f_.vkAllocateMemory(device_, &mai, nullptr, &b.memory);
  if (r != VK_SUCCESS) {
    f_.vkDestroyBuffer(device_, b.buffer, nullptr);
    check(r, ("vkAllocateMemory of " + std::to_string(req.size) + " bytes").c_str());
  }
  check(f_.vkBindBufferMemory(device_, b.buffer, b.memory, 0), "vkBindBufferMemory");
  if (map) check(f_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
  return b;
}

Buffer Context::create_device_buffer(VkDeviceSize size) {
  return create_buffer(size,
                       VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                           VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                       0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false);
}

Buffer Context::create_host_buffer(VkDeviceSize size) {
  return create_buffer(size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                       VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                       VK_MEMORY_PROPERTY_HOST_CACHED_BIT, true);
}

void Context::destroy(Buffer& b) {
  if (b.mapped) f_.vkUnmapMemory(device_, b.memory);
  if (b.buffer) f_.vkDestroyBuffer(device_, b.buffer, nullptr);
  if (b.memory) f_.vkFreeMemory(device_, b.memory, nullptr);
  b = Buffer{};
}

VkPipeline Context::pipeline(const std::string& name) {
  if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second;
  const ShaderBlob* blob = nullptr;
  for (size_t i = 0; i < kShaderCount; ++i)
    if (name == kShaders[i].name) blob = &kShaders[i];
  if (!blob) throw Error("vulkan: no embedded shader '" + name + "'");
  VkShaderModuleCreateInfo smi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smi.codeSize = blob->bytes;
  smi.pCode = blob->code;
  VkShaderModule mod = VK_NULL_HANDLE;
  check(f_.vkCreateShaderModule(device_, &smi, nullptr, &mod), "vkCreateShaderModule");
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.layout = layout_;
  VkPipeline p = VK_NULL_HANDLE;
  VkResult r = f_.vkCreateComputePipelines(device_, cache_, 1, &ci, nullptr, &p);
  f_.vkDestroyShaderModule(device_, mod, nullptr);
  check(r, ("vkCreateComputePipelines(" + name + ")").c_str());
  pipelines_[name] = p;
  cache_dirty_ = true;
  return p;
}

VkCommandBuffer Context::begin() {
  check(f_.vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(f_.vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  return cmd_;
}

void Context::submit_and_wait() {
  check(f_.vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  check(f_.vkResetFences(device_, 1, &fence_), "vkResetFences");
  check(f_.vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
  check(f_.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
}

// ---------------------------------------------------------------------------
// Pipeline cache on disk: $XDG_CACHE_HOME/tessera/vulkan-pipeline-cache.bin (or
// ~/.cache/tessera/...). Read and write failures are warnings, never errors; the
// driver checks the header (vendor, device, cache UUID) and ignores foreign data.

namespace {
// $XDG_CACHE_HOME/tessera, else ~/.cache/tessera; "" when neither is known.
std::string cache_dir() {
  std::filesystem::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::filesystem::path(h) / ".cache";
  else
    return {};
  return (dir / "tessera").string();
}
std::string cache_file() {
  const std::string d = cache_dir();
  return d.empty() ? d : d + "/vulkan-pipeline-cache.bin";
}
}  // namespace

void Context::load_pipeline_cache() {
  cache_path_ = cache_file();
  std::vector<char> data;
  if (!cache_path_.empty()) {
    std::ifstream in(cache_path_, std::ios::binary);
    if (in) data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Hand the data to the driver only if its header names this device.
  if (data.size() >= 16 + VK_UUID_SIZE) {
    uint32_t hdr[4];
    std::memcpy(hdr, data.data(), sizeof hdr);
    if (hdr[1] != VK_PIPELINE_CACHE_HEADER_VERSION_ONE || hdr[2] != props_.vendorID || hdr[3] != props_.deviceID ||
        std::memcmp(data.data() + 16, props_.pipelineCacheUUID, VK_UUID_SIZE) != 0)
      data.clear();
  } else {
    data.clear();
  }
  VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  ci.initialDataSize = data.size();
  ci.pInitialData = data.empty() ? nullptr : data.data();
  if (f_.vkCreatePipelineCache(device_, &ci, nullptr, &cache_) != VK_SUCCESS) {
    ci.initialDataSize = 0;
    ci.pInitialData = nullptr;
    if (f_.vkCreatePipelineCache(device_, &ci, nullptr, &cache_) != VK_SUCCESS) {
      spdlog::warn("vulkan: cannot create a pipeline cache; pipelines are compiled every run");
      cache_ = VK_NULL_HANDLE;
    }
  }
}

void Context::save_pipeline_cache() {
  if (!cache_ || !cache_dirty_ || cache_path_.empty()) return;
  size_t n = 0;
  if (f_.vkGetPipelineCacheData(device_, cache_, &n, nullptr) != VK_SUCCESS || n == 0) return;
  std::vector<char> data(n);
  if (f_.vkGetPipelineCacheData(device_, cache_, &n, data.data()) != VK_SUCCESS) return;
  std::error_code ec;
  const std::filesystem::path p(cache_path_);
  std::filesystem::create_directories(p.parent_path(), ec);
  // Write to a private file, then rename: concurrent processes never see half a file.
  const std::string tmp = cache_path_ + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (out) out.write(data.data(), std::streamsize(n));
    if (!out) {
      spdlog::warn("vulkan: cannot write the pipeline cache {}", tmp);
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    spdlog::warn("vulkan: cannot write the pipeline cache {}: {}", cache_path_, ec.message());
    std::filesystem::remove(tmp, ec);
  }
}

}  // namespace tessera::vk
