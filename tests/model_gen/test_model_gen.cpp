// tessera-gen as a user runs it: the qwen3moe / qwen35moe presets have exactly the
// structure of the shared fixtures (tensor names, shapes, dtypes per file type,
// hyperparameter keys and values), the big presets have their published shapes, and
// the generated models run through `tessera logits` with finite logits, deep ones too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf_reader.h"
#include "tessera/dtype.h"
#include "tessera/quant.h"

namespace {
namespace fs = std::filesystem;
using tessera::gguf::GgufFile;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Scratch folders hold generated models of up to a few hundred MiB: removed at exit.
std::set<std::string>& scratch_dirs() {
  static std::set<std::string> dirs;
  return dirs;
}

class RemoveScratch : public testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const auto& d : scratch_dirs()) fs::remove_all(d, ec);
  }
};
[[maybe_unused]] testing::Environment* const kRemoveScratch = testing::AddGlobalTestEnvironment(new RemoveScratch);

// A scratch folder per test and process (ctest runs the tests in parallel).
std::string scratch() {
  std::string test = testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : test)
    if (!isalnum(uint8_t(c))) c = '_';
  std::string dir = testing::TempDir() + "/tessera_model_gen_" + std::to_string(getpid()) + "_" + test;
  fs::create_directories(dir);
  scratch_dirs().insert(dir);
  return dir;
}

Result run(const std::string& tool, const std::string& args) {
  std::string dir = scratch();
  std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = std::string(TESSERA_BIN_DIR) + "/" + tool + " " + args + " >" + out + " 2>" + err;
  int rc = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Generates a model into the test's scratch folder and returns its path.
std::string generate(const std::string& args, const std::string& file = "model.gguf") {
  std::string path = scratch() + "/" + file;
  Result r = run("tessera-gen", args + " --out " + path);
  EXPECT_EQ(r.status, 0) << "tessera-gen " << args << "\n" << r.err;
  return path;
}

std::string fixture_model(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/models/" + name + ".gguf";
}

std::string describe(const tessera::MetaValue& v) {
  std::ostringstream o;
  if (auto a = v.as_array()) {
    o << "[";
    for (size_t i = 0; i < a->size(); ++i) o << (i ? "," : "") << describe((*a)[i]);
    o << "]";
  } else if (auto s = v.as_string()) {
    o << '"' << *s << '"';
  } else if (v.type == tessera::MetaType::F32 || v.type == tessera::MetaType::F64) {
    o << *v.as_float();
  } else {
    o << *v.as_int();
  }
  return o.str();
}

std::string dims(const std::vector<int64_t>& ne) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < ne.size(); ++i) o << (i ? "," : "") << ne[i];
  o << "]";
  return o.str();
}

// Same tensors (names, shapes, dtypes), same metadata keys, and the same values for
// every key but the name and the vocabulary's pieces.
void expect_same_structure(const std::string& generated, const std::string& reference) {
  auto g = GgufFile::open(generated), r = GgufFile::open(reference);
  std::map<std::string, std::string> gt, rt;
  for (const auto& t : g->tensors()) gt[t.name] = dims(t.ne) + " " + std::string(tessera::dtype_name(t.type));
  for (const auto& t : r->tensors()) rt[t.name] = dims(t.ne) + " " + std::string(tessera::dtype_name(t.type));
  for (const auto& [name, what] : rt) {
    auto it = gt.find(name);
    if (it == gt.end()) ADD_FAILURE() << reference << ": " << name << " " << what << " is not generated";
    else EXPECT_EQ(it->second, what) << name;
  }
  for (const auto& [name, what] : gt)
    if (!rt.count(name)) ADD_FAILURE() << "generated " << name << " " << what << " is not in " << reference;

  const auto& gm = g->metadata().all();
  const auto& rm = r->metadata().all();
  for (const auto& [key, v] : rm) {
    auto it = gm.find(key);
    if (it == gm.end()) {
      ADD_FAILURE() << "metadata key " << key << " = " << describe(v) << " is not generated";
      continue;
    }
    EXPECT_EQ(it->second.type, v.type) << key;
    if (key == "general.name" || key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.scores" ||
        key == "tokenizer.ggml.token_type")
      continue;
    EXPECT_EQ(describe(it->second), describe(v)) << key;
  }
  for (const auto& [key, v] : gm)
    if (!rm.count(key)) ADD_FAILURE() << "generated metadata key " << key << " is not in " << reference;
}

