// The budget as the command line shows and applies it: `tessera info` prints it, and
// under an RLIMIT_AS (set with `ulimit -v` in the child's shell, the one limit a test
// can set without privileges) `tessera info` names it and `tessera run` refuses a KV
// cache that cannot fit, with the numbers, at load.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/memory_budget.h"

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

// `tessera ARGS` in a shell that first runs `prefix` (e.g. "ulimit -v N").
Result run(const std::string& prefix, const std::string& args) {
  const std::string dir = testing::TempDir() + "/tessera_memcli_" + std::to_string(getpid()) + "_" +
                          testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(dir);
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const std::string inner = (prefix.empty() ? "" : prefix + "; ") + "exec " + TESSERA_BIN_DIR + "/tessera " + args;
  const std::string cmd = "bash -c '" + inner + "' >" + out + " 2>" + err;
  const int rc = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

const std::string kModel = std::string(TESSERA_FIXTURES_DIR) + "/models/llama-q8_0.gguf";
constexpr uint64_t GiB = uint64_t(1) << 30;

// MemAvailable of this machine: an RLIMIT_AS binds only where it leaves less.
uint64_t mem_available() {
  for (const auto& l : tessera::read_memory_budget().limits)
    if (l.source == "MemAvailable") return l.limit;
  return 0;
}

TEST(MemoryLimitsCli, InfoPrintsTheBudgetAndItsSplit) {
  const Result r = run("", "info " + kModel);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("memory:        memory budget "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resident; KV cache "), std::string::npos) << r.out;
}

TEST(MemoryLimitsCli, InfoNamesAnAddressSpaceLimit) {
  if (mem_available() < 3 * GiB) GTEST_SKIP() << "MemAvailable is below 3 GiB here: it, not a 2 GiB RLIMIT_AS, binds";
  const Result r = run("ulimit -v 2097152", "info " + kModel);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("(RLIMIT_AS 2.0 GiB minus "), std::string::npos) << r.out;
}

TEST(MemoryLimitsCli, RunRefusesAKvCacheBeyondAnAddressSpaceLimit) {
  if (mem_available() < 3 * GiB) GTEST_SKIP() << "MemAvailable is below 3 GiB here: it, not a 2 GiB RLIMIT_AS, binds";
  // One context of 8M positions needs several GiB of KV on any llama fixture.
  const Result r = run("ulimit -v 2097152", "run -m " + kModel + " --ctx 8388608 -t 1 -n 1 -p hi");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("does not fit in the memory budget"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("RLIMIT_AS 2.0 GiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("8388608 positions"), std::string::npos) << r.err;
}

}  // namespace
