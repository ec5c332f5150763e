// plan_memory(): how the budget is split between weights, the expert cache and the KV
// pool, and when it refuses (a hard limit) or warns (MemAvailable).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "tessera/error.h"
#include "tessera/memory_plan.h"

using tessera::MemoryBudget;
using tessera::MemoryLimit;
using tessera::MemoryNeeds;
using tessera::MemoryPlan;
using tessera::plan_memory;

namespace {

constexpr uint64_t GiB = uint64_t(1) << 30, MiB = uint64_t(1) << 20;

MemoryBudget budget(uint64_t bytes, bool hard) {
  MemoryBudget b;
  MemoryLimit l;
  l.source = hard ? "cgroup v1 memory.limit_in_bytes" : "MemAvailable";
  l.limit = bytes;
  l.hard = hard;
  b.limits.push_back(l);
  b.binding = 0;
  b.bytes = bytes;
  return b;
}

// The Qwen3-30B-A3B shape in Q4_K_M: 17.3 GiB of weights, 16.3 GiB of them routed
// experts (about 350 MiB a layer), 96 KiB of KV per position.
MemoryNeeds moe(int64_t sequences, int64_t request = -1) {
  MemoryNeeds n;
  n.weights = 17 * GiB + 300 * MiB;
  n.expert_weights = 16 * GiB + 300 * MiB;
  n.min_expert_cache = 348 * MiB;
  n.page_tokens = 16;
  n.kv_page_bytes = 16 * 96 * 1024;  // 48 layers x K and V x 4 heads x 128 x F16 per position
  n.n_ctx = 4096;
  n.pages_per_sequence = 256;
  n.max_sequences = sequences;
  n.expert_cache_request = request;
  return n;
}

MemoryNeeds dense(uint64_t weights, int64_t sequences) {
  MemoryNeeds n = moe(sequences);
  n.weights = weights;
  n.expert_weights = 0;
  n.min_expert_cache = 0;
  return n;
}

TEST(MemoryPlan, NoBudgetKeepsEverything) {
  const MemoryPlan p = plan_memory(moe(8), MemoryBudget{});
  EXPECT_FALSE(p.stream_experts);
  EXPECT_EQ(p.kv_pages, 8 * 256);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(MemoryPlan, MoeThatFitsStaysResident) {
  const MemoryPlan p = plan_memory(moe(1), budget(22 * GiB, false));
  EXPECT_FALSE(p.stream_experts);
  EXPECT_EQ(p.kv_pages, 256);
  EXPECT_EQ(p.headroom, 2 * GiB);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(MemoryPlan, MoeInTwelveGiBStreamsThroughWhatIsLeft) {
  const MemoryPlan p = plan_memory(moe(1), budget(12 * GiB, true));
  ASSERT_TRUE(p.stream_experts);
  EXPECT_EQ(p.headroom, 12 * GiB / 8);
  const uint64_t kv = 256 * uint64_t(16 * 96 * 1024);
  EXPECT_EQ(p.kv_bytes(), kv);
  EXPECT_EQ(p.expert_cache, 12 * GiB - (1 * GiB) - kv - p.headroom);
  EXPECT_LE(p.resident_weights() + p.kv_bytes() + p.headroom, 12 * GiB);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("streaming its routed experts"), std::string::npos) << p.warnings[0];
  EXPECT_NE(p.describe().find("streamed through a"), std::string::npos) << p.describe();
}

TEST(MemoryPlan, KvPoolShrinksToWhatFitsWithAWarning) {
  // 8 sequences of 4096 positions need 3 GiB; 4 GiB leaves 4 - 1 - 0.35 - 0.5 for KV.
  const MemoryPlan p = plan_memory(moe(8), budget(4 * GiB, true));
  ASSERT_TRUE(p.stream_experts);
  EXPECT_EQ(p.expert_cache, 348 * MiB);
  EXPECT_LT(p.kv_pages, 8 * 256);
  EXPECT_GE(p.kv_pages, 256);
  EXPECT_LE(p.resident_weights() + p.kv_bytes() + p.headroom, 4 * GiB);
  ASSERT_EQ(p.warnings.size(), 2u);
  EXPECT_NE(p.warnings[1].find("Lower --parallel or --ctx"), std::string::npos) << p.warnings[1];
  EXPECT_NE(p.describe().find(" of 8 x 4096 positions"), std::string::npos) << p.describe();
}

TEST(MemoryPlan, KvPoolNeverBelowOneContext) {
  const MemoryPlan p = plan_memory(dense(1 * GiB, 4), budget(1 * GiB + 600 * MiB, true));
  EXPECT_EQ(p.kv_pages, 256);
  EXPECT_FALSE(p.warnings.empty());
}

TEST(MemoryPlan, HardLimitBelowTheLeastRefusesWithTheNumbers) {
  try {
    plan_memory(moe(1), budget(1 * GiB, true));
    FAIL() << "a 1 GiB cgroup cannot hold 1.0 GiB of weights, an expert cache and KV";
  } catch (const tessera::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not fit in the memory budget 1.0 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("the smallest expert cache (348 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("384 MiB, 4096 positions"), std::string::npos) << m;
  }
}

TEST(MemoryPlan, ExpertsKeptResidentByOffAreRefusedInASmallCgroup) {
  try {
    plan_memory(moe(1, 0), budget(12 * GiB, true));
    FAIL() << "--expert-cache off keeps 17.3 GiB resident";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Choose --expert-cache auto (streams the experts"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, ExplicitCacheTooLargeIsRefused) {
  EXPECT_THROW(plan_memory(moe(1, int64_t(12 * GiB)), budget(8 * GiB, true)), tessera::Error);
  const MemoryPlan p = plan_memory(moe(1, int64_t(4 * GiB)), budget(8 * GiB, true));
  EXPECT_TRUE(p.stream_experts);
  EXPECT_EQ(p.expert_cache, 4 * GiB);
}

TEST(MemoryPlan, MemAvailableBelowTheLeastOnlyWarns) {
  const MemoryPlan p = plan_memory(dense(8 * GiB, 1), budget(4 * GiB, false));
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings.back().find("going on"), std::string::npos) << p.warnings.back();
}

TEST(MemoryPlan, HeadroomIsAnEighthBetween512MiBAnd2GiB) {
  EXPECT_EQ(plan_memory(dense(MiB, 1), budget(2 * GiB, false)).headroom, 512 * MiB);
  EXPECT_EQ(plan_memory(dense(MiB, 1), budget(8 * GiB, false)).headroom, 1 * GiB);
  EXPECT_EQ(plan_memory(dense(MiB, 1), budget(64 * GiB, false)).headroom, 2 * GiB);
}

}  // namespace
