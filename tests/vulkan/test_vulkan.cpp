// The vulkan plugin loads and explains itself everywhere: without a Vulkan loader, on a
// machine with only a CPU implementation (refused unless allowed), and with one.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <unistd.h>

namespace {

// Output of `tessera backends` run with the given environment assignments.
std::string backends(const std::string& env) {
  const std::string cmd = "env TESSERA_VULKAN_PROBE_CACHE=0 " + env + " " + std::string(TESSERA_BIN_DIR) +
                          "/tessera backends 2>&1";
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p.get())) > 0) out.append(buf.data(), n);
  return out;
}

// The vulkan row and the note or reason line under it.
std::string vulkan_entry(const std::string& out) {
  const size_t at = out.find("\nvulkan ");
  if (at == std::string::npos) return {};
  size_t end = out.find('\n', at + 1);
  end = out.find('\n', end + 1);
  return out.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}

bool usable(const std::string& entry) { return entry.find(" yes ") != std::string::npos; }

TEST(VulkanProbe, WithoutLoaderScoresZeroAndSaysWhy) {
  const std::string e = vulkan_entry(backends("TESSERA_VULKAN_ALLOW_CPU=1 TESSERA_VULKAN_LOADER=/nonexistent/libvulkan.so.1"));
  ASSERT_FALSE(e.empty()) << "the vulkan plugin must load without a Vulkan loader";
  EXPECT_FALSE(usable(e)) << e;
  EXPECT_NE(e.find("no Vulkan loader"), std::string::npos) << e;
}

TEST(VulkanProbe, CpuDeviceOnlyWhenAllowed) {
  const std::string refused = vulkan_entry(backends("TESSERA_VULKAN_ALLOW_CPU=0"));
  ASSERT_FALSE(refused.empty());
  // Usable without permission only on a real GPU, never on a CPU implementation.
  if (usable(refused)) {
    EXPECT_EQ(refused.find("CPU implementation"), std::string::npos) << refused;
  }
  const std::string allowed = vulkan_entry(backends("TESSERA_VULKAN_ALLOW_CPU=1"));
  if (refused.find("only a CPU Vulkan device") != std::string::npos) {
    EXPECT_NE(refused.find("TESSERA_VULKAN_ALLOW_CPU=1"), std::string::npos) << refused;
    EXPECT_TRUE(usable(allowed)) << allowed;
    EXPECT_NE(allowed.find("CPU implementation"), std::string::npos) << allowed;
    EXPECT_NE(allowed.find("ranks last"), std::string::npos) << allowed;
  }
  if (!usable(allowed)) GTEST_SKIP() << "no Vulkan device here: " << allowed;
}

TEST(VulkanProbe, AllowCpuFromPluginsToml) {
  const std::string refused = vulkan_entry(backends("TESSERA_VULKAN_ALLOW_CPU=0"));
  if (refused.find("only a CPU Vulkan device") == std::string::npos)
    GTEST_SKIP() << "needs a machine whose only Vulkan device is a CPU implementation";
  const std::string toml = testing::TempDir() + "/vulkan_allow_cpu_" + std::to_string(getpid()) + ".toml";
  std::ofstream(toml) << "[backend.vulkan]\noptions = { allow_cpu = true }\n";
  const std::string e = vulkan_entry(backends("TESSERA_VULKAN_ALLOW_CPU=0 TESSERA_PLUGINS_TOML=" + toml));
  EXPECT_TRUE(usable(e)) << e;
  std::remove(toml.c_str());
}

}  // namespace
