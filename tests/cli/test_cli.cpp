// Runs the command-line tools as a user would: outputs, exit codes, and that every
// error is exactly one line on stderr.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/compute_peak.h"
#include "tessera/hwprobe.h"
#include "tessera/membw.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace {
namespace fs = std::filesystem;

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

Result run(const std::string& args, const std::string& tool = "tessera") {
  // Unique per test and process: ctest runs the tests of this file in parallel.
  std::string dir = testing::TempDir() + "/tessera_cli_" + std::to_string(getpid()) + "_" +
                    testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(dir);
  std::string out = dir + "/out.txt", err = dir + "/err.txt";
  std::string cmd = std::string(TESSERA_BIN_DIR) + "/" + tool + " " + args + " >" + out + " 2>" + err;
  int rc = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string fixture(const std::string& rel) { return std::string(TESSERA_FIXTURES_DIR) + "/" + rel; }

void expect_one_line_error(const std::string& args, const std::string& needle) {
  Result r = run(args);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_EQ(lines(r.err), 1) << args << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
}

TEST(Cli, HelpListsEveryCommand) {
  Result r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* c : {"run", "backends", "info", "tokenize", "logits", "bench"})
    EXPECT_NE(r.out.find(std::string("  ") + c), std::string::npos) << c;
  for (const char* a : {"llama", "qwen35moe", "gpt-oss", "glm4moe", "gemma3"})  // the architectures it runs
    EXPECT_NE(r.out.find(a), std::string::npos) << a;
  for (const char* c : {"run", "backends", "info", "tokenize", "logits", "bench"}) {
    Result h = run(std::string(c) + " --help");
    EXPECT_EQ(h.status, 0) << c;
    EXPECT_NE(h.out.find("usage: tessera " + std::string(c)), std::string::npos) << c;
  }
}

TEST(Cli, BackendsListsCpuScalarAsUsable) {
  Result r = run("backends");
  ASSERT_EQ(r.status, 0) << r.err;
  bool found = false;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("cpu_scalar ", 0) == 0) {
      found = true;
      EXPECT_NE(line.find(" yes "), std::string::npos) << line;
    }
  EXPECT_TRUE(found) << r.out;
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  expect_one_line_error("frobnicate", "unknown command");
  expect_one_line_error("run --no-such-option", "no-such-option");
  expect_one_line_error("run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf");
  expect_one_line_error("logits -m /nonexistent.gguf --tokens 1,2 --out /dev/null", "nonexistent");
  expect_one_line_error("logits --tokens 1,x,3 --out /dev/null", "invalid token id 'x'");
  expect_one_line_error("logits --tokens 1,99999999 --out /dev/null", "out of range");
  expect_one_line_error("run -p hi --backend no_such_backend", "no_such_backend");
  expect_one_line_error("run -p hi --top-p 1.5", "top");
  expect_one_line_error("bench -r 0", "-r");
  expect_one_line_error("info " + std::string(TESSERA_BIN_DIR) + "/tessera", "not a model file");

  // A file that claims to be GGUF but is truncated: the loader's message, one line.
  std::string bad = testing::TempDir() + "/tessera_truncated_" + std::to_string(getpid()) + ".gguf";
  std::string good = slurp(fs::path(TESSERA_BIN_DIR).parent_path() / "share/tessera/models/default.gguf");
  ASSERT_GT(good.size(), 100u);
  std::ofstream(bad, std::ios::binary) << good.substr(0, 100);
  expect_one_line_error("info " + bad, "truncated");
}

TEST(Cli, RunGeneratesWithTheBundledModel) {
  Result r = run("run -p \"Once upon a time\" -n 8 --seed 3 --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time").size());
  EXPECT_NE(r.err.find("seed 3"), std::string::npos) << r.err;
  // Same seed, same text.
  Result again = run("run -p \"Once upon a time\" -n 8 --seed 3 --threads 2");
  EXPECT_EQ(again.out, r.out);
  // Greedy is deterministic without a seed.
  EXPECT_EQ(run("run -p abc -n 6 --temp 0").out, run("run -p abc -n 6 --temp 0 --seed 99").out);
}

