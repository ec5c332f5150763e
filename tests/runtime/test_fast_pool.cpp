#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tessera/error.h"
#include "tessera/fast_pool.h"

#include <sys/mman.h>
#include <unistd.h>

using tessera::FastPool;

namespace {

struct alignas(64) Counter {
  uint64_t n = 0;
};

struct CountCtx {
  Counter* counters;
};

void count_task(void* p, int i) { static_cast<CountCtx*>(p)->counters[i].n++; }

// Each dispatch, each of `ntasks` tasks bumps its own counter.
void run_counting(FastPool& pool, int ntasks, int dispatches) {
  std::vector<Counter> counters(size_t(FastPool::kMaxWorkers + 1));
  CountCtx ctx{counters.data()};
  std::vector<FastPool::Task> tasks(size_t(ntasks), FastPool::Task{count_task, &ctx});
  for (int d = 0; d < dispatches; ++d) pool.dispatch_and_run(tasks);
  for (int i = 0; i < int(counters.size()); ++i)
    EXPECT_EQ(counters[size_t(i)].n, i < ntasks ? uint64_t(dispatches) : 0u) << "task " << i;
}

}  // namespace

TEST(FastPool, ExecutorCount) {
  EXPECT_EQ(FastPool(1).executor_count(), 1);
  EXPECT_EQ(FastPool(2).executor_count(), 2);
  EXPECT_EQ(FastPool(17).executor_count(), FastPool::kMaxWorkers + 1);
  EXPECT_EQ(FastPool(64).executor_count(), FastPool::kMaxWorkers + 1);
  FastPool hw(0);
  EXPECT_GE(hw.executor_count(), 1);
  EXPECT_LE(hw.executor_count(), FastPool::kMaxWorkers + 1);
  EXPECT_THROW(FastPool(-1), tessera::Error);
}

class FastPoolThreads : public ::testing::TestWithParam<int> {};

TEST_P(FastPoolThreads, EveryTaskRunsOncePerDispatch) {
  FastPool pool(GetParam());
  run_counting(pool, pool.executor_count(), 10000);
}

TEST_P(FastPoolThreads, FewerTasksThanExecutors) {
  FastPool pool(GetParam());
  const int n = pool.executor_count();
  for (int t : {1, n / 2, n - 1}) {
    if (t < 1) continue;
    run_counting(pool, t, 2000);
  }
  // The full set still works after partial dispatches.
  run_counting(pool, n, 1000);
}

TEST_P(FastPoolThreads, TaskZeroRunsOnCaller) {
  FastPool pool(GetParam());
  const int n = pool.executor_count();
  std::vector<std::thread::id> ids(static_cast<size_t>(n));
  struct Ctx { std::thread::id* ids; } ctx{ids.data()};
  for (int rep = 0; rep < 50; ++rep) {
    pool.parallel([](void* p, int i) { static_cast<Ctx*>(p)->ids[i] = std::this_thread::get_id(); }, &ctx);
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    for (int i = 1; i < n; ++i) EXPECT_NE(ids[size_t(i)], std::this_thread::get_id()) << i;
  }
  // Workers are distinct threads.
  std::vector<std::thread::id> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
}

TEST_P(FastPoolThreads, ParallelForCoversRangeOnce) {
  FastPool pool(GetParam());
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), int64_t(17), int64_t(1001), int64_t(12345)}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    for (auto& h : hits) h.store(0);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      ASSERT_LE(0, b);
      ASSERT_LT(b, e);
      ASSERT_LE(e, n);
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST_P(FastPoolThreads, WorksAfterWorkersFallAsleep) {
  FastPool pool(GetParam());
  run_counting(pool, pool.executor_count(), 100);
  std::this_thread::sleep_for(std::chrono::microseconds(FastPool::kIdleSleepMicros) * 10 +
                              std::chrono::milliseconds(20));
  // Every worker should have gone to sleep by now (allow scheduling slack).
  for (int i = 0; i < 200 && pool.sleeping_workers() < pool.executor_count() - 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pool.sleeping_workers(), pool.executor_count() - 1);
  run_counting(pool, pool.executor_count(), 100);
  // Sleep and wake a few more times, with partial dispatches too.
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::microseconds(FastPool::kIdleSleepMicros) * 3);
    run_counting(pool, std::max(1, pool.executor_count() / 2), 10);
  }
}

TEST_P(FastPoolThreads, DestroyWhileSleeping) {
  FastPool pool(GetParam());
  run_counting(pool, pool.executor_count(), 10);
  std::this_thread::sleep_for(std::chrono::microseconds(FastPool::kIdleSleepMicros) * 10);
}

INSTANTIATE_TEST_SUITE_P(Threads, FastPoolThreads, ::testing::Values(1, 2, 3, 4, 8, 17),
                         [](const auto& info) { return "t" + std::to_string(info.param); });

