// Plugins that throw, crash or hang in their probe, or abort while loading, are
// refused with their reasons (tried in a child process first) while tessera goes on
// with the others; verdicts are remembered per version of the file.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/plugin_registry.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

const std::string kGood = TESSERA_TEST_PLUGIN_DIR;
const std::string kHostile = TESSERA_HOSTILE_PLUGIN_DIR;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-hostile-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

PluginConfig config(const std::string& paths) {
  return PluginConfig::from_string("[plugins]\npaths = [" + paths + "]\ndefault_paths = false\n", "/");
}

// One plugin folder, quoted by appending (GCC 12 misreads `"\"" + a temporary string` as
// an overlapping copy: a -Wrestrict false positive).
PluginConfig config_in(const fs::path& dir) { return config(std::string("\"").append(dir.string()).append("\"")); }

const PluginRecord& by_file(const PluginRegistry& r, const std::string& filename) {
  for (const auto& rec : r.records())
    if (fs::path(rec.file).filename() == filename) return rec;
  throw std::runtime_error("no record for file " + filename);
}

// Each test gets its own verdict cache and a short probe timeout.
class HostilePlugins : public ::testing::Test {
 protected:
  TempDir cache;
  void SetUp() override {
    ::setenv("XDG_CACHE_HOME", cache.path.c_str(), 1);
    ::setenv("TESSERA_PROBE_TIMEOUT_MS", "1500", 1);
    ::unsetenv("TESSERA_PROBE_IN_PROCESS");
  }
};

}  // namespace

TEST_F(HostilePlugins, EachIsRefusedWithItsReasonAndTheGoodOnesStayUsable) {
  const auto t0 = std::chrono::steady_clock::now();
  PluginRegistry reg(config("\"" + kGood + "\", \"" + kHostile + "\""));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  EXPECT_EQ(by_file(reg, "test_hostile_throw.so").reason, "probe threw an exception: boom");
  EXPECT_EQ(by_file(reg, "test_hostile_crash.so").reason, "crashed with SIGSEGV during probe");
  EXPECT_EQ(by_file(reg, "test_hostile_hang.so").reason, "timed out after 1.5 s during probe");
  EXPECT_EQ(by_file(reg, "test_hostile_abort_on_load.so").reason,
            "crashed with SIGABRT while loading (static initializers or dependencies)");
  for (const char* f : {"test_hostile_throw.so", "test_hostile_crash.so", "test_hostile_hang.so",
                        "test_hostile_abort_on_load.so"})
    EXPECT_FALSE(by_file(reg, f).usable) << f;
  ASSERT_TRUE(reg.find("test_good") && reg.find("test_good")->usable);
  EXPECT_EQ(reg.ranked_backends().front(), "test_good");
  EXPECT_NE(reg.create_backend("test_good", nullptr), nullptr);
  // Only the hanging probe waits for its timeout.
  EXPECT_LT(secs, 10.0);
}

TEST_F(HostilePlugins, VerdictsAreRememberedUntilTheFileChanges) {
  TempDir dir;
  const fs::path copy = dir.path / "test_hostile_crash.so";
  fs::copy_file(fs::path(kHostile) / "test_hostile_crash.so", copy);
  {
    PluginRegistry reg(config_in(dir.path));
    EXPECT_EQ(by_file(reg, "test_hostile_crash.so").reason, "crashed with SIGSEGV during probe");
  }
  {
    PluginRegistry reg(config_in(dir.path));
    const std::string why = by_file(reg, "test_hostile_crash.so").reason;
    EXPECT_EQ(why.rfind("crashed with SIGSEGV during probe (remembered from an earlier run: ", 0), 0u) << why;
  }
  // A new version of the file (here: the good plugin under the same name) is tried again.
  fs::copy_file(fs::path(kGood) / "test_good.so", copy, fs::copy_options::overwrite_existing);
  PluginRegistry reg(config_in(dir.path));
  EXPECT_TRUE(by_file(reg, "test_hostile_crash.so").usable) << by_file(reg, "test_hostile_crash.so").reason;
}

