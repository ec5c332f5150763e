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
#include "tessera/quant_blocks.h"

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
      {"llama-f32", [](auto& j) { j["architectures"] = {"MistralForCausalLM"}; j["sliding_window"] = 4096; },
       "sliding_window is set"},
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

// ---- a folder with a tokenizer: the commands that take text ----

// GPT-2's bytes_to_unicode, as UTF-8.
std::string byte_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int i = 0; i < 256; ++i) {
      const bool shown = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      const unsigned cp = shown ? unsigned(i) : 256u + unsigned(n++);
      if (cp < 0x80) t[size_t(i)] = std::string(1, char(cp));
      else t[size_t(i)] = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
    return t;
  }();
  return table[size_t(b)];
}

// llama-f32's weights (vocabulary 1024) with a byte-level BPE tokenizer of exactly
// 1024 tokens: 256 bytes, the 676 lower-case letter pairs, " a" .. " z", and special
// tokens (<|endoftext|> is 958, the end of generation).
std::string folder_with_tokenizer() {
  const std::string dir = edited_copy("llama-f32", [](auto&) {});
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = id++;
  for (char a = 'a'; a <= 'z'; ++a)
    for (char c = 'a'; c <= 'z'; ++c) {
      vocab[std::string{a, c}] = id++;
      merges.push_back(std::string{a} + " " + std::string{c});
    }
  for (char c = 'a'; c <= 'z'; ++c) {
    vocab[byte_char(' ') + std::string{c}] = id++;
    merges.push_back(byte_char(' ') + " " + std::string{c});
  }
  nlohmann::json added = nlohmann::json::array();
  for (int k = 0; id < 1024; ++k, ++id)
    added.push_back({{"id", id}, {"content", k == 0 ? std::string("<|endoftext|>") : "<|extra_" + std::to_string(k) + "|>"},
                     {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", true}});
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                     {"use_regex", true}};
  const nlohmann::json tj = {
      {"version", "1.0"}, {"added_tokens", added}, {"normalizer", nullptr}, {"pre_tokenizer", byte_level},
      {"post_processor", nullptr}, {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(fs::path(dir) / "tokenizer.json") << tj.dump();
  const nlohmann::json tc = {{"bos_token", nullptr}, {"eos_token", "<|endoftext|>"}, {"add_bos_token", false},
                             {"chat_template", "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}};
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << tc.dump();
  return dir;
}

std::string run_cli(const std::string& args, int* status) {
  const std::string out = testing::TempDir() + "/tessera_hf_cli_" + std::to_string(getpid()) + ".txt";
  *status = std::system((std::string(TESSERA_BIN_DIR) + "/tessera " + args + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST(HfCli, RunTokenizeAndInfoTakeAFolderWithATokenizer) {
  if (!fs::exists(hf_dir("llama-f32"))) GTEST_SKIP() << "fixtures not found at " << fixtures_dir();
  const std::string dir = folder_with_tokenizer();
  int st = 0;
  std::string out = run_cli("tokenize -m " + dir + " --no-bos 'hello world'", &st);
  ASSERT_EQ(st, 0) << out;
  // h, "el" (the lowest-ranked pair of "hello"), "lo", " w", "or", "ld".
  EXPECT_NE(out.find("104 371 556 954 637 545"), std::string::npos) << out;
  out = run_cli("run -m " + dir + " -p 'hello world' -n 4 --temp 0 --backend cpu_scalar", &st);
  EXPECT_EQ(st, 0) << out;
  out = run_cli("info " + dir, &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("safetensors"), std::string::npos) << out;
  EXPECT_NE(out.find("architecture:  llama"), std::string::npos) << out;
  // Without tokenizer.json, text commands say what is missing; token ids still work.
  out = run_cli("run -m " + hf_dir("llama-f32") + " -p hi -n 1", &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("has no tokenizer.json"), std::string::npos) << out;
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

TEST_P(HfLogits, PromptLogitsFromCliMatchReference) {
  check_prompt_logits_via_cli(fx_, hf_dir(GetParam().fixture), GetParam().backend);
}

TEST_P(HfLogits, GreedyDecodeMatchesReference) { check_greedy_decode(fx_, hf_dir(GetParam().fixture), GetParam().backend); }

INSTANTIATE_TEST_SUITE_P(Folders, HfLogits, testing::ValuesIn(logit_cases()), fixture_case_name);

}  // namespace
}  // namespace tessera::test