// `tessera bench ARGS --json` on the F16 fixture model with cpu_scalar and 2 threads.
nlohmann::json bench_json(const std::string& args) {
  Result r = run("bench -m " + fixture("models/qwen35moe-f16.gguf") + " " + args +
                 " --threads 2 --backend cpu_scalar --json");
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

// bench reports both decode rooflines: over a fresh buffer, and over the model's own
// weights read where they lie (the bytes the backend streams for them).
TEST(Cli, BenchReportsBothDecodeRooflines) {
  const auto j = bench_json("-p 4 -n 4 -r 1 --membw-mib 8");
  ASSERT_TRUE(j.contains("decode"));
  const auto& w = j.at("membw_weights_in_place");
  EXPECT_GT(w.at("bytes").get<double>(), 8e6);  // every distinct weight tensor: ~17 MB of F16
  EXPECT_LE(w.at("bytes").get<double>(), j.at("model").at("weight_bytes").get<double>());
  EXPECT_GT(w.at("read_gbs_median").get<double>(), 0.0);
  EXPECT_EQ(w.at("probes").get<int>(), 1);
  const auto& d = j.at("decode");
  EXPECT_GT(d.at("roofline_tok_s").get<double>(), 0.0);
  // The fresh-buffer probe names the read pattern it kept (the fastest it timed).
  const std::string k = j.at("membw").at("kernel").get<std::string>();
  if (tessera::read_kernel_usable(tessera::ReadKernel::Avx2))
    EXPECT_TRUE(k == "avx2" || k == "avx2+nta" || k == "avx2+nta x4") << k;
  else
    EXPECT_EQ(k, "scalar");
  // The machine is told apart by CPUID family and model, not only its brand string.
  EXPECT_EQ(j.at("machine").at("cpu_family").get<int>(), tessera::cpu_features().family);
  EXPECT_EQ(j.at("machine").at("cpu_model").get<int>(), tessera::cpu_features().model);
  EXPECT_NEAR(d.at("fraction_of_roofline_in_place").get<double>(),
              d.at("tok_s_median").get<double>() / d.at("roofline_in_place_tok_s").get<double>(), 1e-9);
  // Each run against the probes right after it: with one run, the same fractions.
  EXPECT_NEAR(d.at("fraction_per_run").at("median").get<double>(), d.at("fraction_of_roofline").get<double>(), 1e-9);
  EXPECT_NEAR(d.at("fraction_in_place_per_run").at("max").get<double>(),
              d.at("fraction_of_roofline_in_place").get<double>(), 1e-9);
}

// Prefill beside the arithmetic peak: an F16 model on a CPU backend is bounded by
// f32 FMA; where that instruction is not usable the bench says nothing about a peak.
TEST(Cli, BenchReportsPrefillAgainstTheArithmeticPeak) {
  const auto j = bench_json("-p 4 -n 0 -r 2 --peak-runs 1");
  ASSERT_TRUE(j.contains("prefill"));
  const auto& p = j.at("prefill");
  if (!tessera::peak_kernel_usable(tessera::PeakKernel::FmaF32)) {
    EXPECT_FALSE(j.contains("compute_peak"));
    EXPECT_FALSE(p.contains("fraction_of_peak"));
    return;
  }
  const auto& k = j.at("compute_peak");
  EXPECT_EQ(k.at("kernel").get<std::string>(), "f32 vfmadd231ps zmm");
  EXPECT_EQ(k.at("probes").get<int>(), 2);  // one after each timed prefill
  EXPECT_EQ(k.at("threads").get<int>(), 2);
  EXPECT_GT(k.at("gops_median").get<double>(), 1.0);
  EXPECT_LE(k.at("gops_min").get<double>(), k.at("gops_median").get<double>());
  EXPECT_NEAR(p.at("fraction_of_peak").get<double>(),
              p.at("gflops_median").get<double>() / k.at("gops_median").get<double>(), 1e-9);
  EXPECT_FALSE(bench_json("-p 4 -n 0 -r 1 --peak-runs 0").contains("compute_peak"));  // skipped
}

// --parallel: the sequences run together and the figures are aggregates; the roofline
// (per sequence) is not reported then. --profile prints a table per step.
TEST(Cli, BenchParallelAndProfile) {
  if (!fs::exists(fixture("models/qwen35moe-f16.gguf"))) GTEST_SKIP() << "fixtures not found";
  const auto j = bench_json("-p 6 -n 3 -r 1 --parallel 3 --batch 8 --membw-mib 0 --peak-runs 0");
  ASSERT_TRUE(j.contains("decode"));
  EXPECT_EQ(j.at("parallel").get<int>(), 3);
  EXPECT_EQ(j.at("batch_tokens").get<int>(), 8);
  EXPECT_GT(j.at("decode").at("tok_s_median").get<double>(), 0.0);
  EXPECT_FALSE(j.at("decode").contains("roofline_tok_s"));
  Result r = run("bench -m " + fixture("models/qwen35moe-f16.gguf") +
                 " -p 6 -n 2 -r 1 --membw-mib 0 --peak-runs 0 --threads 1 --profile");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("[profile: prefill step (6 tokens)]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[profile: decode step (1 token)]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gated_delta_net"), std::string::npos) << r.err;
  expect_one_line_error("bench -m " + fixture("models/qwen35moe-f16.gguf") + " --parallel 0", "--parallel");
  expect_one_line_error("run -p x --batch 0", "--batch");
}

