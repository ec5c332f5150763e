// Every MoE fixture with its experts streamed through the smallest cache that works
// gives logits bit-identical to the same backends with the experts all resident, as
// each backend keeps them by default (cpu_avx512 repacks resident experts; a streamed
// one keeps the file's layout, and its row kernels add in the repacked tiles' order),
// prompt and decode, on every CPU backend.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <regex>

#include "../fixtures/fixture_util.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/expert_stream.h"
#include "tessera/plugin_registry.h"

namespace tessera::test {
namespace {

std::vector<FixtureCase> cases() {
  std::vector<FixtureCase> out;
  for (const char* f :
       {"qwen3moe-f32", "qwen3moe-f16", "qwen3moe-q8_0", "qwen3moe-q4_0", "qwen3moe-q4_k_m", "qwen3moe-mxfp4_moe",
        "qwen35moe-f16", "qwen35moe-q8_0", "qwen35moe-q4_0", "qwen35moe-q4_k_m", "gpt-oss-f32", "gpt-oss-q8_0",
        "gpt-oss-q4_k_m", "gpt-oss-mxfp4_moe", "glm4moe-f32", "glm4moe-q8_0", "glm4moe-q4_k_m", "deepseek2-f32",
        "deepseek2-q8_0", "deepseek2-q4_k_m"})
    for (const char* b : {"cpu_scalar", "cpu_avx512"}) out.push_back({f, b});
  return out;
}

class StreamedModel : public testing::TestWithParam<FixtureCase> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(fixtures_dir() + "/models/" + GetParam().fixture + ".gguf"))
      GTEST_SKIP() << GetParam().fixture << " is not among the fixtures at " << fixtures_dir();
    if (std::string why = backend_unusable_reason(GetParam().backend); !why.empty())
      GTEST_SKIP() << GetParam().backend << " is not usable here: " << why;
    fx_ = load_model_fixture(GetParam().fixture);
    PluginConfig cfg;
    cfg.paths = {TESSERA_PLUGIN_DIR};
    reg_ = std::make_unique<PluginRegistry>(cfg);
  }
  std::unique_ptr<Engine> engine(int64_t cache) {
    EngineOptions eo;
    eo.model_path = fx_.gguf;
    eo.backends = backend_list(GetParam().backend);
    eo.threads = 2;
    eo.n_ctx = 128;
    eo.expert_cache_bytes = cache;
    return std::make_unique<Engine>(*reg_, eo);
  }
  // The prompt's logits, then greedy decode of 8 tokens one at a time.
  std::vector<float> run(Engine& e) {
    std::vector<float> all;
    auto l = e.eval(fx_.prompt, true);
    all.assign(l.begin(), l.end());
    for (int i = 0; i < 8; ++i) {
      const int32_t next = int32_t(argmax(all.data() + all.size() - size_t(fx_.n_vocab), fx_.n_vocab));
      auto s = e.eval(std::span<const int32_t>(&next, 1), false);
      all.insert(all.end(), s.begin(), s.end());
    }
    return all;
  }
  ModelFixture fx_;
  std::unique_ptr<PluginRegistry> reg_;
};

TEST_P(StreamedModel, SmallestCacheGivesBitIdenticalLogits) {
  // Too small: refused, naming the minimum.
  uint64_t min_mib = 0;
  try {
    engine(1);
    FAIL() << "a 1-byte expert cache must be refused";
  } catch (const Error& e) {
    std::cmatch m;
    ASSERT_TRUE(std::regex_search(e.what(), m, std::regex("use --expert-cache ([0-9]+)M or more"))) << e.what();
    min_mib = std::stoull(m[1].str());
  }
  auto streamed = engine(int64_t(min_mib << 20));
  ASSERT_NE(streamed->expert_stream(), nullptr);
  auto resident = engine(EngineOptions::kExpertCacheOff);
  ASSERT_EQ(resident->expert_stream(), nullptr);
  const std::vector<float> a = run(*resident), b = run(*streamed);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "streamed logits differ";
  const ExpertStreamStats st = streamed->expert_stream()->stats();
  EXPECT_LE(st.resident_bytes, st.cache_bytes);
  EXPECT_GT(st.bytes_read, 0u);
  EXPECT_GT(st.lookups, st.hits);  // the cache was too small to keep every expert
}

// With room for more than one layer, the next layer's experts are predicted by its
// router and read ahead on the stream's thread: still bit-identical.
TEST_P(StreamedModel, LookaheadPrefetchKeepsLogitsBitIdentical) {
  uint64_t min_mib = 0;
  try {
    engine(1);
  } catch (const Error& e) {
    std::cmatch m;
    ASSERT_TRUE(std::regex_search(e.what(), m, std::regex("use --expert-cache ([0-9]+)M or more"))) << e.what();
    min_mib = std::stoull(m[1].str());
  }
  auto streamed = engine(int64_t(3 * min_mib << 20));
  auto resident = engine(EngineOptions::kExpertCacheOff);
  const std::vector<float> a = run(*resident), b = run(*streamed);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "streamed logits differ";
  const ExpertStreamStats st = streamed->expert_stream()->stats();
  EXPECT_GT(st.prefetched, 0u);
  EXPECT_LE(st.prefetch_hits, st.prefetched);
  EXPECT_LE(st.resident_bytes, st.cache_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, StreamedModel, testing::ValuesIn(cases()), fixture_case_name);

}  // namespace
}  // namespace tessera::test
