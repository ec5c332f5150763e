// Plugin registry against the test-only plugins in TESSERA_TEST_PLUGIN_DIR:
// ABI checks, probe results, ranking overrides, disabling, duplicates, dlopen
// failures, option passing and instance lifetime.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/plugin_registry.h"
#include "tessera/scheduler.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

const std::string kDir = TESSERA_TEST_PLUGIN_DIR;

PluginConfig config(const std::string& extra = "", const std::string& paths = "\"" + kDir + "\"") {
  return PluginConfig::from_string("[plugins]\npaths = [" + paths + "]\ndefault_paths = false\n" + extra, "/");
}

const PluginRecord& record(const PluginRegistry& r, const std::string& name) {
  const PluginRecord* rec = r.find(name);
  if (!rec) throw std::runtime_error("no record for " + name);
  return *rec;
}

// By file name, for plugins whose descriptor could not be trusted (no name).
const PluginRecord& by_file(const PluginRegistry& r, const std::string& filename) {
  for (const auto& rec : r.records())
    if (fs::path(rec.file).filename() == filename) return rec;
  throw std::runtime_error("no record for file " + filename);
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-plugreg-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(PluginRegistry, FindsAndClassifiesTestPlugins) {
  PluginRegistry reg(config());
  const auto& recs = reg.records();
  ASSERT_EQ(recs.size(), 5u);

  // Usable first, by rank.
  EXPECT_EQ(recs[0].name, "test_good");
  EXPECT_TRUE(recs[0].usable);
  EXPECT_EQ(recs[0].score, 5);
  EXPECT_EQ(recs[0].rank, 5);
  EXPECT_EQ(recs[0].kind, "backend");
  EXPECT_EQ(recs[0].description, "test-only: f32 add");
  EXPECT_EQ(recs[1].name, "test_other");
  EXPECT_TRUE(recs[1].usable);
  for (size_t i = 2; i < recs.size(); ++i) EXPECT_FALSE(recs[i].usable) << recs[i].file;

  const auto& bad = by_file(reg, "test_badabi.so");
  EXPECT_FALSE(bad.usable);
  EXPECT_EQ(bad.name, "");  // a descriptor of another ABI is not read past its version
  EXPECT_EQ(bad.reason, "ABI version 99, this tessera expects " + std::to_string(TESSERA_PLUGIN_ABI_MIN_VERSION) + " to " +
                            std::to_string(TESSERA_PLUGIN_ABI_VERSION) + ": rebuild the plugin");

  const auto& zero = record(reg, "test_zero");
  EXPECT_FALSE(zero.usable);
  EXPECT_EQ(zero.reason, "no frobnicator here");
  EXPECT_EQ(zero.kind, "backend");

  const auto& noentry = by_file(reg, "test_noentry.so");
  EXPECT_FALSE(noentry.usable);
  EXPECT_EQ(noentry.reason, "no tessera_plugin_entry symbol");
  EXPECT_EQ(noentry.kind, "?");

  EXPECT_EQ(reg.ranked_backends(), (std::vector<std::string>{"test_good", "test_other"}));
  EXPECT_TRUE(reg.create_loaders().empty());

  // The reference backend is the one whose descriptor says so, whatever its rank.
  EXPECT_FALSE(recs[0].reference);
  EXPECT_TRUE(record(reg, "test_other").reference);
  ASSERT_NE(reg.reference_backend(), nullptr);
  EXPECT_EQ(reg.reference_backend()->name, "test_other");
  PluginRegistry without(config("[backend.test_other]\nenabled = false\n"));
  EXPECT_EQ(without.reference_backend(), nullptr);  // disabled: not usable
}

TEST(PluginRegistry, RankOverrideChangesOrder) {
  PluginRegistry reg(config("[backend.test_other]\nrank = 10\n"));
  EXPECT_EQ(reg.ranked_backends(), (std::vector<std::string>{"test_other", "test_good"}));
  EXPECT_EQ(record(reg, "test_other").rank, 10);
  EXPECT_EQ(record(reg, "test_other").score, 3);
  EXPECT_EQ(reg.records()[0].name, "test_other");

  // Equal ranks: by name.
  PluginRegistry tie(config("[backend.test_other]\nrank = 5\n"));
  EXPECT_EQ(tie.ranked_backends(), (std::vector<std::string>{"test_good", "test_other"}));

  // Rank 0 makes a plugin unusable.
  PluginRegistry zero(config("[backend.test_good]\nrank = 0\n"));
  EXPECT_EQ(zero.ranked_backends(), (std::vector<std::string>{"test_other"}));
  EXPECT_FALSE(record(zero, "test_good").usable);
}

TEST(PluginRegistry, DisableWorks) {
  PluginRegistry d1(PluginConfig::from_string(
      "[plugins]\npaths = [\"" + kDir + "\"]\ndefault_paths = false\ndisable = [\"test_good\"]\n", "/"));
  EXPECT_EQ(d1.ranked_backends(), (std::vector<std::string>{"test_other"}));
  EXPECT_FALSE(record(d1, "test_good").usable);
  EXPECT_EQ(record(d1, "test_good").reason, "disabled in plugins.toml");
  EXPECT_THROW(d1.create_backend("test_good", nullptr), Error);

  // Disabled plugins whose file carries their name are not even loaded.
  PluginRegistry d3(config("[backend.test_zero]\nenabled = false\n"));
  EXPECT_EQ(by_file(d3, "test_zero.so").name, "test_zero");
  EXPECT_EQ(by_file(d3, "test_zero.so").reason, "disabled in plugins.toml");

  PluginRegistry d2(config("[backend.test_other]\nenabled = false\n"));
  EXPECT_EQ(d2.ranked_backends(), (std::vector<std::string>{"test_good"}));
  EXPECT_EQ(record(d2, "test_other").reason, "disabled in plugins.toml");
}

TEST(PluginRegistry, DuplicateNameIsRefused) {
  TempDir d;
  fs::copy_file(kDir + "/test_good.so", d.path / "copy_of_good.so");
  PluginRegistry reg(config("", "\"" + kDir + "\", \"" + d.path.string() + "\""));
  EXPECT_EQ(reg.ranked_backends(), (std::vector<std::string>{"test_good", "test_other"}));
  bool saw = false;
  for (const auto& r : reg.records())
    if (fs::path(r.file).filename() == "copy_of_good.so") {
      saw = true;
      EXPECT_FALSE(r.usable);
      EXPECT_EQ(r.reason, "duplicate of " + kDir + "/test_good.so");
    }
  EXPECT_TRUE(saw);

  // The same folder listed twice is scanned once.
  PluginRegistry twice(config("", "\"" + kDir + "\", \"" + kDir + "/\""));
  EXPECT_EQ(twice.records().size(), 5u);
}

TEST(PluginRegistry, GarbageFileGivesTheDlopenError) {
  TempDir d;
  std::ofstream(d.path / "x.so") << "this is not an ELF file, just some text long enough to look like one......"
                                    "...................................................................";
  std::ofstream(d.path / "notes.txt") << "ignored";
  PluginRegistry reg(config("", "\"" + d.path.string() + "\""));
  ASSERT_EQ(reg.records().size(), 1u);
  const auto& r = reg.records()[0];
  EXPECT_FALSE(r.usable);
  EXPECT_EQ(r.kind, "?");
  EXPECT_EQ(r.file, (d.path / "x.so").string());
  // dlerror(): "<path>: invalid ELF header" (or similar): it names the file.
  EXPECT_NE(r.reason.find("x.so:"), std::string::npos) << r.reason;
  EXPECT_EQ(r.reason.find("tessera_plugin_entry"), std::string::npos) << r.reason;
}

TEST(PluginRegistry, MissingFoldersAreSkipped) {
  PluginRegistry reg(config("", "\"/nonexistent/tessera/plugins\""));
  EXPECT_TRUE(reg.records().empty());
  EXPECT_TRUE(reg.ranked_backends().empty());
}

TEST(PluginRegistry, CreateBackendRunsAdd) {
  std::shared_ptr<Backend> be;
  {
    PluginRegistry reg(config());
    be = reg.create_backend("test_good", nullptr);
    ASSERT_NE(be, nullptr);
    EXPECT_EQ(be->name(), "test_good");
    EXPECT_THROW(reg.create_backend("test_zero", nullptr), Error);
    EXPECT_THROW(reg.create_backend("test_badabi", nullptr), Error);
    EXPECT_THROW(reg.create_backend("no_such_backend", nullptr), Error);
  }
  // The registry is gone; the backend keeps its library loaded.
  Graph g;
  int32_t a = g.new_tensor(DType::F32, {4}, "a");
  int32_t b = g.new_tensor(DType::F32, {4}, "b");
  int32_t c = g.new_tensor(DType::F32, {4}, "c");
  Node n;
  n.op = Op::Add;
  n.dst = c;
  n.src = {a, b, -1, -1, -1};
  g.add_node(n);
  g.allocate();
  for (int i = 0; i < 4; ++i) {
    g.tensor(a).row<float>(0)[i] = float(i);
    g.tensor(b).row<float>(0)[i] = 10.0f * float(i);
  }
  Scheduler s({be});
  s.run(g);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(g.tensor(c).row<float>(0)[i], 11.0f * float(i));
  EXPECT_NE(s.describe(g).find("0 add c -> test_good"), std::string::npos) << s.describe(g);
}

TEST(PluginRegistry, ABackendsFusionWindowIsReadAndChecked) {
  PluginRegistry reg(config());
  EXPECT_EQ(reg.create_backend("test_good", nullptr)->fusion_window(), 1);
  EXPECT_EQ(reg.create_backend("test_good", nullptr, {{"fusion_window", "4"}})->fusion_window(), 4);
  EXPECT_EQ(reg.create_backend("test_good", nullptr, {{"fusion_window", "64"}})->fusion_window(), 64);
  for (const char* bad : {"0", "-3", "65"}) {
    try {
      reg.create_backend("test_good", nullptr, {{"fusion_window", bad}});
      FAIL() << "a window of " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("test_good: fusion_window returned ") + bad +
                                           " (it must be 1 to 64)"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(PluginRegistry, OptionsReachCreate) {
  PluginRegistry reg(config("[backend.test_good]\noptions = { fail = 1, threads = 4, flag = true }\n"));
  try {
    reg.create_backend("test_good", nullptr);
    FAIL() << "expected the plugin to refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("asked to fail (options: fail=1, flag=true, threads=4)"), std::string::npos)
        << e.what();
  }
  // Overrides (e.g. from the command line) replace and add to the config's options.
  auto be = reg.create_backend("test_good", nullptr, {{"fail", "0"}});
  EXPECT_NE(be, nullptr);
  try {
    reg.create_backend("test_good", nullptr, {{"threads", "8"}, {"extra", "yes"}});
    FAIL() << "expected the plugin to refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("options: extra=yes, fail=1, flag=true, threads=8"), std::string::npos)
        << e.what();
  }
}