// "" when `tessera info` says the model can run, else its reason.
std::string cannot_run(const std::string& model) {
  Result info = run("tessera", "info " + model);
  EXPECT_EQ(info.status, 0) << info.err;
  auto at = info.out.find("cannot run");
  if (at == std::string::npos) return "";
  return info.out.substr(at, info.out.find('\n', at) - at);
}

// The prompt logits of `tessera logits` over a few tokens: all finite, of sane size.
void expect_finite_logits(const std::string& model, int64_t n_vocab, const std::string& tokens = "1,17,300,42,5,99") {
  std::string out = scratch() + "/logits.f32";
  Result r = run("tessera", "logits -m " + model + " --tokens " + tokens + " --out " + out + " --threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  std::string bytes = slurp(out);
  const size_t n_tokens = size_t(std::count(tokens.begin(), tokens.end(), ',') + 1);
  ASSERT_EQ(bytes.size(), n_tokens * size_t(n_vocab) * sizeof(float));
  std::vector<float> logits(bytes.size() / sizeof(float));
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  double max_abs = 0, sum_sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v)) << model;
    max_abs = std::max(max_abs, double(std::fabs(v)));
    sum_sq += double(v) * v;
  }
  double rms = std::sqrt(sum_sq / double(logits.size()));
  EXPECT_GT(rms, 1e-3) << "the logits are all (nearly) zero";
  EXPECT_LT(max_abs, 1e3) << "the activations blew up";
}

bool have_fixtures() { return fs::exists(std::string(TESSERA_FIXTURES_DIR) + "/models"); }

#define SKIP_WITHOUT_FIXTURES()                                                                          \
  if (!have_fixtures())                                                                                  \
  GTEST_SKIP() << "fixtures not found at " << TESSERA_FIXTURES_DIR << "/models (../shared beside the repository)"

class MatchesFixture : public testing::TestWithParam<std::string> {};

// qwen3moe-q4_k_m -> --preset qwen3moe-tiny --type q4_k_m, compared with the fixture.
TEST_P(MatchesFixture, TensorsAndMetadata) {
  SKIP_WITHOUT_FIXTURES();
  const std::string fx = GetParam();
  const std::string arch = fx.substr(0, fx.find('-')), type = fx.substr(fx.find('-') + 1);
  if (!fs::exists(fixture_model(fx))) GTEST_SKIP() << fixture_model(fx) << " not found";
  std::string path = generate("--preset " + arch + "-tiny --type " + type + " --quiet");
  expect_same_structure(path, fixture_model(fx));
}

INSTANTIATE_TEST_SUITE_P(Qwen, MatchesFixture,
                         testing::Values("qwen3moe-f16", "qwen3moe-q8_0", "qwen3moe-q4_0", "qwen3moe-q4_k_m",
                                         "qwen35moe-f16", "qwen35moe-q8_0", "qwen35moe-q4_0", "qwen35moe-q4_k_m"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (!isalnum(uint8_t(c))) c = '_';
                           return s;
                         });

std::map<std::string, const tessera::TensorInfo*> by_name(const GgufFile& f) {
  std::map<std::string, const tessera::TensorInfo*> m;
  for (const auto& t : f.tensors()) m[t.name] = &t;
  return m;
}

std::vector<float> values(const tessera::TensorInfo& t) {
  int64_t n = 1;
  for (int64_t d : t.ne) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  tessera::quant::dequantize_row(t.type, t.data, v.data(), n);
  return v;
}

