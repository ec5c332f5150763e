// plugins.toml parsing: keys, conversions, relative paths, errors with file:line:col.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/error.h"
#include "tessera/plugin_config.h"

namespace fs = std::filesystem;
using tessera::Error;
using tessera::PluginConfig;

namespace {

// The message of the tessera::Error thrown by parsing `text` ("" if none).
std::string parse_error(const std::string& text) {
  try {
    PluginConfig::from_string(text, "/base");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-plugcfg-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(PluginConfig, ParsesEveryKey) {
  auto cfg = PluginConfig::from_string(R"(
[plugins]
paths = ["rel/dir", "/abs/dir"]
disable = ["cpu_amx"]
default_paths = false

[backend.cpu_avx512]
rank = 50
options = { threads = 2, fast = true, mode = "x", scale = 0.5 }

[loader.gguf]
rank = 0
)",
                                       "/base");
  ASSERT_EQ(cfg.paths.size(), 2u);
  EXPECT_EQ(cfg.paths[0], "/base/rel/dir");
  EXPECT_EQ(cfg.paths[1], "/abs/dir");
  ASSERT_NE(cfg.settings("cpu_amx"), nullptr);
  EXPECT_FALSE(cfg.settings("cpu_amx")->enabled);
  const auto* s = cfg.settings("cpu_avx512");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->enabled);
  ASSERT_TRUE(s->rank.has_value());
  EXPECT_EQ(*s->rank, 50);
  EXPECT_EQ(s->options.at("threads"), "2");
  EXPECT_EQ(s->options.at("fast"), "true");
  EXPECT_EQ(s->options.at("mode"), "x");
  EXPECT_EQ(s->options.at("scale"), "0.5");
  ASSERT_NE(cfg.settings("gguf"), nullptr);
  EXPECT_EQ(cfg.settings("gguf")->rank, 0);
  EXPECT_EQ(cfg.settings("nothing"), nullptr);
}

TEST(PluginConfig, EmptyConfigUsesBuiltinFolders) {
  auto cfg = PluginConfig::from_string("", "/base");
  EXPECT_TRUE(cfg.plugins.empty());
  EXPECT_FALSE(cfg.paths.empty());  // at least <exe>/../lib/tessera/plugins
  auto none = PluginConfig::from_string("[plugins]\ndefault_paths = false\n", "/base");
  EXPECT_TRUE(none.paths.empty());
}

TEST(PluginConfig, EnabledFalseDisables) {
  auto cfg = PluginConfig::from_string("[backend.x]\nenabled = false\n", "/base");
  EXPECT_FALSE(cfg.settings("x")->enabled);
}

TEST(PluginConfig, SyntaxErrorNamesLineAndColumn) {
  std::string e = parse_error("[plugins]\npaths = [\"a\",\n");
  ASSERT_FALSE(e.empty());
  EXPECT_NE(e.find("plugins.toml"), std::string::npos) << e;
  EXPECT_NE(e.find(":2:"), std::string::npos) << e;  // the array runs off the end of line 2
  e = parse_error("[plugins\n");
  EXPECT_NE(e.find(":1:"), std::string::npos) << e;
}

TEST(PluginConfig, UnknownKeysAreErrors) {
  std::string e = parse_error("[plugins]\npath = [\"a\"]\n");
  EXPECT_NE(e.find("unknown key 'path' in [plugins]"), std::string::npos) << e;
  EXPECT_NE(e.find(":2:"), std::string::npos) << e;

  e = parse_error("[backend.cpu_scalar]\nrnak = 3\n");
  EXPECT_NE(e.find("unknown key 'rnak' in [backend.cpu_scalar]"), std::string::npos) << e;
  EXPECT_NE(e.find(":2:1"), std::string::npos) << e;

  e = parse_error("[backends.cpu_scalar]\nrank = 3\n");
  EXPECT_NE(e.find("unknown key 'backends'"), std::string::npos) << e;
  EXPECT_NE(e.find(":1:2"), std::string::npos) << e;

  e = parse_error("[plugins]\npaths = \"a\"\n");
  EXPECT_NE(e.find("array of strings"), std::string::npos) << e;
  e = parse_error("[plugins]\npaths = [1]\n");
  EXPECT_NE(e.find("only strings"), std::string::npos) << e;
}

TEST(PluginConfig, RankMustBeANonNegativeInteger) {
  std::string e = parse_error("[backend.a]\nrank = -1\n");
  EXPECT_NE(e.find("rank must be an integer between 0 and 1000000000"), std::string::npos) << e;
  EXPECT_NE(e.find(":2:"), std::string::npos) << e;
  e = parse_error("[backend.a]\nrank = \"high\"\n");
  EXPECT_NE(e.find("rank must be an integer between 0 and 1000000000"), std::string::npos) << e;
  e = parse_error("[backend.a]\nrank = 1.5\n");
  EXPECT_NE(e.find("rank must be an integer between 0 and 1000000000"), std::string::npos) << e;
}

TEST(PluginConfig, OptionValuesMustBeScalars) {
  std::string e = parse_error("[backend.a]\noptions = { list = [1, 2] }\n");
  EXPECT_NE(e.find("option 'list'"), std::string::npos) << e;
  e = parse_error("[backend.a]\noptions = 3\n");
  EXPECT_NE(e.find("options must be a table"), std::string::npos) << e;
}

TEST(PluginConfig, FromFileResolvesPathsNextToTheFile) {
  TempDir d;
  const fs::path file = d.path / "plugins.toml";
  std::ofstream(file) << "[plugins]\npaths = [\"lib/plugins\"]\ndefault_paths = false\n";
  auto cfg = PluginConfig::from_file(file.string());
  ASSERT_EQ(cfg.paths.size(), 1u);
  EXPECT_EQ(cfg.paths[0], (d.path / "lib/plugins").string());

  std::ofstream(file) << "[plugins]\n\ndisable = 3\n";
  try {
    PluginConfig::from_file(file.string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + ":3:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PluginConfig::from_file((d.path / "missing.toml").string()), Error);
}

TEST(PluginConfig, DefaultsPutEnvironmentFirst) {
  setenv("TESSERA_PLUGIN_PATH", "/env/one::/env/two", 1);
  auto cfg = PluginConfig::defaults();
  unsetenv("TESSERA_PLUGIN_PATH");
  ASSERT_GE(cfg.paths.size(), 3u);
  EXPECT_EQ(cfg.paths[0], "/env/one");
  EXPECT_EQ(cfg.paths[1], "/env/two");
  EXPECT_NE(cfg.paths.back().find("lib/tessera/plugins"), std::string::npos);
}

TEST(PluginConfig, DiscoverHonoursEnvironment) {
  TempDir d;
  const fs::path file = d.path / "custom.toml";
  std::ofstream(file) << "[plugins]\npaths = [\"p\"]\ndefault_paths = false\n[backend.z]\nrank = 7\n";
  setenv("TESSERA_PLUGINS_TOML", file.c_str(), 1);
  setenv("TESSERA_PLUGIN_PATH", "/env/first", 1);
  auto cfg = PluginConfig::discover();
  unsetenv("TESSERA_PLUGIN_PATH");
  ASSERT_EQ(cfg.paths.size(), 2u);
  EXPECT_EQ(cfg.paths[0], "/env/first");
  EXPECT_EQ(cfg.paths[1], (d.path / "p").string());
  EXPECT_EQ(cfg.settings("z")->rank, 7);

  setenv("TESSERA_PLUGINS_TOML", (d.path / "nope.toml").c_str(), 1);
  EXPECT_THROW(PluginConfig::discover(), Error);
  unsetenv("TESSERA_PLUGINS_TOML");
}

TEST(PluginConfig, RepositoryDefaultParses) {
  auto cfg = PluginConfig::from_file(TESSERA_SOURCE_DIR "/plugins.toml");
  EXPECT_FALSE(cfg.paths.empty());  // the built-in folders
  for (const auto& [name, s] : cfg.plugins) EXPECT_TRUE(s.enabled) << name;  // nothing disabled
}
