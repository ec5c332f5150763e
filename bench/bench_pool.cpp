// Cost of one fan-out barrier: ns per dispatch_and_run with empty tasks, FastPool
// beside a plain mutex + condvar pool, and 1 executor (no workers) as the floor.
//   BM_Dispatch/fastpool/threads:2   BM_Dispatch/mutex/threads:2   .../threads:1
// BM_Dispatch reports the mean per dispatch (Google Benchmark's time); on a loaded
// machine a few preempted dispatches dominate it, so BM_DispatchLatency also times
// every dispatch on its own and reports p50/p90/p99 in ns (clock overhead, measured
// the same way, subtracted). BM_PingPong is the hardware floor under both: one
// cache-line round trip between two threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <vector>
#include <set>
#include <string>
#include <thread>

#include "bench_common.h"
#include "mutex_pool.h"
#include "tessera/fast_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
inline void cpu_pause() { _mm_pause(); }
#else
inline void cpu_pause() {}
#endif

namespace tessera::bench {
namespace {

void empty_task(void*, int) { benchmark::ClobberMemory(); }

template <typename Pool>
void bm_dispatch(benchmark::State& state, int executors) {
  Pool pool(executors);
  std::array<FastPool::Task, FastPool::kMaxWorkers + 1> tasks{};
  for (auto& t : tasks) t.fn = empty_task;
  std::span<const FastPool::Task> span(tasks.data(), size_t(pool.executor_count()));
  for (int i = 0; i < 1000; ++i) pool.dispatch_and_run(span);  // workers started and hot
  for (auto _ : state) pool.dispatch_and_run(span);
  state.counters["executors"] = pool.executor_count();
}

double percentile(std::vector<double>& v, double p) {
  size_t k = std::min(v.size() - 1, size_t(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

template <typename Pool>
void bm_dispatch_latency(benchmark::State& state, int executors) {
  using clk = std::chrono::steady_clock;
  Pool pool(executors);
  std::array<FastPool::Task, FastPool::kMaxWorkers + 1> tasks{};
  for (auto& t : tasks) t.fn = empty_task;
  std::span<const FastPool::Task> span(tasks.data(), size_t(pool.executor_count()));
  for (int i = 0; i < 1000; ++i) pool.dispatch_and_run(span);
  std::vector<double> ns, clock_ns;
  ns.reserve(1 << 20);
  for (auto _ : state) {
    auto t0 = clk::now();
    pool.dispatch_and_run(span);
    auto t1 = clk::now();
    if (ns.size() < (1u << 20)) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  for (int i = 0; i < 10000; ++i) {
    auto t0 = clk::now();
    auto t1 = clk::now();
    clock_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  const double overhead = percentile(clock_ns, 0.5);
  state.counters["p50_ns"] = std::max(0.0, percentile(ns, 0.5) - overhead);
  state.counters["p90_ns"] = std::max(0.0, percentile(ns, 0.9) - overhead);
  state.counters["p99_ns"] = std::max(0.0, percentile(ns, 0.99) - overhead);
  state.counters["clock_ns"] = overhead;
}

// The physical floor of a two-executor barrier: one cache-line round trip. The
// caller publishes i on one line and spins (with pause, as FastPool does) until a
// second thread echoes i on another line; ns per round trip. A dispatch cannot cost
// less than this on the same pair of CPUs.
void bm_ping_pong(benchmark::State& state) {
  struct alignas(64) Line { std::atomic<uint64_t> v{0}; };
  auto lines = std::make_unique<Line[]>(2);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    uint64_t seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t v = lines[0].v.load(std::memory_order_acquire);
      if (v != seen) {
        seen = v;
        lines[1].v.store(v, std::memory_order_release);
      } else {
        cpu_pause();
      }
    }
  });
  uint64_t i = 0;
  auto round_trip = [&] {
    lines[0].v.store(++i, std::memory_order_release);
    while (lines[1].v.load(std::memory_order_acquire) != i) cpu_pause();
  };
  for (int k = 0; k < 1000; ++k) round_trip();  // both threads running and hot
  for (auto _ : state) round_trip();
  stop.store(true);
  echo.join();
}

}  // namespace

void register_pool_benchmarks() {
  benchmark::RegisterBenchmark("BM_PingPong/threads:2", bm_ping_pong)->UseRealTime();
  std::set<int> counts{1, 2, bench_threads()};
  for (int n : counts) {
    if (n > FastPool::kMaxWorkers + 1) continue;
    std::string suffix = "/threads:" + std::to_string(n);
    benchmark::RegisterBenchmark(("BM_Dispatch/fastpool" + suffix).c_str(),
                                 [n](benchmark::State& s) { bm_dispatch<FastPool>(s, n); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(("BM_Dispatch/mutex" + suffix).c_str(),
                                 [n](benchmark::State& s) { bm_dispatch<MutexPool>(s, n); })
        ->UseRealTime();
  }
  for (int n : counts) {
    if (n > FastPool::kMaxWorkers + 1) continue;
    std::string suffix = "/threads:" + std::to_string(n);
    benchmark::RegisterBenchmark(("BM_DispatchLatency/fastpool" + suffix).c_str(),
                                 [n](benchmark::State& s) { bm_dispatch_latency<FastPool>(s, n); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(("BM_DispatchLatency/mutex" + suffix).c_str(),
                                 [n](benchmark::State& s) { bm_dispatch_latency<MutexPool>(s, n); })
        ->UseRealTime();
  }
}

}  // namespace tessera::bench
