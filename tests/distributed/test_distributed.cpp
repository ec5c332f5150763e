// `mpirun -np N tessera ...` as a user runs it: the logits and greedy output of a
// distributed run equal one process's bit for bit (cpu_scalar, every fixture, 2 and 3
// ranks on this one machine; experts split for MoE models, layers for dense ones and
// for MoE ones when asked), a rank streams its share of the experts, and a rank killed
// mid-decode ends the run within seconds with a message naming it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpirun_command.h"

namespace {
namespace fs = std::filesystem;

#ifdef TESSERA_MPIRUN
constexpr const char* kMpirun = TESSERA_MPIRUN;
#else
constexpr const char* kMpirun = "";
#endif

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string work_dir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  const std::string dir = testing::TempDir() + "/tessera_dist_" + std::to_string(getpid()) + "_" + name;
  fs::create_directories(dir);
  return dir;
}

std::string mpirun(int ranks) { return tessera::test::mpirun_command(kMpirun, ranks); }

struct Result {
  int status = -1;
  std::string out, err;
};

Result sh(const std::string& cmd) {
  const std::string dir = work_dir();
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const int rc = std::system((cmd + " >" + out + " 2>" + err).c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(out), slurp(err)};
}

std::string tessera() { return std::string(TESSERA_BIN_DIR) + "/tessera "; }
std::string model(const std::string& name) { return std::string(TESSERA_FIXTURES_DIR) + "/models/" + name + ".gguf"; }

#define REQUIRE_MPIRUN()                                                                        \
  do {                                                                                         \
    if (!*kMpirun) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev, scripts/setup.sh)"; \
    if (!fs::exists(kMpirun)) GTEST_SKIP() << std::string("mpirun not found at ") + kMpirun;  \
  } while (0)

const char* const kMoeFixtures[] = {
    "qwen3moe-f16",  "qwen3moe-f32",       "qwen3moe-mxfp4_moe", "qwen3moe-q4_0",     "qwen3moe-q4_k_m",
    "qwen3moe-q8_0", "qwen35moe-f16",      "qwen35moe-q4_0",     "qwen35moe-q4_k_m",  "qwen35moe-q8_0",
    "glm4moe-f32",   "glm4moe-q4_k_m",     "glm4moe-q8_0",       "deepseek2-f32",     "deepseek2-q4_k_m",
    "deepseek2-q8_0", "gpt-oss-f32",       "gpt-oss-mxfp4_moe",  "gpt-oss-q4_k_m",    "gpt-oss-q8_0"};

// A batched prefill of 11 tokens over 2 and 3 ranks, logits of every row written by
// rank 0, against one process.
void expect_same_logits(const std::string& name, const std::string& split) {
  const std::string m = model(name), dir = work_dir();
  if (!fs::exists(m)) GTEST_SKIP() << m << " is missing";
  const std::string args = "logits -m " + m + " --backend cpu_scalar --threads 1 --tokens 1,5,9,2,7,3,8,4,6,10,11 -o ";
  const Result one = sh(tessera() + args + dir + "/one.f32");
  ASSERT_EQ(one.status, 0) << one.err;
  const std::string ref = slurp(dir + "/one.f32");
  ASSERT_FALSE(ref.empty());
  for (int ranks : {2, 3}) {
    const std::string out = dir + "/ranks" + std::to_string(ranks) + ".f32";
    const Result r = sh(mpirun(ranks) + tessera() + args + out + " " + split);
    ASSERT_EQ(r.status, 0) << ranks << " ranks: " << r.err;
    EXPECT_TRUE(slurp(out) == ref) << ranks << " ranks: the logits differ from one process's";
    // Rank 0 alone reports (the others print nothing but errors): one line, and with
    // more ranks than a fixture's two layers a warning that the last has none.
    const std::string wrote =
        "wrote 11 x " + one.err.substr(11, one.err.find(" logits") - 11) + " logits to " + out + "\n";
    EXPECT_EQ(r.err.substr(r.err.size() - std::min(r.err.size(), wrote.size())), wrote) << ranks << " ranks";
    EXPECT_EQ(r.err.find("[error]"), std::string::npos) << r.err;
  }
}

