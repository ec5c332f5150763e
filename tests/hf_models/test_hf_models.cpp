// Hugging Face checkpoint folders: the loader's translation into tessera's names
// (against the GGUF fixture of the same name), its refusals, and every folder's logits
// against the GGUF fixture's reference (prompt through `tessera logits`, greedy
// generation through the Engine) on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "fixture_util.h"
#include "gguf_reader.h"
#include "hf_model.h"
#include "tessera/conformance.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/model_description.h"
#include "tessera/plugin_registry.h"
#include "tessera/quant.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

std::string hf_dir(const std::string& name) { return (fs::path(fixtures_dir()) / "hf" / "models" / name).string(); }

std::vector<std::string> hf_fixtures() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(fixtures_dir()) / "hf" / "models", ec))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

const TensorInfo* find(const ModelDescription& d, const std::string& name) {
  for (const TensorInfo& t : d.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// Element i of a tensor as float (F32, F16, BF16).
float at(const TensorInfo& t, int64_t i) {
  switch (t.type) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::F16: return quant::fp16_to_fp32(static_cast<const uint16_t*>(t.data)[i]);
    case DType::BF16: return quant::bf16_to_fp32(static_cast<const uint16_t*>(t.data)[i]);
    default: ADD_FAILURE() << "unexpected dtype"; return 0.f;
  }
}

class HfDescription : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!fs::exists(hf_dir(GetParam()))) GTEST_SKIP() << "fixtures not found at " << fixtures_dir();
  }
};

