// Issue 24: nothing a file, a flag or a plugin does may exhaust, crash, hang or
// silently mislead tessera. Each case copies a fixture with one thing made hostile
// (a metadata value, a tensor's data, an extra tensor) and checks the model code or
// the `tessera` CLI refuses it with one line naming the key, tensor or file — in
// bounded time and memory where the old behaviour was exhaustion.
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <pty.h>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "gguf_reader.h"
#include "gguf_writer.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/tensor_scan.h"
#include "tessera/quant_blocks.h"

namespace {
namespace fs = std::filesystem;
using tessera::gguf::GgufFile;
using tessera::gguf::GgufWriter;

std::string fixture(const std::string& rel) { return std::string(TESSERA_FIXTURES_DIR) + "/models/" + rel; }

#define REQUIRE_FIXTURE(name)                                                     \
  if (!fs::exists(fixture(name))) GTEST_SKIP() << fixture(name) << " is missing"

// A folder of its own per test and process (ctest runs the tests in parallel).
std::string test_dir() {
  const std::string dir = testing::TempDir() + "/tessera_hardening_" + std::to_string(getpid()) + "_" +
                          testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using MetaEdit = std::function<void(GgufWriter&)>;
// (name, type, bytes): may change the bytes (same size).
using TensorEdit = std::function<void(const std::string&, tessera::DType, std::vector<uint8_t>&)>;

// `src` (a fixture) rewritten to `dst` with its metadata and tensor data edited.
std::string rewrite(const std::string& src, const std::string& dst, const MetaEdit& meta,
                    const TensorEdit& tensors = nullptr, const MetaEdit& extra = nullptr) {
  auto f = GgufFile::open(src);
  GgufWriter w(f->version());
  for (const auto& k : f->key_order()) w.set(k, *f->metadata().find(k));
  for (const auto& t : f->tensors()) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t> bytes(p, p + t.nbytes);
    if (tensors) tensors(t.name, t.type, bytes);
    w.add_tensor_raw(t.name, uint32_t(t.type), t.ne, std::move(bytes));
  }
  if (meta) meta(w);
  if (extra) extra(w);
  w.write_file(dst);
  return dst;
}

struct Result {
  int status = -1;
  std::string out, err;
  double seconds = 0;
  long max_rss_kib = 0;
};

// Runs bin/tessera with `args` (no shell), stdout to `out_path` (default: a file),
// measuring wall time and the child's peak RSS (wait4).
Result run_tessera(const std::vector<std::string>& args, const std::string& out_path = "") {
  const std::string dir = test_dir();
  const std::string out = out_path.empty() ? dir + "/out.txt" : out_path, err = dir + "/err.txt";
  std::vector<std::string> argv_s{std::string(TESSERA_BIN_DIR) + "/tessera"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    int fo = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0) _exit(126);
    dup2(fo, 1);
    dup2(fe, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  Result r;
  int st = 0;
  struct rusage ru {};
  wait4(pid, &st, 0, &ru);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.max_rss_kib = ru.ru_maxrss;
  if (out_path.empty()) r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// The time and memory bounds of a refusal: 1 s and 100 MiB in a normal build; a
// sanitizer build (shadow memory, slow allocation) gets 10 s and 1 GiB, still far
// below the 17-40 s and 13-16 GB of the behaviour they guard against.
// GCC defines __SANITIZE_ADDRESS__; clang (the sanitizer build's compiler) says it
// through __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(TESSERA_TEST_ASAN)
constexpr double kRefuseSeconds = 10.0;
constexpr long kRefuseKiB = 1024 * 1024;
#else
constexpr double kRefuseSeconds = 1.0;
constexpr long kRefuseKiB = 100 * 1024;
#endif

// Each test's folder of hostile copies is removed after it.
class Hardening : public testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(test_dir(), ec);
  }
};

// ---------------------------------------------------------------------------------
// Validate before allocating.

struct ArchFixture {
  const char* file;
  const char* arch;
};
constexpr ArchFixture kArchFixtures[] = {
    {"llama-q4_0.gguf", "llama"},       {"qwen2-q8_0.gguf", "qwen2"},         {"qwen3-q8_0.gguf", "qwen3"},
    {"qwen3moe-q4_0.gguf", "qwen3moe"}, {"qwen35moe-q4_0.gguf", "qwen35moe"},
};

// Before: 10M layers took 17-40 s and ~13-16 GB before "missing tensor"; 0xffffffff
// ended in a bare "out of memory". Now refused from the tensor table at once.
TEST_F(Hardening, HugeBlockCountIsRefusedFastInLittleMemory) {
  int tested = 0;
  for (const auto& a : kArchFixtures) {
    if (!fs::exists(fixture(a.file))) continue;
    for (uint32_t blocks : {10000000u, 0xffffffffu}) {
      const std::string key = std::string(a.arch) + ".block_count";
      const std::string f = rewrite(fixture(a.file), test_dir() + "/" + a.arch + ".gguf",
                                    [&](GgufWriter& w) { w.set_u32(key, blocks); });
      for (const auto& args : {std::vector<std::string>{"info", f},
                               std::vector<std::string>{"run", "-m", f, "-p", "hi", "-n", "1", "--threads", "1"}}) {
        Result r = run_tessera(args);
        const std::string text = args[0] == "info" ? r.out : r.err;
        EXPECT_TRUE(has(text, "hyperparameter " + key + " = " + std::to_string(blocks) + " exceeds"))
            << args[0] << " " << a.file << "\n" << r.out << r.err;
        EXPECT_LT(r.seconds, kRefuseSeconds) << args[0] << " " << a.file;
        EXPECT_LT(r.max_rss_kib, kRefuseKiB) << args[0] << " " << a.file << ": peak RSS in KiB";
        if (args[0] == "run") {
          EXPECT_NE(r.status, 0);
          EXPECT_EQ(lines(r.err), 1) << r.err;
        }
      }
      ++tested;
    }
  }
  if (!tested) GTEST_SKIP() << "no fixtures";
}

// Model::load on a copy of `file` with `edit` applied; returns the error ("" if none).
std::string load_error(const std::string& file, const MetaEdit& edit, const TensorEdit& tensors = nullptr) {
  const std::string f = rewrite(fixture(file), test_dir() + "/edited.gguf", edit, tensors);
  try {
    auto gf = GgufFile::open(f);
    tessera::Model::load(*gf);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

struct BadValue {
  const char* file;
  const char* key;
  std::function<void(GgufWriter&, const std::string&)> set;
  const char* expect;  // in the message, besides the key
};

// Every refusal names the key and its value. Several of these were undefined
// behaviour (signed overflow) or a late, unrelated error before.
TEST_F(Hardening, BadHyperparametersAreRefusedNamingKeyAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto u32 = [](uint32_t v) { return [v](GgufWriter& w, const std::string& k) { w.set_u32(k, v); }; };
  auto u64 = [](uint64_t v) { return [v](GgufWriter& w, const std::string& k) { w.set_u64(k, v); }; };
  auto i32 = [](int32_t v) { return [v](GgufWriter& w, const std::string& k) { w.set_i32(k, v); }; };
  auto f32 = [](double v) { return [v](GgufWriter& w, const std::string& k) { w.set_f32(k, float(v)); }; };
  auto f64 = [](double v) { return [v](GgufWriter& w, const std::string& k) { w.set_f64(k, v); }; };
  const BadValue cases[] = {
      {"llama-q4_0.gguf", "llama.block_count", u32(0), "= 0 must be positive"},
      {"llama-q4_0.gguf", "llama.block_count", i32(-3), "= -3 must be positive"},
      {"llama-q4_0.gguf", "llama.attention.layer_norm_rms_epsilon", f32(nan), "= nan must be a finite positive"},
      {"llama-q4_0.gguf", "llama.attention.layer_norm_rms_epsilon", f32(-1e-5), "must be a finite positive"},
      {"llama-q4_0.gguf", "llama.attention.layer_norm_rms_epsilon", f64(1e-60), "must be a finite positive"},
      {"llama-q4_0.gguf", "llama.rope.freq_base", f32(inf), "= inf must be a finite positive"},
      {"llama-q4_0.gguf", "llama.rope.freq_base", f32(0), "= 0 must be a finite positive"},
      {"llama-q4_0.gguf", "llama.rope.freq_base", f64(1e300), "must be a finite positive"},
      {"llama-q4_0.gguf", "llama.attention.head_count", u64(uint64_t(1) << 40), "exceeds 2^31 - 1"},
      {"llama-q4_0.gguf", "llama.attention.head_count", u32(3000000), "exceeds the largest tensor dimension"},
      {"llama-q4_0.gguf", "llama.attention.key_length", u32(0x7fffffff), "exceeds the largest tensor dimension"},
      {"llama-q4_0.gguf", "llama.embedding_length", u32(0), "= 0 must be positive"},
      {"llama-q4_0.gguf", "llama.context_length", u64(uint64_t(1) << 40), "must be between 1 and 2^31 - 1"},
      {"llama-q4_0.gguf", "llama.rope.dimension_count", u32(7), "= 7 is invalid for head size"},
      {"qwen3-q8_0.gguf", "qwen3.attention.layer_norm_rms_epsilon", f32(nan), "= nan must be a finite positive"},
      {"qwen3moe-q4_0.gguf", "qwen3moe.expert_count", u32(1u << 30), "exceeds the largest tensor dimension"},
      {"qwen3moe-q4_0.gguf", "qwen3moe.rope.freq_base", f32(-inf), "= -inf must be a finite positive"},
      // The two signed overflows UBSan found: ssm.state_size x ssm.time_step_rank, and
      // the int32 sum of rope sections.
      {"qwen35moe-q4_0.gguf", "qwen35moe.ssm.state_size", u32(0x7fffffff), "exceeds the largest tensor dimension"},
      {"qwen35moe-q4_0.gguf", "qwen35moe.ssm.time_step_rank", u64(uint64_t(1) << 62), "exceeds 2^31 - 1"},
      {"qwen35moe-q4_0.gguf", "qwen35moe.rope.dimension_sections",
       [](GgufWriter& w, const std::string& k) { w.set_i32_array(k, {0x7fffffff, 0x7fffffff, 4, 0}); },
       "must hold integers between 0 and rope.dimension_count / 2"},
      {"qwen35moe-q4_0.gguf", "qwen35moe.full_attention_interval", u32(1000), "= 1000 must be between 1 and block_count"},
      {"qwen35moe-q4_0.gguf", "qwen35moe.attention.layer_norm_rms_epsilon", f32(nan), "= nan must be a finite"},
  };
  int tested = 0;
  for (const auto& c : cases) {
    if (!fs::exists(fixture(c.file))) continue;
    const std::string key = c.key;
    const std::string err = load_error(c.file, [&](GgufWriter& w) { c.set(w, key); });
    EXPECT_TRUE(has(err, "hyperparameter " + key)) << key << ": " << err;
    EXPECT_TRUE(has(err, c.expect)) << key << ": " << err;
    ++tested;
  }
  if (!tested) GTEST_SKIP() << "no fixtures";
}

// The fixtures themselves load, and use every tensor they have.
TEST_F(Hardening, FixturesLoadWithoutUnusedTensors) {
  const fs::path dir = fs::path(TESSERA_FIXTURES_DIR) / "models";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " is missing";
  // Fixtures of architectures this build does not run yet (the shared folder grows ahead
  // of tessera) are listed, not loaded; every other one must load with no unused tensor.
  const std::vector<std::string> supported = tessera::Model::supported_architectures();
  int n = 0;
  std::string not_yet;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf") continue;
    auto f = GgufFile::open(e.path().string());
    const auto* arch = f->metadata().find("general.architecture");
    ASSERT_NE(arch, nullptr) << e.path();
    const std::string* name = arch->as_string();
    ASSERT_NE(name, nullptr) << e.path();
    if (std::find(supported.begin(), supported.end(), *name) == supported.end()) {
      not_yet += " " + e.path().filename().string();
      continue;
    }
    auto m = tessera::Model::load(*f);
    EXPECT_TRUE(m->unused_tensors().empty()) << e.path() << ": " << m->unused_tensors().front();
    ++n;
  }
  EXPECT_GT(n, 0);
  if (!not_yet.empty()) std::printf("not loaded (architecture not supported yet):%s\n", not_yet.c_str());
}

// A tensor the architecture does not read is reported (info lists it; loading warns
// with its name), never ignored silently.
TEST_F(Hardening, UnusedTensorIsReported) {
  REQUIRE_FIXTURE("llama-q8_0.gguf");
  const std::vector<float> junk(64, 1.f);
  const std::string f = rewrite(fixture("llama-q8_0.gguf"), test_dir() + "/extra.gguf", nullptr, nullptr,
                                [&](GgufWriter& w) {
                                  w.add_tensor("blk.0.mystery.weight", tessera::DType::F32, {64}, junk.data(),
                                               junk.size() * 4);
                                });
  auto gf = GgufFile::open(f);
  auto m = tessera::Model::load(*gf);
  EXPECT_EQ(m->unused_tensors(), std::vector<std::string>{"blk.0.mystery.weight"});
  Result info = run_tessera({"info", f});
  EXPECT_EQ(info.status, 0);
  EXPECT_TRUE(has(info.out, "unused:") && has(info.out, "blk.0.mystery.weight")) << info.out;
  Result run = run_tessera({"run", "-m", f, "-p", "hi", "-n", "1", "--threads", "1", "--seed", "1"});
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(has(run.err, "[warning]") && has(run.err, "blk.0.mystery.weight") && has(run.err, "does not use"))
      << run.err;
}

// ---------------------------------------------------------------------------------
// Silent garbage: NaN/Inf weights and logits.

// One value of `tensor` (F32 or F16 data, or the first block's scale of a Q8_0, Q4_K,
// Q5_K or Q6_K tensor) set to NaN / inf.
TensorEdit poison(const std::string& tensor, double value) {
  return [tensor, value](const std::string& name, tessera::DType type, std::vector<uint8_t>& b) {
    if (name != tensor) return;
    using tessera::DType;
    if (type == DType::F32) {
      const float v = float(value);
      std::memcpy(b.data() + 5 * 4, &v, 4);
    } else if (type == DType::F16 || type == DType::Q8_0 || type == DType::Q4_K || type == DType::Q5_K ||
               type == DType::Q6_K) {
      // The fp16 scale d: a Q8_0, Q4_K or Q5_K block's first 2 bytes, a Q6_K block's last 2.
      const uint16_t h = std::isnan(value) ? 0x7e00 : value > 0 ? 0x7c00 : 0xfc00;
      const size_t at = type == DType::F16 ? 10 : type == DType::Q6_K ? 208 : 0;
      std::memcpy(b.data() + at, &h, 2);
    } else {
      FAIL() << "poison: unhandled type";
    }
  };
}

TEST_F(Hardening, NonFiniteWeightsAreFoundByCheckTensors) {
  REQUIRE_FIXTURE("llama-f32.gguf");
  const std::string dir = test_dir();
  const std::string f = rewrite(fixture("llama-f32.gguf"), dir + "/nan.gguf", nullptr,
                                poison("blk.0.attn_q.weight", std::nan("")));
  auto gf = GgufFile::open(f);
  const auto bad = tessera::find_non_finite_tensors(*gf);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].name, "blk.0.attn_q.weight");
  EXPECT_EQ(bad[0].count, 1);
  EXPECT_EQ(bad[0].first, 5);

