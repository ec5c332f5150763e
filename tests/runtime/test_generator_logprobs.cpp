// Token log-probabilities: token_logprobs (the log-softmax of a raw logits row and its
// most likely tokens) and the Generator reporting them per generated token only for
// requests that ask, without changing what is sampled.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/generator.h"
#include "tessera/sampler.h"
#include "support/scalar_fixture_engine.h"

namespace tessera {
namespace {

std::vector<double> log_softmax(const std::vector<float>& l) {
  double m = -INFINITY;
  for (float x : l) m = std::max(m, double(x));
  double s = 0;
  for (float x : l) s += std::exp(double(x) - m);
  std::vector<double> out;
  for (float x : l) out.push_back(double(x) - m - std::log(s));
  return out;
}

TEST(TokenLogprobs, IsTheLogSoftmaxOfTheRawRow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> row(1000);
  for (float& x : row) x = d(rng);
  const auto ref = log_softmax(row);
  const TokenLogprobs lp = token_logprobs(row, 17, 5);
  EXPECT_NEAR(lp.logprob, ref[17], 1e-5);
  ASSERT_EQ(lp.top.size(), 5u);
  std::vector<int> order(row.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].id, order[i]) << i;
    EXPECT_NEAR(lp.top[i].logprob, ref[size_t(order[i])], 1e-5) << i;
  }
  // Every token: the probabilities sum to 1.
  const TokenLogprobs all = token_logprobs(row, 0, 5000);
  ASSERT_EQ(all.top.size(), row.size());
  double sum = 0;
  for (const auto& t : all.top) sum += std::exp(double(t.logprob));
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_TRUE(token_logprobs(row, 3, 0).top.empty());
}

TEST(TokenLogprobs, TiesNanAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> row = {1.0f, 2.0f, nan, 2.0f, -inf, 0.5f};
  const TokenLogprobs lp = token_logprobs(row, 4, 6);
  ASSERT_EQ(lp.top.size(), 6u);
  EXPECT_EQ(lp.top[0].id, 1);  // ties: the lower id first
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[0].logprob, lp.top[1].logprob);
  EXPECT_EQ(lp.top[2].id, 0);
  EXPECT_EQ(lp.top[3].id, 5);
  EXPECT_EQ(lp.logprob, -inf);  // -inf and NaN (as -inf) have probability 0
  EXPECT_EQ(lp.top[5].logprob, -inf);
  const auto ref = log_softmax({1.0f, 2.0f, 2.0f, 0.5f});
  EXPECT_NEAR(lp.top[0].logprob, ref[1], 1e-6);
  // +inf counts as the largest float: that token takes all the probability.
  const TokenLogprobs big = token_logprobs(std::vector<float>{0.0f, inf, 1.0f}, 1, 1);
  EXPECT_EQ(big.logprob, 0.0f);
  EXPECT_EQ(big.top[0].id, 1);
  EXPECT_THROW(token_logprobs(row, 6, 1), Error);
  EXPECT_THROW(token_logprobs(std::vector<float>{}, 0, 1), Error);
}

class GeneratorLogprobs : public testing::Test {
 protected:
  void SetUp() override {
    fixture_ = test::scalar_fixture_engine("llama-q8_0", 128, 2);
    if (!fixture_.engine) GTEST_SKIP() << fixture_.path << " not found (../shared beside the repository)";
    engine_ = fixture_.engine.get();
  }
  std::vector<GenerationEvent> run(const GenerationRequest& r) {
    Generator g(*engine_);
    g.add(r);
    std::vector<GenerationEvent> out;
    while (!g.idle())
      for (auto& ev : g.step()) out.push_back(std::move(ev));
    return out;
  }
  test::ScalarFixtureEngine fixture_;
  Engine* engine_ = nullptr;
};

TEST_F(GeneratorLogprobs, ReportedOnlyWhenAskedAndSamplingIsUnchanged) {
  for (float temperature : {0.0f, 1.0f}) {
    GenerationRequest r;
    r.prompt = {1, 17, 300, 42, 999, 5};
    r.sampling.temperature = temperature;
    r.sampling.seed = 7;
    r.max_tokens = 10;
    r.ignore_eos = true;
    const auto plain = run(r);
    r.logprobs = 4;
    const auto with = run(r);
    ASSERT_EQ(plain.size(), with.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].token, with[i].token) << "asking for logprobs changed token " << i;
      EXPECT_FALSE(plain[i].logprobs.has_value());
      ASSERT_TRUE(with[i].logprobs.has_value()) << i;
      const TokenLogprobs& lp = *with[i].logprobs;
      ASSERT_EQ(lp.top.size(), 4u);
      for (size_t k = 1; k < 4; ++k) EXPECT_GE(lp.top[k - 1].logprob, lp.top[k].logprob);
      EXPECT_LE(lp.top[0].logprob, 0.0f);
      EXPECT_LE(lp.logprob, lp.top[0].logprob);
      if (temperature == 0.0f) {  // greedy on the raw logits: the chosen token is the most likely
        EXPECT_EQ(lp.top[0].id, with[i].token);
        EXPECT_EQ(lp.top[0].logprob, lp.logprob);
      }
    }
  }
}

TEST_F(GeneratorLogprobs, TheRawDistributionIgnoresBiasAndTemperature) {
  GenerationRequest r;
  r.prompt = {1, 50, 60, 70};
  r.sampling.temperature = 0;
  r.max_tokens = 1;
  r.logprobs = 2;
  const auto greedy = run(r);
  ASSERT_EQ(greedy.size(), 1u);
  // A bias forces another token; the reported distribution is still the model's.
  const int32_t forced = greedy[0].logprobs->top[1].id;
  r.sampling.logit_bias = {{forced, 100.0f}};
  const auto biased = run(r);
  ASSERT_EQ(biased.size(), 1u);
  EXPECT_EQ(biased[0].token, forced);
  EXPECT_EQ(biased[0].logprobs->logprob, greedy[0].logprobs->top[1].logprob);
  EXPECT_EQ(biased[0].logprobs->top[0].id, greedy[0].token);
}

TEST_F(GeneratorLogprobs, AStopTokenHasNone) {
  GenerationRequest r;
  r.prompt = {1, 50, 60, 70};
  r.sampling.temperature = 0;
  r.max_tokens = 3;
  r.logprobs = 0;
  const auto first = run(r);
  ASSERT_FALSE(first.empty());
  r.stop_tokens = {first[0].token};
  const auto stopped = run(r);
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].token, -1);
  EXPECT_EQ(stopped[0].finish, FinishReason::Stop);
  EXPECT_FALSE(stopped[0].logprobs.has_value());
  r.logprobs = -2;
  Generator g(*engine_);
  EXPECT_THROW(g.add(r), Error);
}

}  // namespace
}  // namespace tessera
