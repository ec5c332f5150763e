#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/work_split.h"

using tessera::FastPool;
using tessera::WorkSplit;

namespace {

using Range = std::pair<int64_t, int64_t>;

std::vector<Range> drain(WorkSplit& s, int index) {
  std::vector<Range> got;
  int64_t b, e;
  while (s.next(index, b, e)) got.emplace_back(b, e);
  return got;
}

}  // namespace

TEST(WorkSplit, AnExecutorClaimsItsOwnShareFirstThenHalvesOfTheOthers) {
  WorkSplit s;
  s.reset(10, 2, 3);  // shares [0, 5) and [5, 10)
  // Own share in grains of 3, then the back half of [5, 10), then of what is left.
  EXPECT_EQ(drain(s, 0), (std::vector<Range>{{0, 3}, {3, 5}, {7, 10}, {6, 7}, {5, 6}}));
  int64_t b, e;
  EXPECT_FALSE(s.next(1, b, e));
}

TEST(WorkSplit, AClaimTakesAQuarterOfTheShareLeftButAtLeastTheGrain) {
  WorkSplit s;
  s.reset(64, 2, 1);  // shares [0, 32) and [32, 64)
  std::vector<int64_t> sizes;
  int64_t b, e, at = 0;
  while (at < 32 && s.next(0, b, e)) {
    EXPECT_EQ(b, at);
    sizes.push_back(e - b);
    at = e;
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{8, 6, 4, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1}));
  s.reset(64, 2, 5);
  ASSERT_TRUE(s.next(1, b, e));
  EXPECT_EQ(b, 32);
  EXPECT_EQ(e, 40);  // a quarter of 32
  ASSERT_TRUE(s.next(1, b, e));
  EXPECT_EQ(e - b, 6);  // 24 / 4
  ASSERT_TRUE(s.next(1, b, e));
  EXPECT_EQ(e - b, 5);  // 18 / 4 = 4, but the grain is 5
}

TEST(WorkSplit, ASingleExecutorGetsEverythingInOrder) {
  WorkSplit s;
  s.reset(7, 1, 2);
  EXPECT_EQ(drain(s, 0), (std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  s.reset(0, 1, 1);
  int64_t b, e;
  EXPECT_FALSE(s.next(0, b, e));
}

TEST(WorkSplit, RejectsBadArguments) {
  WorkSplit s;
  EXPECT_THROW(s.reset(-1, 2, 1), tessera::Error);
  EXPECT_THROW(s.reset(10, 0, 1), tessera::Error);
  EXPECT_THROW(s.reset(10, WorkSplit::kMaxExecutors + 1, 1), tessera::Error);
  EXPECT_THROW(s.reset(10, 2, 0), tessera::Error);
  EXPECT_THROW(s.reset(int64_t(1) << 33, 2, 1), tessera::Error);
}

namespace {

struct Shared {
  WorkSplit* split;
  std::vector<std::atomic<int>>* hits;
  std::atomic<int64_t> per_executor[WorkSplit::kMaxExecutors];
};

void claim_all(void* p, int index) {
  auto& c = *static_cast<Shared*>(p);
  int64_t b, e;
  while (c.split->next(index, b, e)) {
    ASSERT_LT(b, e);
    for (int64_t i = b; i < e; ++i) (*c.hits)[size_t(i)].fetch_add(1, std::memory_order_relaxed);
    c.per_executor[index].fetch_add(e - b, std::memory_order_relaxed);
  }
}

}  // namespace

// Concurrent executors (more than the machine's cores, so they interleave and steal
// from each other at random points): every item is handed out exactly once.
TEST(WorkSplit, EveryItemIsHandedOutExactlyOnceUnderContention) {
  for (int threads : {2, 3, 5}) {
    FastPool pool(threads);
    WorkSplit split;
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 4099})
      for (int64_t grain : {1, 3, 16}) {
        for (int round = 0; round < 20; ++round) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          Shared c{&split, &hits, {}};
          split.reset(n, threads, grain);
          pool.parallel(claim_all, &c);
          int64_t total = 0;
          for (int i = 0; i < threads; ++i) total += c.per_executor[i].load();
          ASSERT_EQ(total, n) << "threads " << threads << " n " << n << " grain " << grain;
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[size_t(i)].load(), 1) << "item " << i << " threads " << threads << " n " << n;
        }
      }
  }
}

namespace {

struct LateCtx {
  WorkSplit* split;
  std::atomic<bool> first_done{false};
  int64_t got[2] = {0, 0};
};

void late_second(void* p, int index) {
  auto& c = *static_cast<LateCtx*>(p);
  if (index == 1)  // starts only after executor 0 found no work left
    while (!c.first_done.load(std::memory_order_acquire)) std::this_thread::yield();
  int64_t b, e;
  while (c.split->next(index, b, e)) c.got[index] += e - b;
  if (index == 0) c.first_done.store(true, std::memory_order_release);
}

}  // namespace

// An executor that starts late loses its whole share to the one that started.
TEST(WorkSplit, AnExecutorThatStartsLateHasItsShareTaken) {
  FastPool pool(2);
  WorkSplit split;
  LateCtx c;
  c.split = &split;
  split.reset(1000, 2, 4);
  pool.parallel(late_second, &c);
  EXPECT_EQ(c.got[0], 1000);
  EXPECT_EQ(c.got[1], 0);
}