// --expert-cache streams a MoE model's experts; bench reports what the decode read.
TEST(Cli, BenchReportsStreamedExperts) {
  if (!fs::exists(fixture("models/qwen35moe-f16.gguf"))) GTEST_SKIP() << "fixtures not found";
  const auto j = bench_json("-p 6 -n 6 -r 2 --membw-mib 0 --peak-runs 0 --expert-cache 64M");
  ASSERT_TRUE(j.contains("experts")) << j.dump();
  const auto& x = j.at("experts");
  EXPECT_EQ(x.at("cache_bytes").get<uint64_t>(), 64ull << 20);
  EXPECT_EQ(x.at("decode_tokens").get<int>(), 12);
  const double hit = x.at("hit_rate").get<double>();
  EXPECT_GE(hit, 0.0);
  EXPECT_LE(hit, 1.0);
  EXPECT_GE(x.at("disk_bytes_per_token").get<double>(), 0.0);
  EXPECT_FALSE(bench_json("-p 2 -n 2 -r 1 --membw-mib 0 --peak-runs 0 --expert-cache off").contains("experts"));
  expect_one_line_error("bench -m " + fixture("models/qwen35moe-f16.gguf") + " -p 2 -n 2 --expert-cache 1K",
                        "use --expert-cache");
  expect_one_line_error("bench -m " + fixture("models/qwen35moe-f16.gguf") + " -p 2 -n 2 --expert-cache lots",
                        "must start with a number");
}

// A prompt longer than --batch is prefilled in chunks and gives the same greedy text.
TEST(Cli, RunChunkedPrefillGivesTheSameText) {
  const std::string text = "\"Once upon a time there was a small town by the sea\"";
  Result whole = run("run -p " + text + " -n 8 --temp 0 --threads 1");
  Result chunked = run("run -p " + text + " -n 8 --temp 0 --threads 1 --batch 3");
  ASSERT_EQ(whole.status, 0) << whole.err;
  ASSERT_EQ(chunked.status, 0) << chunked.err;
  EXPECT_EQ(chunked.out, whole.out);
}

// tessera chat, its input piped: turns through the template, the second turn reusing
// the first's KV pages, /reset, and the same answers for the same seed.
TEST(Cli, ChatTurnsReuseTheConversation) {
  const std::string model = fixture("models/llama-q8_0.gguf");
  const std::string tmpl = fixture("chat_templates/templates/Qwen-Qwen3-0.6B.jinja");
  if (!fs::exists(model) || !fs::exists(tmpl)) GTEST_SKIP() << "fixtures not found";
  const std::string input = testing::TempDir() + "/tessera_chat_input_" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream f(input);
    f << "Tell me a long story about the sea and the ships and the sailors who went far away\n"
         "And then what happened?\n/reset\nTell me a long story about the sea and the ships and the sailors who "
         "went far away\n";
  }
  const std::string cmd = "chat -m " + model + " --chat-template " + tmpl + " --temp 0 -n 6 --threads 1 < " + input;
  Result r = run(cmd);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("[turn 1: prompt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[conversation cleared]"), std::string::npos) << r.err;
  // Turn 2 extends turn 1: its leading pages come from the prefix cache.
  const size_t t2 = r.err.find("[turn 2: prompt ");
  ASSERT_NE(t2, std::string::npos) << r.err;
  const size_t reused = r.err.find("tokens, ", t2);
  ASSERT_NE(reused, std::string::npos);
  EXPECT_GT(std::stoi(r.err.substr(reused + 8)), 0) << r.err;
  // Three answers, one per line; after /reset the first question gets the first answer again.
  std::vector<std::string> answers;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);) answers.push_back(line);
  ASSERT_EQ(answers.size(), 3u) << r.out;
  EXPECT_EQ(answers[2], answers[0]);
  expect_one_line_error("chat -m " + model + " < /dev/null", "no chat template");
}

