// Naming backends (`--backend X`) chooses who runs what they can; the nodes they
// decline go to the reference backend unless strict_backends (issue 21). test_good
// runs only Add, so a model on it alone needs the fallback for everything else.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/plugin_registry.h"

namespace tessera {
namespace {

const std::string kModel = std::string(TESSERA_FIXTURES_DIR) + "/models/llama-f32.gguf";

PluginConfig both_plugin_dirs() {
  PluginConfig cfg;
  cfg.paths = {TESSERA_PLUGIN_DIR, TESSERA_TEST_PLUGIN_DIR};
  return cfg;
}

std::vector<float> last_logits(const std::vector<std::string>& backends, bool strict) {
  PluginRegistry reg(both_plugin_dirs());
  EngineOptions eo;
  eo.model_path = kModel;
  eo.backends = backends;
  eo.strict_backends = strict;
  eo.threads = 1;
  Engine engine(reg, eo);
  const std::vector<int32_t> prompt = {1, 15, 27, 300};
  auto row = engine.eval(prompt, false);
  return {row.begin(), row.end()};
}

TEST(BackendFallback, NamedBackendDecliningNodesFallsBackToTheReference) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "fixtures not found: " << kModel;
  {  // the bundled reference, as its descriptor names it
    PluginConfig bundled;
    bundled.paths = {TESSERA_PLUGIN_DIR};
    PluginRegistry reg(bundled);
    ASSERT_NE(reg.reference_backend(), nullptr);
    EXPECT_EQ(reg.reference_backend()->name, "cpu_scalar");
    for (const PluginRecord& r : reg.records()) {
      if (r.name != "cpu_scalar") {
        EXPECT_FALSE(r.reference) << r.name;
      }
    }
  }
  const std::vector<float> reference = last_logits({"cpu_scalar"}, false);
  // test_good runs the residual Adds; cpu_scalar, appended, runs the rest: the same
  // float sums in the same order, so the same logits.
  const std::vector<float> named = last_logits({"test_good"}, false);
  ASSERT_EQ(named.size(), reference.size());
  EXPECT_EQ(named, reference);
}

// The window a host graph plans its scratch by, as each bundled backend declares it
// through the plugin ABI: the reference runs node by node, cpu_avx512 groups up to four
// products over one input.
TEST(BackendFallback, BundledBackendsDeclareTheirFusionWindows) {
  PluginConfig bundled;
  bundled.paths = {TESSERA_PLUGIN_DIR};
  PluginRegistry reg(bundled);
  EXPECT_EQ(reg.create_backend("cpu_scalar", nullptr)->fusion_window(), 1);
  for (const PluginRecord& r : reg.records()) {
    if (r.name != "cpu_avx512") continue;
    if (!r.usable) GTEST_SKIP() << "cpu_avx512 is not usable here: " << r.reason;
    EXPECT_EQ(reg.create_backend("cpu_avx512", nullptr)->fusion_window(), 4);
  }
}

TEST(BackendFallback, StrictBackendRefusesWhatTheNamedBackendsDoNotRun) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "fixtures not found: " << kModel;
  try {
    last_logits({"test_good"}, true);
    FAIL() << "a graph test_good cannot run completed with strict_backends";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_good"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