  Result info = run_tessera({"info", f, "--check-tensors"});
  EXPECT_EQ(info.status, 1);
  EXPECT_TRUE(has(info.out, "tensor 'blk.0.attn_q.weight' (f32) holds 1 non-finite value (first: nan at element 5)"))
      << info.out;
  EXPECT_EQ(lines(info.err), 1) << info.err;
  Result run = run_tessera({"run", "-m", f, "-p", "hi", "-n", "2", "--check-tensors", "--threads", "1"});
  EXPECT_NE(run.status, 0);
  EXPECT_EQ(lines(run.err), 1) << run.err;
  EXPECT_TRUE(has(run.err, "--check-tensors") && has(run.err, "blk.0.attn_q.weight")) << run.err;
  EXPECT_EQ(run.out, "") << "nothing runs";

  // F16 infinity and a quantized block's NaN scale.
  if (fs::exists(fixture("llama-f16.gguf"))) {
    auto g = GgufFile::open(rewrite(fixture("llama-f16.gguf"), dir + "/inf.gguf", nullptr,
                                    poison("blk.1.ffn_down.weight", -INFINITY)));
    const auto b = tessera::find_non_finite_tensors(*g);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].name, "blk.1.ffn_down.weight");
    EXPECT_TRUE(std::isinf(b[0].first_value) && b[0].first_value < 0);
  }
  if (fs::exists(fixture("llama-q8_0.gguf"))) {
    auto g = GgufFile::open(rewrite(fixture("llama-q8_0.gguf"), dir + "/q8.gguf", nullptr,
                                    poison("blk.0.ffn_up.weight", std::nan(""))));
    const auto b = tessera::find_non_finite_tensors(*g);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].name, "blk.0.ffn_up.weight");
    EXPECT_EQ(b[0].first, 0);
    EXPECT_GE(b[0].count, 1);  // the block's values that are not 0 x NaN... all NaN
  }
  // And clean fixtures pass.
  Result clean = run_tessera({"info", fixture("llama-f32.gguf"), "--check-tensors"});
  EXPECT_EQ(clean.status, 0) << clean.err;
  EXPECT_TRUE(has(clean.out, "is finite")) << clean.out;
}