TEST_F(HostilePlugins, AThrowingProbeIsARefusalEvenWithoutTheChildProcess) {
  ::setenv("TESSERA_PROBE_IN_PROCESS", "1", 1);
  TempDir dir;
  fs::copy_file(fs::path(kHostile) / "test_hostile_throw.so", dir.path / "test_hostile_throw.so");
  PluginRegistry reg(config_in(dir.path));
  EXPECT_EQ(by_file(reg, "test_hostile_throw.so").reason, "probe threw an exception: boom");
}

TEST_F(HostilePlugins, TesseraBackendsListsThemAndExitsZero) {
  const std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera";
  const std::string out = (cache.path / "out.txt").string();
  const std::string cmd = "TESSERA_PLUGIN_PATH='" + kHostile + "' '" + bin + "' backends > '" + out + "' 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("crashed with SIGSEGV during probe"), std::string::npos) << text;
  EXPECT_NE(text.find("probe threw an exception: boom"), std::string::npos) << text;
  EXPECT_NE(text.find("cpu_scalar"), std::string::npos) << text;
}

TEST_F(HostilePlugins, FoldersAndFilesOthersCanWriteAreNeverOpened) {
  TempDir dir;
  const fs::path so = dir.path / "test_good.so";
  fs::copy_file(fs::path(kGood) / "test_good.so", so);
  fs::permissions(dir.path, fs::perms(0755));
  fs::permissions(so, fs::perms(0644));
  {
    PluginRegistry reg(config_in(dir.path));
    EXPECT_TRUE(by_file(reg, "test_good.so").usable) << by_file(reg, "test_good.so").reason;
  }
  fs::permissions(so, fs::perms(0666));
  {
    PluginRegistry reg(config_in(dir.path));
    EXPECT_EQ(by_file(reg, "test_good.so").reason, "file " + so.string() + " is writable by other users (mode 0666)");
    EXPECT_FALSE(by_file(reg, "test_good.so").usable);
  }
  fs::permissions(so, fs::perms(0644));
  fs::permissions(dir.path, fs::perms(0777));
  PluginRegistry reg(config_in(dir.path));
  EXPECT_EQ(by_file(reg, "test_good.so").reason,
            "folder " + dir.path.string() + " is writable by other users (mode 0777)");
  fs::permissions(dir.path, fs::perms(0700));
}

TEST_F(HostilePlugins, APluginsTomlInTheCurrentFolderIsNotRead) {
  TempDir work, home;
  // A planted ./plugins.toml naming a folder of plugins, and the user's own file.
  std::ofstream(work.path / "plugins.toml") << "[plugins]\npaths = [\"planted\"]\n";
  fs::create_directories(home.path / "tessera");
  std::ofstream(home.path / "tessera" / "plugins.toml") << "[plugins]\npaths = [\"mine\"]\n";
  const fs::path before = fs::current_path();
  fs::current_path(work.path);
  ::unsetenv("TESSERA_PLUGINS_TOML");
  ::unsetenv("TESSERA_PLUGIN_PATH");
  ::setenv("XDG_CONFIG_HOME", home.path.c_str(), 1);
  const PluginConfig with_user = PluginConfig::discover();
  ::setenv("XDG_CONFIG_HOME", (home.path / "none").c_str(), 1);
  const PluginConfig without = PluginConfig::discover();
  fs::current_path(before);
  auto has = [](const PluginConfig& c, const std::string& tail) {
    for (const auto& p : c.paths)
      if (fs::path(p).filename() == tail) return true;
    return false;
  };
  EXPECT_FALSE(has(with_user, "planted"));
  EXPECT_TRUE(has(with_user, "mine"));
  EXPECT_FALSE(has(without, "planted"));
  EXPECT_FALSE(has(without, "mine"));
}