TEST(ModelGen, Qwen35MoeLayersAlternateAndHoldSaneValues) {
  // The Qwen3.5-35B-A3B shape cut to 4 layers (3 delta-net, 1 full attention), 4 experts
  // and a small vocabulary; q8_0 because the K-quant search is slow.
  std::string path = generate("--preset qwen3.5-35b-a3b --layers 4 --experts 4 --experts-used 2 "
                              "--vocab-size 1024 --type q8_0 --quiet");
  auto f = GgufFile::open(path);
  auto t = by_name(*f);
  const auto& md = f->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(md.get_int("qwen35moe.full_attention_interval"), 4);
  EXPECT_EQ(md.get_int("qwen35moe.ssm.inner_size"), 4096);
  EXPECT_EQ(md.get_int("qwen35moe.ssm.state_size"), 128);
  EXPECT_EQ(md.get_int("qwen35moe.ssm.group_count"), 16);
  EXPECT_EQ(md.get_int("qwen35moe.ssm.time_step_rank"), 32);
  EXPECT_EQ(md.get_int("qwen35moe.rope.dimension_count"), 64);
  EXPECT_EQ(md.get_int("qwen35moe.expert_shared_feed_forward_length"), 512);
  EXPECT_EQ(md.get_int("qwen35moe.context_length"), 262144);
  for (int l = 0; l < 4; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool full = (l + 1) % 4 == 0;
    EXPECT_EQ(t.count(p + "attn_q.weight"), full ? 1u : 0u) << l;
    EXPECT_EQ(t.count(p + "attn_qkv.weight"), full ? 0u : 1u) << l;
    for (const char* common : {"attn_norm.weight", "post_attention_norm.weight", "ffn_gate_inp.weight",
                               "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                               "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                               "ffn_down_shexp.weight"})
      EXPECT_EQ(t.count(p + common), 1u) << p + common;
  }
  // key_dim 16 x 128, value_dim 32 x 128, conv_dim 2 * 2048 + 4096.
  EXPECT_EQ(t.at("blk.0.attn_qkv.weight")->ne, (std::vector<int64_t>{2048, 8192}));
  EXPECT_EQ(t.at("blk.0.attn_gate.weight")->ne, (std::vector<int64_t>{2048, 4096}));
  EXPECT_EQ(t.at("blk.0.ssm_conv1d.weight")->ne, (std::vector<int64_t>{4, 8192}));
  EXPECT_EQ(t.at("blk.0.ssm_out.weight")->ne, (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(t.at("blk.0.ssm_norm.weight")->ne, (std::vector<int64_t>{128}));
  EXPECT_EQ(t.at("blk.0.ssm_alpha.weight")->ne, (std::vector<int64_t>{2048, 32}));
  EXPECT_EQ(t.at("blk.0.ssm_a")->ne, (std::vector<int64_t>{32}));
  EXPECT_EQ(t.at("blk.3.attn_q.weight")->ne, (std::vector<int64_t>{2048, 2 * 16 * 256}));
  EXPECT_EQ(t.at("blk.3.attn_k.weight")->ne, (std::vector<int64_t>{2048, 2 * 256}));
  EXPECT_EQ(t.at("blk.3.attn_output.weight")->ne, (std::vector<int64_t>{16 * 256, 2048}));
  EXPECT_EQ(t.at("blk.3.attn_q_norm.weight")->ne, (std::vector<int64_t>{256}));
  EXPECT_EQ(t.at("blk.0.ffn_down_exps.weight")->ne, (std::vector<int64_t>{512, 2048, 4}));
  EXPECT_EQ(t.at("blk.0.ssm_conv1d.weight")->type, tessera::DType::F32);
  EXPECT_EQ(t.at("blk.0.ssm_a")->type, tessera::DType::F32);
  EXPECT_EQ(t.at("blk.0.ffn_gate_inp.weight")->type, tessera::DType::F32);

  for (float a : values(*t.at("blk.0.ssm_a"))) {
    EXPECT_LT(a, 0.f) << "ssm_a is -exp(A_log): negative";
    EXPECT_GT(a, -3.f);
  }
  for (float g : values(*t.at("blk.0.ssm_norm.weight"))) EXPECT_NEAR(g, 1.f, 0.2f);
  auto q = values(*t.at("blk.0.attn_qkv.weight"));
  double sq = 0;
  for (float v : q) sq += double(v) * v;
  EXPECT_NEAR(std::sqrt(sq / double(q.size())), 1.0 / std::sqrt(2048.0), 0.05 / std::sqrt(2048.0))
      << "matrices have std 1/sqrt(fan-in)";
}

TEST(ModelGen, Qwen3MoeBigPresetShape) {
  std::string path = generate("--preset qwen3-30b-a3b --layers 2 --experts 8 --vocab-size 1024 --type q8_0 --quiet");
  auto f = GgufFile::open(path);
  auto t = by_name(*f);
  const auto& md = f->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(md.get_int("qwen3moe.expert_used_count"), 8);
  EXPECT_EQ(md.get_int("qwen3moe.expert_feed_forward_length"), 768);
  EXPECT_EQ(md.get_int("qwen3moe.feed_forward_length"), 6144);
  EXPECT_EQ(md.get_int("qwen3moe.attention.key_length"), 128);
  EXPECT_EQ(md.get_int("qwen3moe.context_length"), 40960);
  EXPECT_EQ(md.get_float("qwen3moe.rope.freq_base"), 1e6);
  EXPECT_EQ(t.at("blk.0.attn_q.weight")->ne, (std::vector<int64_t>{2048, 32 * 128}));
  EXPECT_EQ(t.at("blk.0.attn_k.weight")->ne, (std::vector<int64_t>{2048, 4 * 128}));
  EXPECT_EQ(t.at("blk.0.attn_output.weight")->ne, (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(t.at("blk.0.attn_q_norm.weight")->ne, (std::vector<int64_t>{128}));
  EXPECT_EQ(t.at("blk.0.ffn_gate_exps.weight")->ne, (std::vector<int64_t>{2048, 768, 8}));
  EXPECT_EQ(t.at("blk.0.ffn_down_exps.weight")->ne, (std::vector<int64_t>{768, 2048, 8}));
}

// llama.cpp's Q4_K_M without its 8-expert rules (the real models have 128 and 256
// experts): attn_v / attn_qkv and ffn_down get Q6_K in the layers use_more_bits picks,
// attn_k and attn_output stay Q4_K.
TEST(ModelGen, Q4KMMixWithManyExperts) {
  // use_more_bits(layer, 8): layer < 1, layer >= 7, (layer - 1) % 3 == 2.
  auto more = [](int l) { return l == 0 || l == 3 || l == 6 || l == 7; };
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    std::string path = generate(std::string("--preset ") + arch + "-tiny --layers 8 --experts 16 --type q4_k_m --quiet",
                                std::string(arch) + ".gguf");
    auto f = GgufFile::open(path);
    auto t = by_name(*f);
    EXPECT_EQ(t.at("output.weight")->type, tessera::DType::Q6_K);
    EXPECT_EQ(t.at("token_embd.weight")->type, tessera::DType::Q4_K);
    for (int l = 0; l < 8; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const auto want = more(l) ? tessera::DType::Q6_K : tessera::DType::Q4_K;
      EXPECT_EQ(t.at(p + "ffn_down_exps.weight")->type, want) << arch << " " << l;
      EXPECT_EQ(t.at(p + "ffn_gate_exps.weight")->type, tessera::DType::Q4_K) << arch << " " << l;
      const bool full = std::string(arch) == "qwen3moe" || (l + 1) % 4 == 0;
      if (full) {
        EXPECT_EQ(t.at(p + "attn_v.weight")->type, want) << arch << " " << l;
        EXPECT_EQ(t.at(p + "attn_k.weight")->type, tessera::DType::Q4_K) << arch << " " << l;
        EXPECT_EQ(t.at(p + "attn_output.weight")->type, tessera::DType::Q4_K) << arch << " " << l;
      } else {
        EXPECT_EQ(t.at(p + "attn_qkv.weight")->type, want) << arch << " " << l;
        EXPECT_EQ(t.at(p + "ffn_down_shexp.weight")->type, want) << arch << " " << l;
        EXPECT_EQ(t.at(p + "ssm_out.weight")->type, tessera::DType::Q4_K) << arch << " " << l;
      }
    }
  }
}

TEST(ModelGen, TinyQwen3MoeRunsWithFiniteLogits) {
  std::string path = generate("--preset qwen3moe-tiny --type q4_k_m --quiet");
  std::string why = cannot_run(path);
  ASSERT_EQ(why, "") << "qwen3moe is a supported architecture";
  expect_finite_logits(path, 1024);
}

TEST(ModelGen, DeepQwen3MoeKeepsLogitsSane) {
  // 48 layers like Qwen3-30B-A3B (narrow, so it runs in seconds).
  std::string path = generate("--preset qwen3moe-tiny --layers 48 --type q8_0 --quiet");
  ASSERT_EQ(cannot_run(path), "");
  expect_finite_logits(path, 1024);
}

TEST(ModelGen, TinyQwen35MoeRunsWithFiniteLogits) {
  std::string path = generate("--preset qwen35moe-tiny --type q4_k_m --quiet");
  std::string why = cannot_run(path);
  if (!why.empty()) GTEST_SKIP() << "structure only (see MatchesFixture): tessera info says: " << why;
  expect_finite_logits(path, 1024);
}

TEST(ModelGen, DeepQwen35MoeKeepsLogitsSane) {
  // 40 layers like Qwen3.5-35B-A3B (narrow, so it runs in seconds).
  std::string path = generate("--preset qwen35moe-tiny --layers 40 --type q8_0 --quiet");
  std::string why = cannot_run(path);
  if (!why.empty()) GTEST_SKIP() << "tessera info says: " << why;
  expect_finite_logits(path, 1024);
}

TEST(ModelGen, RealTokenizerFromAVocabularyFile) {
  SKIP_WITHOUT_FIXTURES();
  const std::string vocab = std::string(TESSERA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf";
  if (!fs::exists(vocab)) GTEST_SKIP() << vocab << " not found";
  // Qwen2's BPE vocabulary has Qwen3's 151936 pieces; the tiny preset takes its size.
  std::string path = generate("--preset qwen3moe-tiny --type q8_0 --quiet --vocab " + vocab);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->metadata().get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->find_tensor("token_embd.weight")->ne, (std::vector<int64_t>{256, 151936}));
  ASSERT_EQ(cannot_run(path), "");
  Result tok = run("tessera", "tokenize -m " + path + " --no-bos \"Hello world\"");
  EXPECT_EQ(tok.status, 0) << tok.err;
  EXPECT_EQ(tok.out, "9707 1879\n");
  expect_finite_logits(path, 151936, "9707,1879");
}

TEST(ModelGen, DeterministicAcrossThreadCounts) {
  std::string a = generate("--preset qwen35moe-tiny --type q4_k_m --seed 5 --quiet --threads 1", "a.gguf");
  std::string b = generate("--preset qwen35moe-tiny --type q4_k_m --seed 5 --quiet --threads 2", "b.gguf");
  std::string c = generate("--preset qwen35moe-tiny --type q4_k_m --seed 6 --quiet --threads 2", "c.gguf");
  EXPECT_EQ(slurp(a), slurp(b));
  EXPECT_NE(slurp(a), slurp(c));
}

// --fast copies quantized rows from a pool: same file structure and size as an exact
// run, deterministic, and the model still runs with sane logits.
TEST(ModelGen, FastModeKeepsStructureAndRuns) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    const std::string common = std::string("--preset ") + arch + "-tiny --layers 8 --type q4_k_m --quiet";
    std::string exact = generate(common, std::string(arch) + "-exact.gguf");
    std::string fast1 = generate(common + " --fast --threads 1", std::string(arch) + "-fast1.gguf");
    std::string fast2 = generate(common + " --fast --threads 2", std::string(arch) + "-fast2.gguf");
    expect_same_structure(fast1, exact);
    EXPECT_EQ(fs::file_size(fast1), fs::file_size(exact)) << arch;
    EXPECT_EQ(slurp(fast1), slurp(fast2)) << arch << ": --fast depends on the thread count";
    EXPECT_NE(slurp(fast1), slurp(exact)) << arch;
    // Rows differ from each other: two experts of one tensor are not copies.
    auto f = GgufFile::open(fast1);
    const auto* up = f->find_tensor("blk.0.ffn_up_exps.weight");
    ASSERT_NE(up, nullptr);
    const size_t per_expert = up->nbytes / size_t(up->ne[2]);
    const auto* bytes = static_cast<const uint8_t*>(up->data);
    EXPECT_NE(std::memcmp(bytes, bytes + per_expert, per_expert), 0) << arch;
    std::string why = cannot_run(fast1);
    if (!why.empty()) continue;  // qwen35moe before the runtime supports it
    expect_finite_logits(fast1, 1024);
  }
}

TEST(ModelGen, HelpTellsPresetsAndArchitectures) {
  Result h = run("tessera-gen", "--help");
  ASSERT_EQ(h.status, 0);
  for (const char* p : {"default", "tiny", "tinyllama-1.1b", "llama2-7b", "qwen3moe-tiny", "qwen3-30b-a3b",
                        "qwen35moe-tiny", "qwen3.5-35b-a3b", "llama", "qwen3moe", "qwen35moe", "q4_k_m"})
    EXPECT_NE(h.out.find(p), std::string::npos) << p;
  Result l = run("tessera-gen", "--list-presets");
  ASSERT_EQ(l.status, 0);
  EXPECT_NE(l.out.find("qwen3.5-35b-a3b"), std::string::npos);
  // Progress and the size estimate go to stderr, before the data.
  Result g = run("tessera-gen", "--preset qwen3moe-tiny --out " + scratch() + "/m.gguf");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_NE(g.err.find("estimated file size"), std::string::npos) << g.err;
  EXPECT_TRUE(g.out.empty());
  EXPECT_TRUE(fs::exists(scratch() + "/m.gguf"));
  EXPECT_FALSE(fs::exists(scratch() + "/m.gguf.part")) << "written under a temporary name, then renamed";
  // Bad overrides are one-line errors.
  Result bad = run("tessera-gen", "--preset tiny --experts 4 --out " + scratch() + "/x.gguf");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("MoE preset"), std::string::npos) << bad.err;
  Result missing = run("tessera-gen", "--preset tiny");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("--out"), std::string::npos) << missing.err;
}

}  // namespace