// The folder describes the same model as the GGUF file: same architecture, the same
// hyperparameter values, the same tensors (names, dtypes, shapes, values) — except the
// llama q/k rows, which are HF's rotate-half order of GGUF's interleaved rows.
TEST_P(HfDescription, SameModelAsTheGgufFixture) {
  const std::string name = GetParam();
  auto hf = hf::CheckpointFile::open(hf_dir(name));
  auto gg = gguf::GgufFile::open((fs::path(fixtures_dir()) / "models" / (name + ".gguf")).string());
  const ModelDescription h = hf->describe(), g = gg->describe();
  EXPECT_EQ(h.architecture, g.architecture);
  for (const char* key : {"block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                          "expert_count", "expert_used_count"}) {
    if (!g.hparams.find(key)) continue;
    EXPECT_EQ(h.hparams.get_int(key), g.hparams.get_int(key)) << key;
  }
  for (const char* key : {"rope.freq_base", "attention.layer_norm_rms_epsilon"}) {
    if (!g.hparams.find(key)) continue;
    EXPECT_NEAR(*h.hparams.get_float(key), *g.hparams.get_float(key), 1e-6 * std::fabs(*g.hparams.get_float(key))) << key;
  }
  const bool llama = g.architecture == "llama";
  EXPECT_EQ(h.hparams.get_bool("rope.qk_rotate_half").value_or(false), llama);
  const int64_t n_head = *g.hparams.get_int("attention.head_count");
  const int64_t n_head_kv = g.hparams.get_int("attention.head_count_kv").value_or(n_head);
  int checked = 0;
  for (const TensorInfo& gt : g.tensors) {
    const TensorInfo* ht = find(h, gt.name);
    ASSERT_NE(ht, nullptr) << gt.name << " (GGUF) has no counterpart in the folder's description";
    EXPECT_EQ(ht->type, gt.type) << gt.name;
    ASSERT_EQ(ht->ne, gt.ne) << gt.name;
    const int64_t n = [&] { int64_t k = 1; for (int64_t d : gt.ne) k *= d; return k; }();
    const bool permuted = llama && (gt.name.find("attn_q.weight") != std::string::npos ||
                                    gt.name.find("attn_k.weight") != std::string::npos);
    if (!permuted) {
      if (gt.name == "rope_freqs.weight") {
        // Computed from config.json's rope_scaling: the converter's values within float rounding.
        for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(at(*ht, i), at(gt, i), 1e-6f * std::fabs(at(gt, i))) << "pair " << i;
      } else {
        EXPECT_EQ(std::memcmp(ht->data, gt.data, gt.nbytes), 0) << gt.name << ": bytes differ";
      }
    } else {
      // GGUF row r of a head (size d) holds HF row (r/2) + (r%2)*(d/2) of that head.
      const int64_t heads = gt.name.find("attn_q") != std::string::npos ? n_head : n_head_kv;
      const int64_t cols = gt.ne[0], rows = gt.ne[1], d = rows / heads;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t head = r / d, j = r % d, hr = head * d + j / 2 + (j % 2) * (d / 2);
        for (int64_t c = 0; c < cols; c += 17) ASSERT_EQ(at(*ht, hr * cols + c), at(gt, r * cols + c)) << gt.name << " row " << r;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(g.tensors.size()));
  EXPECT_EQ(h.tensors.size(), g.tensors.size()) << "the folder describes tensors the GGUF file lacks";
}

INSTANTIATE_TEST_SUITE_P(Folders, HfDescription, testing::ValuesIn(hf_fixtures()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// A copy of a fixture folder (the weights linked, config.json edited by `edit`).
std::string edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path src = hf_dir(name);
  const fs::path dst = fs::path(testing::TempDir()) / ("hf_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "config.json") fs::create_symlink(e.path(), dst / e.path().filename());
  std::ifstream in(src / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dst / "config.json") << j.dump(1);
  return dst.string();
}

std::string load_error(const std::string& folder) {
  try {
    auto f = hf::CheckpointFile::open(folder);
    Model::load(*f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfRefusals, EachUnsupportedConfigIsOneLineNamingTheKey) {
  if (!fs::exists(hf_dir("llama-f32"))) GTEST_SKIP() << "fixtures not found at " << fixtures_dir();
  struct Case {
    const char* folder;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"llama-f32", [](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; }, "GPT2LMHeadModel is not supported"},
      {"llama-f32", [](auto& j) { j.erase("architectures"); }, "architectures is missing"},
      {"llama-f32", [](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"llama-f32", [](auto& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }, "'yarn' is not supported"},
      {"llama-f32", [](auto& j) { j["vocab_size"] = 1000; }, "vocab_size = 1000"},
      {"llama-f32", [](auto& j) { j["num_hidden_layers"] = 3; }, "num_hidden_layers = 3"},
      {"llama-f32", [](auto& j) { j["num_hidden_layers"] = "two"; }, "num_hidden_layers must be an integer"},
      {"llama-f32", [](auto& j) { j["attention_bias"] = true; }, "attention_bias"},
      {"llama-f32", [](auto& j) { j["hidden_size"] = 128; }, "tensor 'model.embed_tokens.weight' has shape"},
      {"qwen2-f32", [](auto& j) { j["use_sliding_window"] = true; }, "use_sliding_window"},
      {"qwen3moe-f32", [](auto& j) { j["norm_topk_prob"] = false; }, "norm_topk_prob"},
      {"qwen3moe-f32", [](auto& j) { j["mlp_only_layers"] = {1}; }, "mlp_only_layers"},
      {"qwen3moe-f32", [](auto& j) { j["num_experts"] = 9; }, "experts.8.gate_proj.weight' is missing"},
  };
  for (const Case& c : cases) {
    const std::string err = load_error(edited_copy(c.folder, c.edit));
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.folder << ": expected '" << c.expect << "' in: " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

TEST(HfRefusals, TensorsTheModelDoesNotReadAreReportedUnderTheirOwnNames) {
  if (!fs::exists(hf_dir("qwen3-f32"))) GTEST_SKIP() << "fixtures not found at " << fixtures_dir();
  // One layer of the two the shards hold: the second layer's tensors are listed unused.
  auto f = hf::CheckpointFile::open(edited_copy("qwen3-f32", [](auto& j) { j["num_hidden_layers"] = 1; }));
  auto m = Model::load(*f);
  ASSERT_FALSE(m->unused_tensors().empty());
  for (const auto& n : m->unused_tensors()) EXPECT_EQ(n.rfind("model.layers.1.", 0), 0u) << n;
}

// ---- logits ----

PluginConfig plugin_config() {
  PluginConfig cfg;
  cfg.paths = {TESSERA_PLUGIN_DIR};
  return cfg;
}

std::vector<FixtureCase> logit_cases() {
  std::vector<FixtureCase> out;
  for (const auto& f : hf_fixtures())
    for (const auto& b : test_backends()) out.push_back({f, b});
  return out;
}

class HfLogits : public testing::TestWithParam<FixtureCase> {
 protected:
  void SetUp() override {
    if (!fs::exists(hf_dir(GetParam().fixture))) GTEST_SKIP() << "fixtures not found at " << fixtures_dir();
    PluginRegistry reg(plugin_config());
    const PluginRecord* r = reg.find(GetParam().backend);
    if (!r || !r->usable)
      GTEST_SKIP() << GetParam().backend << " is not usable here: " << (r ? r->reason : std::string("not found"));
    fx_ = load_model_fixture(GetParam().fixture);
  }
  ModelFixture fx_;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

TEST_P(HfLogits, PromptLogitsFromCliMatchReference) {
  const FixtureCase& c = GetParam();
  const std::string out = testing::TempDir() + "/tessera_hf_" + std::to_string(getpid()) + "_" + c.fixture + "." +
                          c.backend + ".logits.f32";
  std::ostringstream tokens;
  for (size_t i = 0; i < fx_.prompt.size(); ++i) tokens << (i ? "," : "") << fx_.prompt[i];
  const std::string cmd = std::string(TESSERA_BIN_DIR) + "/tessera logits -m " + hf_dir(c.fixture) + " --tokens " +
                          tokens.str() + " --out " + out + " --backend " + joined(backend_list(c.backend)) +
                          " --threads 1 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<float> got = read_f32(out);
  ASSERT_EQ(got.size(), fx_.prompt_logits.size());
  const int64_t V = fx_.n_vocab;
  double worst = 0;
  for (size_t r = 0; r < fx_.prompt.size(); ++r) {
    const float* ref = &fx_.prompt_logits[r * V];
    worst = std::max(worst, tessera::nmse(ref, &got[r * V], size_t(V)));
    if (top1_margin(ref, V) >= 0.1f) EXPECT_EQ(argmax(&got[r * V], V), argmax(ref, V)) << "argmax of prompt row " << r;
  }
  EXPECT_LE(worst, nmse_limit(c.fixture)) << "worst-row NMSE of the prompt logits";
  std::printf("[ hf/%s on %s ] prompt worst-row NMSE %.3g\n", c.fixture.c_str(), c.backend.c_str(), worst);
}

TEST_P(HfLogits, GreedyDecodeMatchesReference) {
  const FixtureCase& c = GetParam();
  PluginRegistry reg(plugin_config());
  EngineOptions eo;
  eo.model_path = hf_dir(c.fixture);
  eo.backends = backend_list(c.backend);
  eo.threads = 2;
  eo.page_tokens = 16;
  Engine engine(reg, eo);
  const int64_t V = fx_.n_vocab;
  ASSERT_EQ(engine.n_vocab(), V);
  engine.eval(fx_.prompt, false);
  double worst = 0;
  int argmax_checked = 0;
  for (size_t i = 0; i < fx_.greedy.size(); ++i) {
    auto row = engine.eval(std::span<const int32_t>(&fx_.greedy[i], 1), false);
    const float* ref = &fx_.gen_logits[i * V];
    const double e = tessera::nmse(ref, row.data(), size_t(V));
    worst = std::max(worst, e);
    EXPECT_LE(e, nmse_limit(c.fixture)) << "generation step " << i;
    if (top1_margin(ref, V) >= 0.1f) {
      ++argmax_checked;
      EXPECT_EQ(argmax(row.data(), V), argmax(ref, V)) << "argmax at generation step " << i;
    }
  }
  EXPECT_GT(argmax_checked, 0);
  std::printf("[ hf/%s on %s ] generation worst-row NMSE %.3g, %d argmax checks\n", c.fixture.c_str(),
              c.backend.c_str(), worst, argmax_checked);
}

INSTANTIATE_TEST_SUITE_P(Folders, HfLogits, testing::ValuesIn(logit_cases()), fixture_case_name);

}  // namespace
}  // namespace tessera::test