std::string test_name(const testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

class MoeLogits : public testing::TestWithParam<const char*> {};

// Every MoE layer's experts split over the ranks and exchanged (the default for MoE).
TEST_P(MoeLogits, SameAsOneProcessWithTwoAndThreeRanks) {
  REQUIRE_MPIRUN();
  expect_same_logits(GetParam(), "");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeLogits, testing::ValuesIn(kMoeFixtures), test_name);

const char* const kDenseFixtures[] = {
    "gemma3-f32",   "gemma3-q4_k_m", "gemma3-q8_0", "llama-bf16",    "llama-f16",    "llama-f32",
    "llama-iq4_nl", "llama-iq4_xs",  "llama-q2_k",  "llama-q3_k_m",  "llama-q4_0",   "llama-q4_1",
    "llama-q4_k_m", "llama-q5_0",    "llama-q5_1",  "llama-q5_k_m",  "llama-q6_k",   "llama-q8_0",
    "llama3-f16",   "llama3-f32",    "llama3-q4_k_m", "llama3-q8_0", "qwen2-f16",    "qwen2-f32",
    "qwen2-q4_k_m", "qwen2-q8_0",    "qwen3-f16",   "qwen3-f32",     "qwen3-q4_k_m", "qwen3-q8_0"};

class DenseLogits : public testing::TestWithParam<const char*> {};

// Contiguous layer ranges per rank, activations handed on (the default for dense
// models); the fixtures' two layers leave the third rank none.
TEST_P(DenseLogits, SameAsOneProcessWithTwoAndThreeRanks) {
  REQUIRE_MPIRUN();
  expect_same_logits(GetParam(), "");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DenseLogits, testing::ValuesIn(kDenseFixtures), test_name);

class MoeLayerLogits : public testing::TestWithParam<const char*> {};

// MoE models split by layers when asked.
TEST_P(MoeLayerLogits, SameAsOneProcessWithTwoAndThreeRanks) {
  REQUIRE_MPIRUN();
  expect_same_logits(GetParam(), "--split layers");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeLayerLogits,
                         testing::Values("qwen3moe-q8_0", "qwen35moe-q4_0", "glm4moe-q8_0", "deepseek2-q8_0",
                                         "gpt-oss-mxfp4_moe"),
                         test_name);

class SeveralSequences : public testing::TestWithParam<const char*> {};

// Three sequences in one step (40, 35 and 30 tokens): with --split layers the ranks
// pipeline the step as micro-batches of whole sequences (2 at 2 ranks, 3 at 3), and
// with --split experts every rank routes every sequence; the logits of every row equal
// one process's, which runs the three in one graph.
TEST_P(SeveralSequences, OneStepSameAsOneProcess) {
  REQUIRE_MPIRUN();
  const std::string m = model(GetParam()), dir = work_dir();
  if (!fs::exists(m)) GTEST_SKIP() << m << " is missing";
  auto list = [](int from, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(from + i);
    return s;
  };
  const std::string args = "logits -m " + m + " --backend cpu_scalar --threads 1 --tokens " + list(1, 40) +
                           " --tokens " + list(50, 35) + " --tokens " + list(100, 30) + " -o ";
  const Result one = sh(tessera() + args + dir + "/one.f32");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.err.find("wrote 105 x "), std::string::npos) << one.err;
  const std::string ref = slurp(dir + "/one.f32");
  const bool moe = std::string(GetParam()).find("moe") != std::string::npos;
  for (const std::string& split : {std::string("--split layers"), std::string(moe ? "--split experts" : "")}) {
    if (split.empty()) continue;
    for (int ranks : {2, 3}) {
      const std::string out = dir + "/ranks" + std::to_string(ranks) + ".f32";
      const Result r = sh(mpirun(ranks) + tessera() + args + out + " " + split);
      ASSERT_EQ(r.status, 0) << ranks << " ranks " << split << ": " << r.err;
      EXPECT_TRUE(slurp(out) == ref) << ranks << " ranks " << split << ": the logits differ from one process's";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, SeveralSequences,
                         testing::Values("llama-q8_0", "gemma3-q8_0", "qwen3moe-q8_0", "qwen35moe-q4_0"), test_name);

class Greedy : public testing::TestWithParam<const char*> {};

// Decode, one token per step: the other ranks replay rank 0's KV bookkeeping step by
// step (recurrent state included) and the text is the same, with either split.
TEST_P(Greedy, GenerationSameAsOneProcess) {
  REQUIRE_MPIRUN();
  const std::string m = model(GetParam());
  if (!fs::exists(m)) GTEST_SKIP() << m << " is missing";
  const std::string args = "run -m " + m + " --backend cpu_scalar --threads 1 -p 'hello world, the' -n 24 --temp 0";
  const Result one = sh(tessera() + args);
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_GT(one.out.size(), 20u);
  const bool moe = std::string(GetParam()).find("moe") != std::string::npos ||
                   std::string(GetParam()).find("deepseek") != std::string::npos ||
                   std::string(GetParam()).find("gpt-oss") != std::string::npos;
  for (const std::string& split : {std::string(moe ? "--split experts" : ""), std::string("--split layers")}) {
    if (!moe && split.empty()) continue;
    const Result three = sh(mpirun(3) + tessera() + args + " " + split);
    ASSERT_EQ(three.status, 0) << split << ": " << three.err;
    EXPECT_EQ(three.out, one.out) << split;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, Greedy,
                         testing::Values("qwen3moe-q8_0", "qwen35moe-q4_0", "glm4moe-q8_0", "deepseek2-q8_0",
                                         "gpt-oss-mxfp4_moe", "llama-q8_0", "gemma3-q8_0", "qwen3-q8_0"),
                         test_name);

TEST(Distributed, ExpertsSplitOfADenseModelIsRefusedWithTheReason) {
  REQUIRE_MPIRUN();
  const std::string dir = work_dir();
  const Result r = sh(mpirun(2) + tessera() + "logits -m " + model("llama-q8_0") +
                      " --backend cpu_scalar --split experts --tokens 1,2,3 -o " + dir + "/x.f32");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("has no routed experts to split over ranks: use --split layers"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/x.f32"));
}

// A rank streams its own share through its cache: a cache too small for one layer's
// experts in one process is enough for each of two ranks, and the logits stay the same.
TEST(Distributed, RanksStreamTheirShareFromDisk) {
  REQUIRE_MPIRUN();
  const std::string dir = work_dir();
  const std::string args = "logits -m " + model("qwen3moe-q8_0") + " --backend cpu_scalar --tokens 1,5,9,2,7 -o ";
  const Result one = sh(tessera() + args + dir + "/one.f32");
  ASSERT_EQ(one.status, 0) << one.err;
  const Result small = sh(tessera() + args + dir + "/small.f32 --expert-cache 1M");
  EXPECT_NE(small.status, 0);
  EXPECT_NE(small.err.find("is too small: one layer's experts need"), std::string::npos) << small.err;
  const Result two = sh(mpirun(2) + tessera() + args + dir + "/two.f32 --expert-cache 1M -v");
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.err.find("streamed through a 1 MiB cache"), std::string::npos) << two.err;
  EXPECT_TRUE(slurp(dir + "/two.f32") == slurp(dir + "/one.f32"));
}

TEST(Distributed, PlainStartIsOneProcess) {
  // Outside a launcher nothing changes: no MPI is joined and no rank line is logged.
  const Result r = sh(tessera() + "logits -m " + model("qwen3moe-q8_0") + " --backend cpu_scalar -v --tokens 1,2 -o " +
                      work_dir() + "/x.f32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("distributed run"), std::string::npos) << r.err;
}

// kill -9 of rank 1 while the run decodes: the launcher ends every rank and says which
// one died, within 10 s.
TEST(Distributed, KilledRankEndsTheRunNamingIt) {
  REQUIRE_MPIRUN();
  const std::string dir = work_dir();
  const std::string err = dir + "/err.txt", pidfile = dir + "/pid";
  const std::string cmd = "(" + mpirun(2) + tessera() + "bench -m " + model("qwen3moe-q8_0") +
                          " --backend cpu_scalar --threads 1 -p 16 -n 400 -r 500 --membw-mib 0 >/dev/null 2>" + err +
                          "; echo $? > " + dir + "/rc) & echo $! > " + pidfile;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  // Rank 1: the tessera process whose environment says so, once decoding is under way.
  pid_t rank1 = -1;
  for (int tries = 0; tries < 200 && rank1 < 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string exe = slurp(e.path() / "cmdline");
      if (exe.find("tessera") == std::string::npos || exe.find("bench") == std::string::npos ||
          exe.find("mpirun") != std::string::npos)
        continue;
      const std::string env = slurp(e.path() / "environ");
      // Only this test's run: no other test runs bench with 500 repetitions.
      if (env.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos &&
          exe.find(std::string("500") + '\0') != std::string::npos) {
        rank1 = pid_t(std::stol(name));
        break;
      }
    }
  }
  ASSERT_GT(rank1, 0) << "rank 1 never started";
  std::this_thread::sleep_for(std::chrono::seconds(2));  // well into the decode
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  while (!fs::exists(dir + "/rc") && std::chrono::steady_clock::now() - killed < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  ASSERT_TRUE(fs::exists(dir + "/rc")) << "the run did not end within 30 s of the kill";
  EXPECT_LT(took, 10.0);
  EXPECT_NE(slurp(dir + "/rc"), "0\n");
  const std::string e = slurp(err);
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
}

}  // namespace
