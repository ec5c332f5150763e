// FastPool dispatch probe (see dispatch_probe.h).
#include "tessera/dispatch_probe.h"

#include <array>
#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "probe_stats.h"
#include "tessera/error.h"

namespace tessera {
namespace {

// An empty task that still writes something (its executor's own line), so neither the
// call nor the dispatch can be optimized away.
void empty_task(void* ctx, int index) { static_cast<std::atomic<int>*>(ctx)->store(index, std::memory_order_relaxed); }

}  // namespace

DispatchResult measure_dispatch(FastPool& pool, int batches, int per_batch) {
  if (batches < 1 || per_batch < 1)
    throw Error("measure_dispatch: batches and dispatches per batch must be >= 1, got " + std::to_string(batches) +
                " and " + std::to_string(per_batch));
  const int n = pool.executor_count();
  // One line per executor, so the tasks' writes do not share a cache line.
  struct alignas(64) Line { std::atomic<int> v{0}; };
  std::array<Line, FastPool::kMaxWorkers + 1> lines;
  std::array<FastPool::Task, FastPool::kMaxWorkers + 1> tasks{};
  for (int i = 0; i < n; ++i) tasks[size_t(i)] = {empty_task, &lines[size_t(i)].v};
  const std::span<const FastPool::Task> span(tasks.data(), size_t(n));
  using Clock = std::chrono::steady_clock;
  std::vector<double> ns;
  for (int b = 0; b <= batches; ++b) {  // batch 0 wakes the workers and warms the lines
    const auto t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) pool.dispatch_and_run(span);
    const double dt = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    if (b > 0) ns.push_back(dt / per_batch);
  }
  const detail::Spread s = detail::spread(ns);
  return {s.median, s.min, s.max, batches, per_batch, n};
}

}  // namespace tessera