TEST(Cli, TokenizeMatchesTheFixtureVocabulary) {
  if (!fs::exists(fixture("vocab/ggml-vocab-llama-spm.gguf"))) GTEST_SKIP() << "fixtures not found";
  // "Hello world" -> 15043 3186 in the fixture's expected ids (llama-spm .inp/.out);
  // the CLI adds BOS (1) because the vocabulary's metadata asks for it.
  Result with = run("tokenize -m " + fixture("vocab/ggml-vocab-llama-spm.gguf") + " \"Hello world\"");
  Result without = run("tokenize -m " + fixture("vocab/ggml-vocab-llama-spm.gguf") + " --no-bos \"Hello world\"");
  ASSERT_EQ(with.status, 0) << with.err;
  EXPECT_EQ(with.out, "1 15043 3186\n");
  EXPECT_EQ(without.out, "15043 3186\n");
}

TEST(Cli, EmbedPrintsOneUnitVectorPerText) {
  if (!fs::exists(fixture("models/llama-q8_0.gguf"))) GTEST_SKIP() << "fixtures not found";
  const std::string m = "embed -m " + fixture("models/llama-q8_0.gguf") + " --threads 2 ";
  auto vectors = [](const std::string& out) {
    std::vector<std::vector<double>> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      v.emplace_back();
      for (double x; fields >> x;) v.back().push_back(x);
    }
    return v;
  };
  auto norm = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s);
  };
  Result r = run(m + "\"a cat\" \"the sea\"");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto both = vectors(r.out);
  ASSERT_EQ(both.size(), 2u);
  for (const auto& v : both) {
    EXPECT_EQ(v.size(), 256u);  // the llama fixtures' n_embd
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
  }
  EXPECT_NE(both[0], both[1]);
  EXPECT_NE(r.err.find("texts/s"), std::string::npos) << r.err;
  // --json and --dimensions: the first values, normalised again.
  Result j = run(m + "--json --dimensions 8 \"the sea\"");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto arr = nlohmann::json::parse(j.out);
  ASSERT_EQ(arr.size(), 1u);
  ASSERT_EQ(arr[0].size(), 8u);
  std::vector<double> head(both[1].begin(), both[1].begin() + 8), got = arr[0].get<std::vector<double>>();
  const double n = norm(head);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], head[i] / n, 1e-5) << i;
  expect_one_line_error(m + "--pooling cls x", "--pooling must be mean or last");
  expect_one_line_error(m + "--dimensions 300 x", "--dimensions 300");
  expect_one_line_error(m + "\"\"", "empty text");
}

TEST(Cli, GeneratorIsDeterministicAcrossThreadCounts) {
  std::string a = testing::TempDir() + "/tessera_gen_a_" + std::to_string(getpid()) + ".gguf";
  std::string b = testing::TempDir() + "/tessera_gen_b_" + std::to_string(getpid()) + ".gguf";
  for (const char* type : {"q4_k_m", "q4_0", "bf16"}) {
    std::string common = std::string("--preset tiny --quiet --seed 7 --type ") + type;
    ASSERT_EQ(run(common + " --threads 1 --out " + a, "tessera-gen").status, 0) << type;
    ASSERT_EQ(run(common + " --threads 2 --out " + b, "tessera-gen").status, 0) << type;
    EXPECT_EQ(slurp(a), slurp(b)) << type;
    Result info = run("info " + a);
    ASSERT_EQ(info.status, 0) << info.err;
    EXPECT_NE(info.out.find("architecture:  llama"), std::string::npos) << info.out;
    // And the generated model runs.
    Result gen = run("run -m " + a + " -p hello -n 4 --temp 0");
    EXPECT_EQ(gen.status, 0) << gen.err;
  }
  Result bad = run("--preset nope --out " + a, "tessera-gen");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("unknown preset 'nope'"), std::string::npos) << bad.err;
}

}  // namespace
