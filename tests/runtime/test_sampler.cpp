#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "tessera/error.h"
#include "tessera/sampler.h"

using tessera::Sampler;
using tessera::SamplerParams;

namespace {

SamplerParams plain(float temp = 1.0f, uint64_t seed = 42) {
  SamplerParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.seed = seed;
  return p;
}

std::vector<float> log_probs(std::initializer_list<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[size_t(s.sample(logits))] += 1.0;
  for (auto& x : f) x /= draws;
  return f;
}

std::vector<int32_t> sequence(const SamplerParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits));
  return out;
}

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f, 1.2f, 2.0f, -3.0f};

}  // namespace

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s(plain(0.0f));
  EXPECT_EQ(s.sample(kLogits), 1);  // 1 and 6 tie: lowest id
  EXPECT_EQ(s.sample(std::vector<float>{-5.0f, -1.0f, -2.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{3.0f}), 0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  SamplerParams p = plain(1.0f, 1234);
  std::vector<float> flat(32, 0.0f);
  auto a = sequence(p, flat, 200);
  auto b = sequence(p, flat, 200);
  EXPECT_EQ(a, b);
  p.seed = 1235;
  auto c = sequence(p, flat, 200);
  EXPECT_NE(a, c);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  for (float t : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplerParams p = plain(t, 7);
    p.top_k = 1;
    Sampler s(p);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(s.sample(kLogits), 1) << "temp " << t;
  }
}

TEST(Sampler, DistributionMatchesSoftmax) {
  const std::array<double, 4> probs = {0.1, 0.2, 0.3, 0.4};
  auto logits = log_probs({0.1, 0.2, 0.3, 0.4});
  Sampler s(plain(1.0f, 99));
  auto f = frequencies(s, logits, 20000);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(f[i], probs[i], 0.015) << "token " << i;
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  auto logits = log_probs({0.1, 0.2, 0.3, 0.4});
  Sampler cold(plain(0.25f, 5));
  auto fc = frequencies(cold, logits, 20000);
  // p ~ q^4: 0.4^4 / sum = 0.0256/0.0354 ~ 0.723
  EXPECT_NEAR(fc[3], 0.0256 / (0.0001 + 0.0016 + 0.0081 + 0.0256), 0.015);
  Sampler hot(plain(100.0f, 5));
  auto fh = frequencies(hot, logits, 20000);
  for (double x : fh) EXPECT_NEAR(x, 0.25, 0.02);
}

TEST(Sampler, TopPKeepsSmallestSufficientPrefix) {
  auto logits = log_probs({0.1, 0.2, 0.3, 0.4});
  SamplerParams p = plain(1.0f, 3);
  p.top_p = 0.5f;  // 0.4 + 0.3 >= 0.5: keeps tokens 3 and 2
  Sampler s(p);
  auto f = frequencies(s, logits, 20000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[1], 0.0);
  EXPECT_NEAR(f[2], 0.3 / 0.7, 0.015);
  EXPECT_NEAR(f[3], 0.4 / 0.7, 0.015);

  p.top_p = 0.3f;  // the top token alone suffices
  Sampler s2(p);
  auto f2 = frequencies(s2, logits, 2000);
  EXPECT_EQ(f2[3], 1.0);
}

TEST(Sampler, TopKRestricts) {
  auto logits = log_probs({0.1, 0.2, 0.3, 0.4});
  SamplerParams p = plain(1.0f, 11);
  p.top_k = 2;
  Sampler s(p);
  auto f = frequencies(s, logits, 20000);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[3], 0.4 / 0.7, 0.015);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  auto logits = log_probs({0.05, 0.15, 0.3, 0.5});
  SamplerParams p = plain(1.0f, 8);
  p.min_p = 0.5f;  // keep p >= 0.25: tokens 2, 3
  Sampler s(p);
  auto f = frequencies(s, logits, 20000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[1], 0.0);
  EXPECT_NEAR(f[3], 0.5 / 0.8, 0.015);

  p.min_p = 0.25f;  // keep p >= 0.125: tokens 1, 2, 3
  Sampler s2(p);
  auto f2 = frequencies(s2, logits, 20000);
  EXPECT_EQ(f2[0], 0.0);
  EXPECT_GT(f2[1], 0.1);

  p.min_p = 1.0f;  // only the top token
  Sampler s3(p);
  EXPECT_EQ(frequencies(s3, logits, 1000)[3], 1.0);
}