// Before: a NaN norm weight gave all-zero logits and text without a word (the
// activation quantizers turned the NaN into zeros). Vectors are now read at every load:
// the file is refused with its tensor named, without --check-tensors.
TEST_F(Hardening, NonFiniteNormIsRefusedAtLoad) {
  REQUIRE_FIXTURE("llama-f32.gguf");
  for (const char* file : {"llama-q8_0.gguf", "llama-f32.gguf"}) {
    if (!fs::exists(fixture(file))) continue;
    const std::string f = rewrite(fixture(file), test_dir() + "/nan.gguf", nullptr,
                                  poison("output_norm.weight", std::nan("")));
    auto g = GgufFile::open(f);
    const auto bad = tessera::find_non_finite_vectors(*g);
    ASSERT_EQ(bad.size(), 1u) << file;
    EXPECT_EQ(bad[0].name, "output_norm.weight");
    for (const char* backend : {"cpu_scalar", "cpu_avx512"}) {
      Result r = run_tessera({"run", "-m", f, "-p", "hello", "-n", "4", "--backend", backend, "--threads", "1"});
      if (has(r.err, "not usable") || has(r.err, "no usable")) continue;  // a CPU without AVX-512
      EXPECT_NE(r.status, 0) << file << " " << backend;
      EXPECT_EQ(lines(r.err), 1) << r.err;
      EXPECT_TRUE(has(r.err, "tensor 'output_norm.weight' (f32) holds 1 non-finite value (first: nan at element 5)"))
          << r.err;
      EXPECT_EQ(r.out, "") << "nothing runs";
    }
    Result l = run_tessera({"logits", "-m", f, "--tokens", "1,2,3", "--out", test_dir() + "/l.bin", "--threads", "1"});
    EXPECT_NE(l.status, 0);
    EXPECT_TRUE(has(l.err, "output_norm.weight")) << l.err;
    EXPECT_FALSE(fs::exists(test_dir() + "/l.bin"));
  }
}

