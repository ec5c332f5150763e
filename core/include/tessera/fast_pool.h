// FastPool: the persistent worker pool for decode fan-out. dispatch_and_run(tasks)
// runs task 0 on the calling thread and tasks 1..n-1 on workers, then waits for all.
// Workers spin (pause, then brief yields, then sleep after a long idle) on per-worker
// cache-line-aligned slots; a dispatch takes no lock, allocates nothing and uses no
// condition variable.
//
// Waiting, in three stages: a worker spins on an acquire load of its slot's
// generation with a pause instruction (kSpinIters rounds; skipped when the pool has
// more executors than hardware threads, so an oversubscribed pool still progresses),
// then calls std::this_thread::yield() until it has been idle for kIdleSleepMicros,
// then blocks in C++20 std::atomic::wait on a 32-bit per-slot flag (a futex on
// Linux). The dispatcher calls notify only for a worker whose flag says it is
// asleep, so a hot dispatch makes no system call. The caller waiting for the
// workers spins, then yields; it never blocks.
//
// Exceptions: a task may throw. The pool catches it on the executor that ran it,
// still waits for every other task of the dispatch, and then rethrows the first
// exception (lowest task index) on the calling thread. Nothing is allocated unless
// a task throws.
//
// Threading contract: one dispatch at a time. dispatch_and_run called while another
// dispatch of the same pool is running (from another thread, or from inside a
// task) throws tessera::Error instead of deadlocking.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "tessera/plugin_abi.h"
#include "tessera/pool_ref.h"

namespace tessera {

class FastPool {
 public:
  static constexpr int kMaxWorkers = 16;
  // Pause-spin rounds before a waiting executor starts yielding.
  static constexpr int kSpinIters = 4096;
  // Idle time after which a worker stops yielding and blocks until the next dispatch.
  static constexpr int kIdleSleepMicros = 2000;

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
  int executor_count() const { return workers_ + 1; }

  // Runs tasks[0] on the caller and tasks[i] on worker i-1; returns when all are done.
  // tasks.size() must be <= executor_count() (else tessera::Error); workers past
  // tasks.size() do not run. A task with fn == nullptr is skipped. fn receives
  // ctx and its index in `tasks`.
  void dispatch_and_run(std::span<const Task> tasks);

  // Convenience: run fn(ctx, i) for i in [0, executor_count()) on all executors.
  void parallel(void (*fn)(void* ctx, int index), void* ctx);

  // Idle prefetch: what a worker reads into its cache after its task, while it waits
  // for the next dispatch (the part of the next matrix product it will stream first,
  // so memory stays busy while the caller runs the serial ops between products). The
  // worker stops at the next dispatch or cancel_idle_prefetch().
  struct PrefetchHint {
    const void* p = nullptr;
    size_t bytes = 0;
  };
  // Sets worker `executor`'s hint (1 <= executor < executor_count()) for the dispatches
  // that follow, until it is set again. Call only from the dispatching thread.
  void set_idle_prefetch(int executor, PrefetchHint hint);
  // Clears every hint and returns once no worker reads a hinted range any more. Call it
  // (from the dispatching thread) before freeing memory a hint may point into.
  void cancel_idle_prefetch();

  // This pool as the C plugin ABI's TesseraPool, valid while the pool lives: what a
  // backend plugin receives (PoolRef wraps it).
  TesseraPool* c_handle() { return &c_.pool; }
  struct CHandle {
    TesseraPool pool;  // first member: a TesseraPool* of a FastPool is its CHandle*
    FastPool* self;
  };

  // Workers currently blocked in the sleep stage (diagnostics and tests).
  int sleeping_workers() const;

  // The camelCase names of earlier SDKs, for code written against them.
  [[deprecated("use executor_count()")]] int executorCount() const { return executor_count(); }
  [[deprecated("use dispatch_and_run()")]] void dispatchAndRun(std::span<const Task> tasks) { dispatch_and_run(tasks); }
  [[deprecated("use set_idle_prefetch()")]] void setIdlePrefetch(int executor, PrefetchHint hint) {
    set_idle_prefetch(executor, hint);
  }
  [[deprecated("use cancel_idle_prefetch()")]] void cancelIdlePrefetch() { cancel_idle_prefetch(); }
  [[deprecated("use sleeping_workers()")]] int sleepingWorkers() const { return sleeping_workers(); }

  // Runs f(begin, end) over [0, n) split into executor_count() contiguous chunks (the
  // split PoolRef makes for plugins, so host and plugin code divide work alike).
  template <typename F>
  void parallel_for(int64_t n, F&& f) {
    PoolRef(this).parallel_for(n, f);
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> generation{0};  // bumped by the dispatcher to start work
    std::atomic<uint64_t> done{0};        // set to generation by the worker when finished
    Task task;
    PrefetchHint hint;                   // copied from hints_ at each dispatch
    uint64_t hint_epoch = 0;             // prefetch_epoch_ when hint was copied
    std::atomic<uint32_t> touching{0};   // 1 while the worker reads a hinted range
    std::atomic<uint32_t> sleeping{0};  // 1 while the worker is (about to be) blocked
    std::exception_ptr error;           // set by the worker when its task threw
  };
  void worker_main(int index);
  void touch_until_dispatch(Slot& s, PrefetchHint hint, uint64_t hint_epoch, uint64_t seen);
  void shutdown();  // stop, wake and join every started worker

  CHandle c_{};
  int workers_ = 0;
  std::unique_ptr<Slot[]> slots_;
  PrefetchHint hints_[kMaxWorkers];
  alignas(64) std::atomic<uint64_t> prefetch_epoch_{0};  // bumped by cancel_idle_prefetch
  std::vector<std::thread> threads_;
  // Read by every waiting worker at each spin: alone on its line, so the caller's
  // writes to the members below (at every dispatch) do not take it from the workers.
  alignas(64) std::atomic<bool> stop_{false};
  alignas(64) uint64_t generation_ = 0;
  bool spin_ = true;  // false when oversubscribed: waiters yield at once
  std::atomic<bool> in_dispatch_{false};
};

}  // namespace tessera