TEST(Sampler, RepetitionPenalty) {
  // Token 0 leads slightly; once it is recent, a big enough penalty flips greedy.
  std::vector<float> logits = {2.0f, 1.8f, -0.5f};
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 1.05f;
  p.repeat_last_n = 4;
  Sampler weak(p);
  weak.accept(0);
  EXPECT_EQ(weak.sample(logits), 0);  // 2.0 / 1.05 = 1.905 > 1.8

  p.repeat_penalty = 1.5f;
  Sampler strong(p);
  EXPECT_EQ(strong.sample(logits), 0);
  strong.accept(0);
  strong.accept(0);  // counted once: 2.0 / 1.5 = 1.333 < 1.8
  EXPECT_EQ(strong.sample(logits), 1);
  // Negative logits are multiplied: token 2 repeated goes further down.
  std::vector<float> neg = {-1.0f, -1.2f};
  Sampler n(p);
  n.accept(0);  // -1.0 * 1.5 = -1.5 < -1.2
  EXPECT_EQ(n.sample(neg), 1);
  // The window forgets old tokens.
  for (int t : {5, 6, 7, 8}) strong.accept(t);  // out-of-range ids are ignored
  EXPECT_EQ(strong.sample(logits), 0);

  // Sampling: the penalized token is drawn less often.
  auto flat = log_probs({0.25, 0.25, 0.25, 0.25});
  SamplerParams ps = plain(1.0f, 21);
  ps.repeat_penalty = 2.0f;
  Sampler sp(ps);
  auto base = frequencies(sp, flat, 4000);
  sp.accept(2);
  std::vector<float> shifted = {1.0f, 1.0f, 1.0f, 1.0f};
  auto f = frequencies(sp, shifted, 20000);  // token 2 logit 1 -> 0.5
  EXPECT_NEAR(f[2], std::exp(0.5) / (3 * std::exp(1.0) + std::exp(0.5)), 0.015);
  EXPECT_NEAR(base[2], 0.25, 0.03);
}

TEST(Sampler, NaNIsNeverChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits = {nan, 0.0f, nan, 0.0f};
  Sampler g(plain(0.0f));
  EXPECT_EQ(g.sample(logits), 1);
  Sampler s(plain(1.0f, 4));
  auto f = frequencies(s, logits, 4000);
  EXPECT_EQ(f[0] + f[2], 0.0);
  EXPECT_NEAR(f[1], 0.5, 0.04);
  std::vector<float> bad = {nan, -std::numeric_limits<float>::infinity()};
  EXPECT_THROW(g.sample(bad), tessera::Error);
  EXPECT_THROW(s.sample(bad), tessera::Error);
  std::vector<float> inf = {0.0f, std::numeric_limits<float>::infinity(), 1.0f};
  EXPECT_EQ(s.sample(inf), 1);
}

TEST(Sampler, InvalidParamsThrow) {
  auto bad = [](auto mutate) {
    SamplerParams p = plain();
    mutate(p);
    EXPECT_THROW(Sampler{p}, tessera::Error);
  };
  bad([](SamplerParams& p) { p.temperature = -0.1f; });
  bad([](SamplerParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); });
  bad([](SamplerParams& p) { p.top_p = 0.0f; });
  bad([](SamplerParams& p) { p.top_p = 1.5f; });
  bad([](SamplerParams& p) { p.min_p = -0.1f; });
  bad([](SamplerParams& p) { p.min_p = 1.1f; });
  bad([](SamplerParams& p) { p.repeat_penalty = 0.0f; });
  bad([](SamplerParams& p) { p.repeat_penalty = -1.0f; });
  bad([](SamplerParams& p) { p.repeat_last_n = -1; });
  EXPECT_NO_THROW(Sampler{SamplerParams{}});  // defaults are valid

  Sampler s(plain());
  EXPECT_THROW(s.sample(std::vector<float>{}), tessera::Error);
  try {
    SamplerParams p = plain();
    p.top_p = 2.0f;
    Sampler x(p);
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
}