// A NaN that only the matrices hold (a block scale of blk.0.attn_q) makes one query
// element NaN, so one head's attention output; the next product quantizes it as an
// activation. Before, the quantizers turned it into zeros and the logits were finite;
// now the block's NaN scale reaches the logits and the step stops generation with an
// error naming it. Q8_0 and K-quant (Q8_K activations) files, on both CPU backends.
TEST_F(Hardening, NonFiniteActivationStopsGeneration) {
  REQUIRE_FIXTURE("llama-q8_0.gguf");
  int ran = 0;
  for (const char* file : {"llama-q8_0.gguf", "llama-q4_k_m.gguf"}) {
    if (!fs::exists(fixture(file))) continue;
    const std::string f = rewrite(fixture(file), test_dir() + "/nan.gguf", nullptr,
                                  poison("blk.0.attn_q.weight", std::nan("")));
    for (const char* backend : {"cpu_scalar", "cpu_avx512"}) {
      Result r = run_tessera({"run", "-m", f, "-p", "hello", "-n", "4", "--backend", backend, "--strict-backend",
                              "--threads", "1"});
      if (has(r.err, "not usable") || has(r.err, "no usable")) continue;  // a CPU without AVX-512
      ++ran;
      EXPECT_NE(r.status, 0) << file << " " << backend;
      EXPECT_EQ(lines(r.err), 1) << r.err;
      EXPECT_TRUE(has(r.err, "non-finite logits at forward step 1 (sequence ")) << file << " " << backend << ": " << r.err;
      EXPECT_TRUE(has(r.err, "position ")) << r.err;
    }
    Result l = run_tessera({"logits", "-m", f, "--tokens", "1,2,3", "--out", test_dir() + "/l.bin", "--threads", "1"});
    EXPECT_NE(l.status, 0);
    EXPECT_TRUE(has(l.err, "non-finite logits")) << l.err;
    EXPECT_FALSE(fs::exists(test_dir() + "/l.bin"));
  }
  EXPECT_GT(ran, 0);
}

