// `mpirun -np 2|3 tessera logits` on the optimized CPU backend: every model fixture's
// prompt logits within the fixture limits of the reference (the same check as one
// process's, tests/fixtures), experts split for MoE models and layers for dense ones.
// The bit-for-bit comparison with one process is cpu_scalar's (test_distributed.cpp);
// another backend's kernels may differ from one process's in the last bits where a
// rank computes a product in another grouping (its share of the experts).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../fixtures/fixture_util.h"
#include "mpirun_command.h"

namespace tessera::test {
namespace {

#ifdef TESSERA_MPIRUN
constexpr const char* kMpirun = TESSERA_MPIRUN;
#else
constexpr const char* kMpirun = "";
#endif

std::string mpirun(int ranks) { return mpirun_command(kMpirun, ranks); }

std::vector<FixtureCase> cases() {
  std::vector<FixtureCase> out;
  for (const char* family : {"llama-", "qwen2-", "qwen3-", "llama3-", "qwen3moe-", "qwen35moe-", "glm4moe-", "gemma3-",
                             "gpt-oss-", "deepseek2-"})
    for (const auto& f : list_model_fixtures(family)) out.push_back({f, "cpu_avx512"});
  return out;
}

class DistributedFixtureLogits : public testing::TestWithParam<FixtureCase> {};

TEST_P(DistributedFixtureLogits, PromptLogitsWithTwoAndThreeRanksMatchReference) {
  if (!*kMpirun) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev, scripts/setup.sh)";
  if (!std::filesystem::exists(kMpirun)) GTEST_SKIP() << "mpirun not found at " << kMpirun;
  if (!std::filesystem::exists(fixtures_dir()))
    GTEST_SKIP() << "fixtures not found at " << fixtures_dir() << " (../shared beside the repository)";
  if (const std::string why = backend_unusable_reason(GetParam().backend); !why.empty())
    GTEST_SKIP() << GetParam().backend << " is not usable here: " << why;
  const ModelFixture fx = load_model_fixture(GetParam().fixture);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    check_prompt_logits_via_cli(fx, fx.gguf, GetParam().backend, mpirun(ranks));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DistributedFixtureLogits, testing::ValuesIn(cases()), fixture_case_name);

}  // namespace
}  // namespace tessera::test