TEST(Sampler, DefaultChainRuns) {
  Sampler s(SamplerParams{});
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)) * 4.0);
  for (int i = 0; i < 100; ++i) {
    int32_t t = s.sample(logits);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 1000);
    s.accept(t);
  }
}

namespace {

TEST(Sampler, LogitBiasBansAndFavoursTokens) {
  const std::vector<float> logits{3.0f, 2.0f, 1.0f, 0.0f};
  SamplerParams p = plain(0.0f);
  EXPECT_EQ(Sampler(p).sample(logits), 0);
  p.logit_bias = {{0, -100.0f}};
  EXPECT_EQ(Sampler(p).sample(logits), 1);  // the best token banned
  p.logit_bias = {{0, -100.0f}, {3, 2.5f}};
  EXPECT_EQ(Sampler(p).sample(logits), 3);  // 0 + 2.5 beats 2.0
  p.logit_bias = {{99, 50.0f}};             // outside the row: ignored
  EXPECT_EQ(Sampler(p).sample(logits), 0);
  // At temperature 1 a banned token is never drawn.
  SamplerParams t = plain(1.0f, 7);
  t.logit_bias = {{0, -100.0f}};
  Sampler s(t);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(s.sample(logits), 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> logits{2.0f, 1.5f, 0.0f};
  SamplerParams p = plain(0.0f);
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.2f;
  Sampler s(p);
  s.accept(0);  // a prompt token: no presence / frequency penalty
  EXPECT_EQ(s.sample(logits), 0);
  s.count_generated(0);  // 2.0 - 0.4 - 0.2 = 1.4 < 1.5
  EXPECT_EQ(s.sample(logits), 1);
  s.count_generated(1);  // token 1: 1.5 - 0.6 = 0.9 < 1.4
  EXPECT_EQ(s.sample(logits), 0);
  s.count_generated(0);  // token 0 twice: 2.0 - 0.4 - 0.4 = 1.2 > 0.9
  EXPECT_EQ(s.sample(logits), 0);
  SamplerParams negative = plain(0.0f);
  negative.presence_penalty = -2.0f;  // a negative penalty favours repeats
  Sampler r(negative);
  r.count_generated(2);  // 0.0 + 2.0 ties with token 0's 2.0: the lower id wins
  EXPECT_EQ(r.sample(logits), 0);
  r.count_generated(1);  // 1.5 + 2.0 = 3.5
  EXPECT_EQ(r.sample(logits), 1);
}

TEST(Sampler, PenaltyAndBiasRangesAreChecked) {
  SamplerParams p = plain();
  p.presence_penalty = 2.5f;
  EXPECT_THROW(Sampler{p}, tessera::Error);
  p = plain();
  p.frequency_penalty = -3.0f;
  EXPECT_THROW(Sampler{p}, tessera::Error);
  p = plain();
  p.logit_bias = {{1, 101.0f}};
  EXPECT_THROW(Sampler{p}, tessera::Error);
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(Sampler{p}, tessera::Error);
}

}  // namespace

// A whole vocabulary without top-k is ordered by a radix sort (sort_by_logit), top-k by
// std::partial_sort: both must give the same order, ties (equal logits, -0 and +0)
// by ascending id, so the same seed draws the same tokens. Top-p makes the draw depend
// on the order of every kept token.
TEST(Sampler, WholeVocabularyOrderMatchesTopKOrder) {
  const size_t n = 32000;
  std::vector<float> logits(n);
  uint64_t x = 99;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    logits[i] = float(int((x >> 33) % 64) - 32) / 8.0f;  // 64 values: many ties
  }
  logits[5] = -0.0f;
  logits[6] = 0.0f;
  logits[7] = std::numeric_limits<float>::quiet_NaN();
  logits[8] = std::numeric_limits<float>::infinity();
  logits[n - 1] = -std::numeric_limits<float>::infinity();  // the one token top-k n-1 leaves out
  for (float top_p : {1.0f, 0.9f, 0.3f}) {
    SCOPED_TRACE(top_p);
    SamplerParams whole = plain(0.8f, 5);
    whole.top_p = top_p;
    SamplerParams topk = whole;
    topk.top_k = int(n - 2);  // every finite logit but one of the lowest (NaN and -inf never count)
    std::vector<float> l = logits;
    l[n - 2] = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(sequence(whole, l, 300), sequence(topk, l, 300));
  }
}