// A norm weight of zeros (finite, so no load check sees it) zeroes the final hidden
// state: every logit is 0. Such a row is reported as degenerate, not sampled.
TEST_F(Hardening, DegenerateLogitsStopGeneration) {
  REQUIRE_FIXTURE("llama-f32.gguf");
  const std::string f = rewrite(fixture("llama-f32.gguf"), test_dir() + "/zero.gguf", nullptr,
                                [](const std::string& name, tessera::DType, std::vector<uint8_t>& b) {
                                  if (name == "output_norm.weight") std::fill(b.begin(), b.end(), uint8_t(0));
                                });
  Result r = run_tessera({"run", "-m", f, "-p", "hello", "-n", "4", "--threads", "1"});
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_TRUE(has(r.err, "degenerate logits at forward step 1 (sequence ")) << r.err;
  EXPECT_TRUE(has(r.err, "all 1024 values are equal (0.000000)")) << r.err;
  Result l = run_tessera({"logits", "-m", f, "--tokens", "1,2,3", "--out", test_dir() + "/l.bin", "--threads", "1"});
  EXPECT_NE(l.status, 0);
  EXPECT_TRUE(has(l.err, "degenerate logits")) << l.err;
}

// ---------------------------------------------------------------------------------
// Metadata shown to a person is escaped.

