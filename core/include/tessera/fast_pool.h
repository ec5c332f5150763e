// FastPool: the persistent worker pool for decode fan-out. dispatchAndRun(tasks)
// runs task 0 on the calling thread and tasks 1..n-1 on workers, then waits for all.
// Workers spin (pause, then brief yields, then sleep after a long idle) on per-worker
// cache-line-aligned slots; a dispatch takes no lock, allocates nothing and uses no
// condition variable.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

namespace tessera {

class FastPool {
 public:
  static constexpr int kMaxWorkers = 16;

  // A task: a plain function pointer plus context, so dispatch never allocates.
  struct Task {
    void (*fn)(void* ctx, int index) = nullptr;
    void* ctx = nullptr;
  };

  // threads = total executors including the caller (1..kMaxWorkers+1); 0 = hardware.
  explicit FastPool(int threads = 0);
  ~FastPool();
  FastPool(const FastPool&) = delete;
  FastPool& operator=(const FastPool&) = delete;

  // Number of executors (caller + workers): the useful task count per dispatch.
  int executorCount() const { return workers_ + 1; }

  // Runs tasks[0] on the caller and tasks[i] on worker i-1; returns when all are done.
  // tasks.size() must be <= executorCount().
  void dispatchAndRun(std::span<const Task> tasks);

  // Convenience: run fn(ctx, i) for i in [0, executorCount()) on all executors.
  void parallel(void (*fn)(void* ctx, int index), void* ctx);

  // Runs f(begin, end) over [0, n) split into executorCount() contiguous chunks.
  template <typename F>
  void parallel_for(int64_t n, F&& f) {
    struct Ctx { F* f; int64_t n; int parts; } c{&f, n, executorCount()};
    parallel([](void* p, int i) {
      auto* cx = static_cast<Ctx*>(p);
      int64_t b = cx->n * i / cx->parts, e = cx->n * (i + 1) / cx->parts;
      if (b < e) (*cx->f)(b, e);
    }, &c);
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> generation{0};  // bumped by the dispatcher to start work
    std::atomic<uint64_t> done{0};        // set to generation by the worker when finished
    Task task;
  };
  void worker_main(int index);

  int workers_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::thread> threads_;
  alignas(64) std::atomic<bool> stop_{false};
  uint64_t generation_ = 0;
};

}  // namespace tessera
