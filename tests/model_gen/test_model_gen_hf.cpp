// tessera-gen --format hf (issue 25): the Hugging Face checkpoint folder opens with
// tessera's loader with the right names, shapes and dtypes; it is the same model as the
// GGUF file of the same flags (same bytes per tensor, llama's q/k rows in rotate-half
// order, same logits); sharding gives shards plus an index as save_pretrained does; what
// the format cannot hold is refused; the writer streams and leaves nothing behind.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "gguf_reader.h"
#include "hf_model.h"
#include "safetensors_reader.h"
#include "safetensors_writer.h"
#include "tessera/dtype.h"
#include "tessera/model.h"
#include "tessera/model_description.h"

namespace {
namespace fs = std::filesystem;
using tessera::DType;
using tessera::ModelDescription;
using tessera::TensorInfo;

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
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string test = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : test)
    if (!isalnum(uint8_t(c))) c = '_';
  std::string dir = testing::TempDir() + "/tessera_model_gen_hf_" + std::to_string(getpid()) + "_" + test;
  fs::create_directories(dir);
  scratch_dirs().insert(dir);
  return dir;
}

const std::string kBin = TESSERA_BIN_DIR;

Result run(const std::string& tool, const std::string& args) {
  std::string dir = scratch();
  std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = kBin + "/" + tool + " " + args + " >" + out + " 2>" + err;
  int rc = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Generates into the test's scratch folder; returns the path of the folder or file.
std::string generate(const std::string& args, const std::string& name) {
  std::string path = scratch() + "/" + name;
  Result r = run("tessera-gen", args + " --quiet --out " + path);
  EXPECT_EQ(r.status, 0) << "tessera-gen " << args << "\n" << r.err;
  return path;
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

std::map<std::string, const TensorInfo*> by_name(const ModelDescription& d) {
  std::map<std::string, const TensorInfo*> m;
  for (const auto& t : d.tensors) m[t.name] = &t;
  return m;
}

std::vector<float> read_f32(const std::string& path) {
  const std::string bytes = slurp(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// `tessera logits` of a few tokens on the scalar backend.
std::vector<float> logits(const std::string& model, const std::string& tokens = "1,17,300,42,5,99") {
  const std::string out = scratch() + "/logits_" + std::to_string(std::hash<std::string>()(model)) + ".f32";
  Result r = run("tessera", "logits -m " + model + " --tokens " + tokens + " --out " + out +
                                " --backend cpu_scalar --threads 2");
  EXPECT_EQ(r.status, 0) << r.err;
  return read_f32(out);
}

// ---- the folder ----------------------------------------------------------------

TEST(HfFormat, FolderOpensWithTheLoaderWithTransformersNamesShapesAndDtypes) {
  const std::string dir = generate("--preset tiny --type bf16 --format hf", "tiny-hf");
  EXPECT_EQ(listing(dir), (std::set<std::string>{"config.json", "model.safetensors"}))
      << "one shard: model.safetensors and no index, like save_pretrained";

  const nlohmann::json cfg = nlohmann::json::parse(slurp(dir + "/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["hidden_size"], 256);
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_attention_heads"], 4);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["head_dim"], 64);
  EXPECT_EQ(cfg["intermediate_size"], 512);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["hidden_act"], "silu");
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["rms_norm_eps"].get<double>(), 1e-5) << "the float's shortest decimal, not its widened double";
  EXPECT_EQ(cfg["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(cfg["max_position_embeddings"], 2048);

  // The raw file: header size a multiple of 8, __metadata__ {"format": "pt"}, and the
  // entries in transformers' [out, in] shapes.
  const std::string file = dir + "/model.safetensors";
  const std::string bytes = slurp(file);
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ(header % 8, 0u);
  auto st = tessera::safetensors::SafetensorsFile::open(file);
  EXPECT_EQ(st->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> raw;
  uint64_t end = 0;
  for (const auto& t : st->tensors()) {
    raw[t.name] = {t.dtype, t.shape};
    EXPECT_EQ(t.file_offset % (t.dtype == "F32" ? 4 : 2), 0u) << t.name << ": aligned to its element size";
    EXPECT_EQ(t.file_offset, 8 + header + end) << t.name << ": tensors back to back";
    end += t.nbytes;
  }
  EXPECT_EQ(8 + header + end, bytes.size());
  using P = std::pair<std::string, std::vector<int64_t>>;
  EXPECT_EQ(raw.size(), 3u + 2 * 9);
  EXPECT_EQ(raw.at("model.embed_tokens.weight"), (P{"BF16", {912, 256}}));
  EXPECT_EQ(raw.at("lm_head.weight"), (P{"BF16", {912, 256}}));
  EXPECT_EQ(raw.at("model.norm.weight"), (P{"F32", {256}}));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(raw.at(p + "input_layernorm.weight"), (P{"F32", {256}}));
    EXPECT_EQ(raw.at(p + "post_attention_layernorm.weight"), (P{"F32", {256}}));
    EXPECT_EQ(raw.at(p + "self_attn.q_proj.weight"), (P{"BF16", {256, 256}}));
    EXPECT_EQ(raw.at(p + "self_attn.k_proj.weight"), (P{"BF16", {128, 256}}));
    EXPECT_EQ(raw.at(p + "self_attn.v_proj.weight"), (P{"BF16", {128, 256}}));
    EXPECT_EQ(raw.at(p + "self_attn.o_proj.weight"), (P{"BF16", {256, 256}}));
    EXPECT_EQ(raw.at(p + "mlp.gate_proj.weight"), (P{"BF16", {512, 256}}));
    EXPECT_EQ(raw.at(p + "mlp.up_proj.weight"), (P{"BF16", {512, 256}}));
    EXPECT_EQ(raw.at(p + "mlp.down_proj.weight"), (P{"BF16", {256, 512}}));
  }

  // The loader: every tensor used, the hyperparameters from config.json.
  auto f = tessera::hf::CheckpointFile::open(dir);
  const ModelDescription d = f->describe();
  EXPECT_EQ(d.architecture, "llama");
  EXPECT_EQ(d.hparams.get_int("block_count"), 2);
  EXPECT_EQ(d.hparams.get_int("attention.head_count_kv"), 2);
  EXPECT_EQ(d.hparams.get_bool("rope.qk_rotate_half"), true);
  auto m = tessera::Model::load(*f);
  EXPECT_TRUE(m->unused_tensors().empty());
}

TEST(HfFormat, Qwen3MoeFolderHasOneTensorPerExpert) {
  const std::string dir =
      generate("--preset qwen3moe-tiny --type f16 --format hf --experts 4 --experts-used 2", "qwen3moe-hf");
  const nlohmann::json cfg = nlohmann::json::parse(slurp(dir + "/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(cfg["model_type"], "qwen3_moe");
  EXPECT_EQ(cfg["num_experts"], 4);
  EXPECT_EQ(cfg["num_experts_per_tok"], 2);
  EXPECT_EQ(cfg["moe_intermediate_size"], 256);
  EXPECT_EQ(cfg["norm_topk_prob"], true);
  EXPECT_EQ(cfg["decoder_sparse_step"], 1);
  EXPECT_EQ(cfg["mlp_only_layers"], nlohmann::json::array());
  EXPECT_EQ(cfg["torch_dtype"], "float16");
  EXPECT_EQ(cfg["rms_norm_eps"].get<double>(), 1e-6);

  auto ck = tessera::safetensors::Checkpoint::open(dir);
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> raw;
  for (const auto* t : ck->tensors()) raw[t->name] = {t->dtype, t->shape};
  using P = std::pair<std::string, std::vector<int64_t>>;
  const std::string p = "model.layers.1.";
  EXPECT_EQ(raw.at(p + "self_attn.q_proj.weight"), (P{"F16", {256, 256}}));
  EXPECT_EQ(raw.at(p + "self_attn.k_proj.weight"), (P{"F16", {128, 256}}));
  EXPECT_EQ(raw.at(p + "self_attn.q_norm.weight"), (P{"F32", {64}}));
  EXPECT_EQ(raw.at(p + "self_attn.k_norm.weight"), (P{"F32", {64}}));
  EXPECT_EQ(raw.at(p + "mlp.gate.weight"), (P{"F32", {4, 256}})) << "the router stays F32, as in the GGUF file";
  for (int e = 0; e < 4; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
    EXPECT_EQ(raw.at(x + "gate_proj.weight"), (P{"F16", {256, 256}}));
    EXPECT_EQ(raw.at(x + "up_proj.weight"), (P{"F16", {256, 256}}));
    EXPECT_EQ(raw.at(x + "down_proj.weight"), (P{"F16", {256, 256}}));
  }
  EXPECT_EQ(raw.count(p + "mlp.experts.4.gate_proj.weight"), 0u);
  EXPECT_EQ(raw.size(), 3u + 2 * (9 + 3 * 4));
  auto f = tessera::hf::CheckpointFile::open(dir);
  auto m = tessera::Model::load(*f);
  EXPECT_TRUE(m->unused_tensors().empty());
}

// ---- the same model as the GGUF file ------------------------------------------------

struct SameCase {
  const char* name;
  const char* flags;
};

void PrintTo(const SameCase& c, std::ostream* os) { *os << c.name << " (" << c.flags << ")"; }

class SameModel : public testing::TestWithParam<SameCase> {};

// Every GGUF tensor has its counterpart in the folder's description (loader's names) with
// the same dtype, shape and bytes, but llama's q/k rows, which are GGUF's interleaved rows
// in rotate-half order; and the logits of a few tokens agree within float rounding.
TEST_P(SameModel, AsTheGgufFileOfTheSameFlags) {
  const std::string flags = GetParam().flags;
  const std::string folder = generate(flags + " --format hf", "m-hf");
  const std::string gguf = generate(flags, "m.gguf");
  auto hf = tessera::hf::CheckpointFile::open(folder);
  auto gg = tessera::gguf::GgufFile::open(gguf);
  const ModelDescription h = hf->describe(), g = gg->describe();
  ASSERT_EQ(h.architecture, g.architecture);
  for (const char* key : {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                          "attention.head_count_kv", "context_length", "expert_count", "expert_used_count",
                          "expert_feed_forward_length"})
    if (g.hparams.find(key)) {
      EXPECT_EQ(h.hparams.get_int(key), g.hparams.get_int(key)) << key;
    }
  for (const char* key : {"rope.freq_base", "attention.layer_norm_rms_epsilon"})
    EXPECT_EQ(float(*h.hparams.get_float(key)), float(*g.hparams.get_float(key))) << key;

  const bool llama = g.architecture == "llama";
  const int64_t n_head = *g.hparams.get_int("attention.head_count");
  const int64_t n_head_kv = *g.hparams.get_int("attention.head_count_kv");
  auto ht = by_name(h);
  EXPECT_EQ(h.tensors.size(), g.tensors.size());
  for (const TensorInfo& t : g.tensors) {
    ASSERT_TRUE(ht.count(t.name)) << t.name << " has no counterpart in the folder";
    const TensorInfo& o = *ht.at(t.name);
    EXPECT_EQ(o.type, t.type) << t.name;
    ASSERT_EQ(o.ne, t.ne) << t.name;
    ASSERT_EQ(o.nbytes, t.nbytes) << t.name;
    const auto* a = static_cast<const uint8_t*>(o.data);
    const auto* b = static_cast<const uint8_t*>(t.data);
    const bool qk = t.name.find("attn_q.weight") != std::string::npos || t.name.find("attn_k.weight") != std::string::npos;
    if (!(llama && qk)) {
      EXPECT_EQ(std::memcmp(a, b, t.nbytes), 0) << t.name << ": bytes differ";
      continue;
    }
    // GGUF row j of a head of size d holds HF row j/2 + (j%2)*(d/2) of that head.
    const int64_t heads = t.name.find("attn_q") != std::string::npos ? n_head : n_head_kv;
    const int64_t rows = t.ne[1], d = rows / heads;
    const size_t rb = t.nbytes / size_t(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t j = r % d, hr = (r / d) * d + j / 2 + (j % 2) * (d / 2);
      ASSERT_EQ(std::memcmp(a + size_t(hr) * rb, b + size_t(r) * rb, rb), 0) << t.name << " GGUF row " << r;
    }
    EXPECT_NE(std::memcmp(a, b, t.nbytes), 0) << t.name << ": rows were not reordered";
  }

  // The logits agree within float rounding: rotate-half RoPE sums q.k over the head's
  // dimensions in another order, and F16 / BF16 matrices round their activations to the
  // weights' type (as ggml does), where one ulp can become one of F16's (measured: equal,
  // or a worst-row NMSE of 1.4e-7; a wrong row order gives NMSE of order 1).
  const std::vector<float> lh = logits(folder), lg = logits(gguf);
  ASSERT_EQ(lh.size(), lg.size());
  const size_t V = size_t(by_name(g).at("token_embd.weight")->ne[1]);
  ASSERT_TRUE(!lg.empty() && lg.size() % V == 0);
  double worst = 0;
  for (size_t r = 0; r < lg.size() / V; ++r) {
    const float* a = &lh[r * V];
    const float* b = &lg[r * V];
    double err = 0, ref = 0;
    size_t best = 0, second = V;
    for (size_t i = 0; i < V; ++i) {
      ASSERT_TRUE(std::isfinite(a[i]));
      err += double(a[i] - b[i]) * (a[i] - b[i]);
      ref += double(b[i]) * b[i];
      if (b[i] > b[best]) second = best, best = i;
      else if (i != best && (second == V || b[i] > b[second])) second = i;
    }
    ASSERT_GT(ref, 0.0);
    worst = std::max(worst, err / ref);
    if (b[best] - b[second] > 1e-2f) {
      EXPECT_EQ(std::max_element(a, a + V) - a, ptrdiff_t(best)) << "argmax of row " << r;
    }
  }
  RecordProperty("worst_row_nmse", std::to_string(worst));
  EXPECT_LE(worst, 1e-5) << "the folder and the GGUF file give different logits";
}

INSTANTIATE_TEST_SUITE_P(
    Flags, SameModel,
    testing::Values(SameCase{"llama_bf16", "--preset tiny --type bf16"},
                    SameCase{"llama_f16_gqa8", "--preset tinyllama-1.1b --embd 256 --heads 8 --kv-heads 1 --ff 512 "
                                               "--layers 2 --vocab-size 1024 --type f16 --seed 7"},
                    SameCase{"llama_f32_tied", "--preset default --type f32 --tied"},
                    SameCase{"qwen3moe_bf16", "--preset qwen3moe-tiny --type bf16"}),
    [](const testing::TestParamInfo<SameCase>& i) { return std::string(i.param.name); });

// ---- sharding --------------------------------------------------------------------------

TEST(HfFormat, SmallShardSizeGivesShardsAndAnIndex) {
  const std::string flags = "--preset tiny --type bf16 --format hf";
  const std::string dir = generate(flags + " --shard-size 1MB", "sharded");
  const std::string single = generate(flags, "single");
  std::set<std::string> files = listing(dir);
  ASSERT_TRUE(files.count("model.safetensors.index.json")) << "no index";
  EXPECT_FALSE(files.count("model.safetensors"));
  // 3.1 MiB of weights in shards of at most 10^6 bytes (tensors of at most 467 KB).
  const size_t n = files.size() - 2;
  EXPECT_GE(n, 4u);
  char name[64];
  for (size_t k = 1; k <= n; ++k) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
    EXPECT_TRUE(files.count(name)) << name;
  }

  const nlohmann::json idx = nlohmann::json::parse(slurp(dir + "/model.safetensors.index.json"));
  auto ck = tessera::safetensors::Checkpoint::open(dir);  // checks the index against the shards
  uint64_t total = 0;
  std::map<std::string, uint64_t> shard_bytes;
  for (const auto* t : ck->tensors()) {
    total += t->nbytes;
    shard_bytes[fs::path(t->file).filename().string()] += t->nbytes;
    EXPECT_EQ(idx["weight_map"][t->name], fs::path(t->file).filename().string()) << t->name;
  }
  EXPECT_EQ(idx["weight_map"].size(), ck->tensors().size());
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(shard_bytes.size(), n);
  for (const auto& [shard, bytes] : shard_bytes) EXPECT_LE(bytes, 1000000u) << shard;
  // In model order: the embeddings in the first shard, lm_head in the last.
  std::snprintf(name, sizeof name, "model-%05d-of-%05zu.safetensors", 1, n);
  EXPECT_EQ(idx["weight_map"]["model.embed_tokens.weight"], name);
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", n, n);
  EXPECT_EQ(idx["weight_map"]["lm_head.weight"], name);

  auto f = tessera::hf::CheckpointFile::open(dir);
  auto m = tessera::Model::load(*f);
  EXPECT_TRUE(m->unused_tensors().empty());
  EXPECT_EQ(logits(dir), logits(single)) << "sharding changes nothing but the files";
}

TEST(SafetensorsWriter, ShardsAsSavePretrainedSplits) {
  namespace st = tessera::gen::safetensors;
  auto e = [](const char* name, int64_t n) { return st::Entry{name, DType::F32, {n}}; };
  // 400 + 400 bytes fit a 1000-byte shard, 400 more do not; 2000 bytes go alone into a
  // shard of their own, closed at once (so before the open one, as huggingface_hub does);
  // the open shard then takes 100 + 100 more.
  const std::vector<st::Entry> entries = {e("a", 100), e("b", 100), e("c", 100), e("big", 500), e("d", 25),
                                          e("f", 25)};
  EXPECT_EQ(st::plan_shards(entries, 1000), (std::vector<std::vector<size_t>>{{0, 1}, {3}, {2, 4, 5}}));
  EXPECT_EQ(st::plan_shards(entries, uint64_t(1) << 40), (std::vector<std::vector<size_t>>{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(st::shard_name(0, 1), "model.safetensors");
  EXPECT_EQ(st::shard_name(1, 12), "model-00002-of-00012.safetensors");

  EXPECT_EQ(st::parse_size("5GB"), 5000000000u);
  EXPECT_EQ(st::parse_size("5G"), 5000000000u);
  EXPECT_EQ(st::parse_size("500mb"), 500000000u);
  EXPECT_EQ(st::parse_size("2GiB"), 2147483648u);
  EXPECT_EQ(st::parse_size("1.5KB"), 1500u);
  EXPECT_EQ(st::parse_size("4096"), 4096u);
  for (const char* bad : {"", "GB", "5XB", "0", "-1", "5 GB", "0.1"}) EXPECT_THROW(st::parse_size(bad), std::exception) << bad;

  // The header: F32 before the 2-byte types, offsets back to back, padded with spaces.
  const std::vector<st::Entry> mixed = {{"w", DType::BF16, {3, 3}}, {"n", DType::F32, {3}}, {"h", DType::F16, {1}}};
  const st::FileLayout l = st::layout_file(mixed, {0, 1, 2});
  EXPECT_EQ(l.order, (std::vector<size_t>{1, 0, 2}));
  EXPECT_EQ(l.offsets, (std::vector<uint64_t>{0, 12, 30}));
  EXPECT_EQ((l.header.size() - 8) % 8, 0u);
  EXPECT_EQ(l.file_size, l.header.size() + 32);
  const std::string json = l.header.substr(8);
  EXPECT_EQ(json.substr(json.find_last_not_of(' ') + 1), std::string(json.size() - 1 - json.find_last_not_of(' '), ' '));
  const nlohmann::json h = nlohmann::json::parse(json);
  EXPECT_EQ(h["n"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], nlohmann::json::array({3, 3}));
  EXPECT_EQ(h["w"]["data_offsets"], nlohmann::json::array({12, 30}));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_THROW(st::dtype_string(DType::Q8_0), std::exception);
}

// ---- refusals and folder handling ----------------------------------------------------------

TEST(HfFormat, RefusesWhatTheFolderCannotHold) {
  const std::string dir = scratch();
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"--preset qwen35moe-tiny --type bf16 --format hf", "qwen35moe is not supported"},
      {"--preset qwen3.5-35b-a3b --type bf16 --format hf", "qwen35moe is not supported"},
      {"--preset gemma3-tiny --type bf16 --format hf", "gemma3 is not supported"},
      {"--preset glm4moe-tiny --type bf16 --format hf", "glm4moe is not supported"},
      {"--preset tiny --type q4_k --format hf", "f32, f16 or bf16"},
      {"--preset tiny --type q8_0 --format hf", "f32, f16 or bf16"},
      {"--preset tiny --format hf", "f32, f16 or bf16"},  // the default type is q8_0
      {"--preset tiny --type bf16 --format hf --vocab x.gguf", "--vocab needs --format gguf"},
      {"--preset tiny --type bf16 --shard-size 1GB", "--shard-size needs --format hf"},
      {"--preset tiny --type bf16 --format hf --shard-size 5XB", "invalid size '5XB'"},
      {"--preset tiny --type bf16 --format onnx", "unknown --format 'onnx'"},
  };
  for (const Case& c : cases) {
    Result r = run("tessera-gen", c.args + " --out " + dir + "/out");
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << ": expected '" << c.expect << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_FALSE(fs::exists(dir + "/out")) << c.args;
    EXPECT_FALSE(fs::exists(dir + "/out.part")) << c.args;
  }
}

TEST(HfFormat, ReplacesOnlyAnEmptyFolderOrAPreviousCheckpoint) {
  const std::string dir = scratch(), out = dir + "/ckpt";
  const std::string flags = "--preset tiny --type bf16 --format hf --quiet --out " + out;
  // An empty folder is filled.
  fs::create_directories(out);
  ASSERT_EQ(run("tessera-gen", flags + " --shard-size 1MB").status, 0);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  // A previous checkpoint is replaced whole: its stale shards and index go.
  Result r = run("tessera-gen", flags + "/");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(listing(out), (std::set<std::string>{"config.json", "model.safetensors"}));
  EXPECT_FALSE(fs::exists(out + ".part"));
  // A folder holding anything else is refused and left as it was.
  std::ofstream(out + "/notes.txt") << "mine";
  r = run("tessera-gen", flags);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is not empty (it holds 'notes.txt')"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out + "/notes.txt"), "mine");
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  // A file is not a folder.
  std::ofstream(dir + "/file") << "x";
  r = run("tessera-gen", "--preset tiny --type bf16 --format hf --out " + dir + "/file");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir + "/file"), "x");
}

TEST(HfFormat, FailedWriteLeavesNothingBehind) {
  const std::string dir = scratch(), out = dir + "/limited";
  // A 1 MiB file-size limit, like a full disk: the first shard fails half way.
  const std::string cmd = "sh -c 'ulimit -f 2048; exec " + kBin + "/tessera-gen --preset tiny --type bf16 --format hf "
                          "--quiet --out " + out + "' 2>" + dir + "/err.txt";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc;
  const std::string err = slurp(dir + "/err.txt");
  EXPECT_NE(err.find("write failed"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".part"));
}

TEST(HfFormat, InterruptLeavesNothingBehind) {
  const std::string dir = scratch(), out = dir + "/big";
  const std::string gen = kBin + "/tessera-gen";
  // TinyLlama in bf16 (2.2 GB) with one thread: seconds of work, interrupted early.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::freopen("/dev/null", "w", stderr);
    execl(gen.c_str(), gen.c_str(), "--preset", "tinyllama-1.1b", "--type", "bf16", "--format", "hf", "--threads",
          "1", "--quiet", "--out", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string shard = out + ".part/model.safetensors";
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    std::error_code ec;
    started = fs::exists(shard, ec) && fs::file_size(shard, ec) > (1u << 20);
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(started) << "tessera-gen never started writing " << shard;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status;
  EXPECT_FALSE(fs::exists(out + ".part")) << "the temporary folder survived the interrupt";
  EXPECT_FALSE(fs::exists(out));
}

// ---- streaming, determinism, help ----------------------------------------------------------

// Memory stays at about one tensor: 48 layers of 4.5 MiB (216 MiB of weights, the largest
// tensor 1 MiB) are written by a process whose peak RSS is a small fraction of that.
TEST(HfFormat, StreamsOneTensorAtATime) {
  const std::string out = scratch() + "/deep";
  const std::string gen = kBin + "/tessera-gen";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(gen.c_str(), gen.c_str(), "--preset", "tiny", "--embd", "512", "--ff", "1024", "--layers", "48", "--type",
          "bf16", "--format", "hf", "--quiet", "--out", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  uint64_t weights = 0;
  for (const auto& e : fs::directory_iterator(out)) weights += e.file_size();
  EXPECT_GT(weights, 200u << 20);
  const uint64_t peak = uint64_t(ru.ru_maxrss) * 1024;
  RecordProperty("peak_rss_bytes", std::to_string(peak));
  EXPECT_LT(peak, 64u << 20) << "tessera-gen held " << peak << " bytes for " << weights << " bytes of weights";
}

TEST(HfFormat, DeterministicAcrossThreadCounts) {
  const std::string flags = "--preset qwen3moe-tiny --type bf16 --format hf --seed 3 --shard-size 4MB";
  const std::string a = generate(flags + " --threads 1", "a"), b = generate(flags + " --threads 2", "b");
  ASSERT_EQ(listing(a), listing(b));
  for (const auto& name : listing(a)) EXPECT_EQ(slurp(a + "/" + name), slurp(b + "/" + name)) << name;
}

TEST(HfFormat, HelpSaysWhatTheFolderHolds) {
  Result h = run("tessera-gen", "--help");
  ASSERT_EQ(h.status, 0);
  for (const char* s : {"--format", "--shard-size", "config.json", "model.safetensors.index.json", "no tokenizer.json",
                        "deepseek2 and gpt-oss are refused", "rotate-half", "f32, f16 or bf16"})
    EXPECT_NE(h.out.find(s), std::string::npos) << s;
  // A dry run says how many files, writes nothing.
  const std::string out = scratch() + "/dry";
  Result d = run("tessera-gen", "--preset tinyllama-1.1b --type bf16 --format hf --shard-size 1GB --dry-run --out " + out);
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_NE(d.err.find("in 3 safetensors files"), std::string::npos) << d.err;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