TEST_F(Hardening, PrintableEscapesControlsAndBadUtf8) {
  using tessera::printable;
  EXPECT_EQ(printable("plain text"), "plain text");
  EXPECT_EQ(printable("a\x1b[31mred\x07\n"), "a\\x1b[31mred\\x07\\x0a");
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // valid UTF-8 stays
  EXPECT_EQ(printable("csi\xc2\x9b" "2J"), "csi\\xc2\\x9b2J");                     // C1 CSI, UTF-8 encoded
  EXPECT_EQ(printable("raw\x9b"), "raw\\x9b");                                    // not UTF-8
  EXPECT_EQ(printable("\xe2\x80\xae" "evil"), "\\u{202e}evil");                   // bidi override
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");                        // a surrogate
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                                 // overlong
  EXPECT_EQ(printable(std::string(100, 'x'), 10), std::string(10, 'x') + "...");
}

TEST_F(Hardening, EscapesInMetadataAreNotPrintedRaw) {
  REQUIRE_FIXTURE("llama-q8_0.gguf");
  const std::string dir = test_dir();
  const std::string f = rewrite(fixture("llama-q8_0.gguf"), dir + "/esc.gguf", [](GgufWriter& w) {
    w.set_string("general.name", "evil\x1b]0;pwned\x07\x1b[2J\r\nname");
    w.set_string("general.\x1b[31mkey", "x");
  });
  Result r = run_tessera({"info", f, "--metadata"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(has(r.out, "\x1b") || has(r.out, "\x07") || has(r.out, "\r")) << r.out;
  EXPECT_TRUE(has(r.out, "evil\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x0aname")) << r.out;
  EXPECT_TRUE(has(r.out, "general.\\x1b[31mkey")) << r.out;

  // An architecture name with escapes, in an error message.
  const std::string g = rewrite(fixture("llama-q8_0.gguf"), dir + "/arch.gguf",
                                [](GgufWriter& w) { w.set_string("general.architecture", "ll\x1b[5mama\n"); });
  Result e = run_tessera({"run", "-m", g, "-p", "hi"});
  EXPECT_NE(e.status, 0);
  EXPECT_EQ(lines(e.err), 1) << e.err;
  EXPECT_FALSE(has(e.err, "\x1b")) << e.err;
  EXPECT_TRUE(has(e.err, "unsupported architecture 'll\\x1b[5mama\\x0a'")) << e.err;
  Result i = run_tessera({"info", g});
  EXPECT_FALSE(has(i.out, "\x1b")) << i.out;
}

// ---------------------------------------------------------------------------------
// Every output path checks its writes.

TEST_F(Hardening, WritesToAFullDeviceFail) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::vector<std::vector<std::string>> commands = {
      {"tokenize", "hello world"},
      {"info"},
      {"backends"},
      {"run", "-p", "hi", "-n", "2", "--threads", "1"},
      {"run", "--help"},
  };
  for (const auto& args : commands) {
    Result r = run_tessera(args, "/dev/full");
    EXPECT_NE(r.status, 0) << args[0];
    EXPECT_EQ(lines(r.err), 1) << args[0] << ": " << r.err;
    EXPECT_TRUE(has(r.err, "cannot write to standard output: No space left on device")) << args[0] << ": " << r.err;
  }
  Result l = run_tessera({"logits", "--tokens", "1,2,3", "--out", "/dev/full"});
  EXPECT_NE(l.status, 0);
  EXPECT_TRUE(has(l.err, "/dev/full: write failed: No space left on device")) << l.err;
}

// logits --out checks its folder before computing, writes under a temporary name and
// renames only when complete.
TEST_F(Hardening, LogitsOutputIsCheckedFirstAndWrittenAtomically) {
  const std::string dir = test_dir();
  std::ofstream(dir + "/a_file") << "x";
  // The model is one that would take long to refuse (or run): the path fails first.
  Result r = run_tessera({"logits", "-m", "/nonexistent.gguf", "--tokens", "1,2", "--out", dir + "/a_file/x.bin"});
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_TRUE(has(r.err, dir + "/a_file/x.bin: cannot create a file in")) << r.err;

  Result ok = run_tessera({"logits", "--tokens", "1,2,3", "--out", dir + "/l.bin", "--threads", "1"});
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_GT(fs::file_size(dir + "/l.bin"), 0u);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(has(e.path().filename().string(), ".tmp.")) << e.path();
}

// An interrupted logits run (SIGTERM while computing) leaves nothing behind.
TEST_F(Hardening, InterruptedLogitsLeaveNoFile) {
  REQUIRE_FIXTURE("qwen35moe-f16.gguf");
  const std::string dir = test_dir();
  std::string tokens;
  for (int i = 0; i < 4000; ++i) tokens.append(i ? "," : "").append(std::to_string(3 + i % 500));
  std::vector<std::string> argv_s{std::string(TESSERA_BIN_DIR) + "/tessera", "logits", "-m", fixture("qwen35moe-f16.gguf"),
                                  "--tokens", tokens, "--ctx", "4096", "--out", dir + "/big.bin",
                                  "--backend", "cpu_scalar", "--threads", "1"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fe = open((dir + "/err.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fe, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  // Wait for the temporary to appear (created before the model loads), then a bit.
  bool seen = false;
  for (int i = 0; i < 1000 && !seen; ++i) {
    for (const auto& e : fs::directory_iterator(dir)) seen = seen || has(e.path().filename().string(), "big.bin.tmp.");
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(seen) << slurp(dir + "/err.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << "still computing when terminated";
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(has(e.path().filename().string(), "big.bin")) << e.path() << " left behind";
}

// ---------------------------------------------------------------------------------
// Limits with words.

TEST_F(Hardening, TooManyThreadsWarnOnce) {
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0) GTEST_SKIP();
  Result r = run_tessera({"run", "-p", "hi", "-n", "1", "--threads", std::to_string(hw + 1)});
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string w = "--threads " + std::to_string(hw + 1) + " exceeds the " + std::to_string(hw) + " hardware threads";
  const size_t at = r.err.find(w);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(w, at + 1), std::string::npos) << "warned twice: " << r.err;
  Result quiet = run_tessera({"run", "-p", "hi", "-n", "1", "--threads", "1"});
  EXPECT_FALSE(has(quiet.err, "[warning]")) << quiet.err;
}

// Before: bench -p 100000 on a 512-context model raised the context silently and
// prefilled for ~12 minutes without a word.
TEST_F(Hardening, ContextBeyondTrainingNeedsExplicitCtx) {
  REQUIRE_FIXTURE("llama-q8_0.gguf");  // trained context 512
  Result r = run_tessera({"bench", "-m", fixture("llama-q8_0.gguf"), "-p", "100000", "-n", "4", "-r", "1"});
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 5 * kRefuseSeconds);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_TRUE(has(r.err, "more than the model's trained context length 512") && has(r.err, "--ctx 100005")) << r.err;

  // An explicit --ctx beyond the trained length is accepted with a warning (a short
  // prompt inside it keeps the run quick under the sanitizers).
  Result ok = run_tessera({"bench", "-m", fixture("llama-q8_0.gguf"), "-p", "16", "-n", "2", "-r", "1", "--ctx", "700",
                           "--threads", "1", "--membw-mib", "0", "--peak-runs", "0", "--json"});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(has(ok.err, "--ctx 700 exceeds the model's trained context length 512")) << ok.err;
  Result small = run_tessera({"bench", "-m", fixture("llama-q8_0.gguf"), "-p", "600", "-n", "2", "--ctx", "300"});
  EXPECT_NE(small.status, 0);
  EXPECT_TRUE(has(small.err, "--ctx 300 is too small")) << small.err;
}

// Long prefill shows progress on a terminal (stderr a tty), and nothing when not.
TEST_F(Hardening, LongPrefillShowsProgressOnATerminal) {
  const std::string dir = test_dir();
  std::string prompt;
  // Four steps of 16 tokens: long enough to show progress, short enough for a sanitizer build.
  for (int i = 0; i < 16; ++i) prompt += "once upon a time ";
  const std::string out = dir + "/out.txt";
  std::vector<std::string> argv_s{std::string(TESSERA_BIN_DIR) + "/tessera", "run", "-p", prompt, "-n", "2",
                                  "--batch", "16", "--threads", "1", "--seed", "1"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fo = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);  // stdout to a file, stderr stays the terminal
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::string tty;
  char buf[4096];
  for (;;) {
    ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;
    tty.append(buf, size_t(n));
  }
  int st = 0;
  waitpid(pid, &st, 0);
  close(master);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << tty;
  EXPECT_TRUE(has(tty, "\r[prefill ") && has(tty, " tokens, ")) << tty;
  EXPECT_EQ(slurp(out).rfind(prompt, 0), 0u) << "the prompt is still echoed first";
  // Not a terminal: no progress.
  Result r = run_tessera({"run", "-p", prompt, "-n", "2", "--batch", "16", "--threads", "1", "--seed", "1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(has(r.err, "\r")) << r.err;
  EXPECT_EQ(r.out, slurp(out)) << "same text with and without a terminal";
}

// ---------------------------------------------------------------------------------
// A backend plugin whose create() fails is skipped; the next by rank takes its nodes.

TEST_F(Hardening, BackendThatFailsToCreateIsSkipped) {
  const fs::path plugins = fs::path(TESSERA_BIN_DIR).parent_path() / "test_plugins";
  if (!fs::exists(plugins / "test_good.so")) GTEST_SKIP() << "test plugins not built";
  const std::string toml = test_dir() + "/plugins.toml";
  std::ofstream(toml) << "[plugins]\npaths = [\"" << plugins.string() << "\"]\ndisable = [\"test_other\"]\n"
                      << "[backend.test_good]\nrank = 1000\noptions = { fail = \"1\" }\n";
  Result r = run_tessera({"run", "--plugins", toml, "-p", "hi", "-n", "2", "--threads", "1", "--seed", "1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "[warning] backend test_good skipped:") && has(r.err, "asked to fail") &&
              has(r.err, "the next backend by rank takes its nodes"))
      << r.err;
  EXPECT_EQ(r.out.rfind("hi", 0), 0u) << r.out;
  // Asked for alone, it is an error (nothing to fall back to that the user chose).
  Result alone = run_tessera({"run", "--plugins", toml, "--backend", "test_good", "-p", "hi", "-n", "2"});
  EXPECT_NE(alone.status, 0);
  EXPECT_EQ(lines(alone.err), 1) << alone.err;
  EXPECT_TRUE(has(alone.err, "create failed")) << alone.err;
}

// ---------------------------------------------------------------------------------
// A model file truncated while mapped: SIGBUS, now with a message naming the file.

TEST_F(Hardening, TruncatedWhileMappedNamesTheFile) {
  REQUIRE_FIXTURE("llama-q8_0.gguf");
  const std::string f = test_dir() + "/victim.gguf";
  fs::copy_file(fixture("llama-q8_0.gguf"), f);
  const std::string err = test_dir() + "/err.txt";
  pid_t pid = fork();
  if (pid == 0) {
    int fe = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fe, 2);
    auto gf = GgufFile::open(f);
    const auto& last = gf->tensors().back();
    if (truncate(f.c_str(), 0) != 0) _exit(3);
    volatile uint8_t sink = static_cast<const uint8_t*>(last.data)[last.nbytes - 1];  // past the new end
    (void)sink;
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the read past the end succeeded?";
  EXPECT_TRUE(WIFSIGNALED(st) || WIFEXITED(st));
  const std::string e = slurp(err);
  EXPECT_TRUE(has(e, "tessera: fatal: model file " + f + " changed while in use")) << e;
}

}  // namespace