TEST(FastPool, DestroyIdleImmediately) {
  for (int t : {1, 2, 4, 17}) {
    FastPool pool(t);  // never dispatched
  }
  for (int t : {2, 4, 17}) {
    FastPool pool(t);
    run_counting(pool, pool.executor_count(), 5);
  }
}

TEST(FastPool, TooManyTasksThrows) {
  FastPool pool(2);
  std::vector<FastPool::Task> tasks(3);
  EXPECT_THROW(pool.dispatch_and_run(tasks), tessera::Error);
  pool.dispatch_and_run({});  // empty is a no-op
  run_counting(pool, 2, 10);
}

TEST(FastPool, ExceptionRethrownOnCaller) {
  FastPool pool(4);
  struct Ctx { std::atomic<int> ran{0}; } ctx;
  auto thrower = [](void* p, int i) {
    static_cast<Ctx*>(p)->ran.fetch_add(1);
    if (i == 2) throw std::runtime_error("task 2 failed");
  };
  for (int rep = 0; rep < 3; ++rep) {
    ctx.ran = 0;
    try {
      pool.parallel(thrower, &ctx);
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "task 2 failed");
    }
    EXPECT_EQ(ctx.ran.load(), 4);  // every task ran before the rethrow
  }
  // Caller's own task throwing: still waits for the workers.
  ctx.ran = 0;
  EXPECT_THROW(pool.parallel([](void* p, int i) {
                 static_cast<Ctx*>(p)->ran.fetch_add(1);
                 if (i == 0) throw std::logic_error("caller");
               }, &ctx),
               std::logic_error);
  EXPECT_EQ(ctx.ran.load(), 4);
  run_counting(pool, 4, 100);  // the pool is still usable
}

TEST(FastPool, NestedDispatchThrows) {
  FastPool pool(2);
  struct Ctx { FastPool* pool; } ctx{&pool};
  EXPECT_THROW(pool.parallel([](void* p, int) {
                 auto* c = static_cast<Ctx*>(p);
                 c->pool->parallel([](void*, int) {}, nullptr);
               }, &ctx),
               tessera::Error);
  run_counting(pool, 2, 10);
}

namespace {

// An anonymous mapping whose pages are not touched yet (mincore says so).
struct FreshPages {
  size_t bytes;
  char* p;
  explicit FreshPages(size_t n) : bytes(n) {
    p = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) p = nullptr;
    if (p) madvise(p, n, MADV_NOHUGEPAGE);  // count 4 KiB pages
  }
  ~FreshPages() {
    if (p) munmap(p, bytes);
  }
  size_t resident() const {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v((bytes + page - 1) / page);
    if (mincore(p, bytes, v.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  }
};

}  // namespace

// After its task a worker reads the hinted range (the pages become present); the
// caller's range stays untouched, since hints are for workers only.
TEST(FastPool, AnIdleWorkerReadsItsPrefetchHint) {
  FastPool pool(2);
  FreshPages mem(256 << 10);
  ASSERT_NE(mem.p, nullptr);
  ASSERT_EQ(mem.resident(), 0u) << "the fresh mapping is already present; cannot observe the worker's reads";
  pool.set_idle_prefetch(1, {mem.p, mem.bytes});
  pool.parallel([](void*, int) {}, nullptr);
  const size_t pages = mem.bytes / size_t(sysconf(_SC_PAGESIZE));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (mem.resident() < pages && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(mem.resident(), pages);
  pool.cancel_idle_prefetch();
}

TEST(FastPool, IdlePrefetchIsForWorkersOnly) {
  FastPool pool(3);
  char b[64];
  EXPECT_THROW(pool.set_idle_prefetch(0, {b, sizeof b}), tessera::Error);
  EXPECT_THROW(pool.set_idle_prefetch(3, {b, sizeof b}), tessera::Error);
  EXPECT_NO_THROW(pool.set_idle_prefetch(2, {b, sizeof b}));
  pool.cancel_idle_prefetch();
}

// cancel_idle_prefetch returns only once no worker reads a hinted range: the range is
// unmapped right after it, so a worker still reading it would crash the test. 16 MiB
// takes the worker far longer to read than the caller needs to get to the munmap.
TEST(FastPool, AHintedRangeCanBeFreedAfterCancel) {
  FastPool pool(2);
  for (int round = 0; round < 50; ++round) {
    FreshPages mem(16 << 20);
    ASSERT_NE(mem.p, nullptr);
    pool.set_idle_prefetch(1, {mem.p, mem.bytes});
    pool.parallel([](void*, int) {}, nullptr);
    if (round % 2) std::this_thread::sleep_for(std::chrono::microseconds(50));  // some rounds mid-read
    pool.cancel_idle_prefetch();
  }  // munmap
  run_counting(pool, 2, 10);
}
