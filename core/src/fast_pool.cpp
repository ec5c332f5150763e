// FastPool: persistent workers fed through per-worker slots (see fast_pool.h).
//
// Dispatch protocol for worker w (slot s):
//   dispatcher: s.task = t; s.generation.store(g, seq_cst);
//               if (s.sleeping.load(seq_cst) && s.sleeping.exchange(0)) notify
//   worker:     spin / yield on s.generation (acquire) until it differs from the
//               last generation it ran; run s.task; s.done.store(g, release).
// Before blocking, a worker stores sleeping = 1 (seq_cst) and re-reads generation
// and stop_ (seq_cst): in the single total order either the worker sees the new
// generation, or the dispatcher sees sleeping == 1 and wakes it, so no wake-up is
// lost. std::atomic<uint32_t>::wait is a futex wait on Linux (no mutex, no condvar).
#include "tessera/fast_pool.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>

#include <boost/version.hpp>

#include "tessera/error.h"
#include "tessera/pool_ref.h"

// The spin-wait hint (the CPU's pause instruction, or nothing where it has none) comes
// from Boost, so the core names no instruction set (decision 65). Boost.Core made it
// public in 1.81; bookworm's 1.74 has the same function in Boost.SmartPtr's detail.
#if BOOST_VERSION >= 108100
#include <boost/core/yield_primitives.hpp>
#define TESSERA_SPIN_PAUSE() boost::core::sp_thread_pause()
#else
#include <boost/smart_ptr/detail/sp_thread_pause.hpp>
#define TESSERA_SPIN_PAUSE() boost::detail::sp_thread_pause()
#endif

namespace tessera {
namespace {

// One step of a spin wait: tells the core (and an SMT sibling) that this thread is
// polling, without giving up the time slice.
inline void cpu_relax() { TESSERA_SPIN_PAUSE(); }

int resolve_threads(int threads) {
  if (threads < 0)
    throw Error("FastPool: thread count must be >= 0 (0 = hardware), got " + std::to_string(threads));
  if (threads == 0) {
    unsigned hw = std::thread::hardware_concurrency();
    threads = hw == 0 ? 1 : int(std::min<unsigned>(hw, FastPool::kMaxWorkers + 1));
  }
  return std::min(threads, FastPool::kMaxWorkers + 1);
}

// The C plugin ABI's view of a FastPool (TesseraPoolApi): errors are return codes.
FastPool& host(TesseraPool* p) { return *reinterpret_cast<FastPool::CHandle*>(p)->self; }

int32_t c_dispatch(TesseraPool* p, const TesseraTask* tasks, size_t count, char* error, size_t error_size) {
  try {
    static_assert(sizeof(FastPool::Task) == sizeof(TesseraTask));
    std::array<FastPool::Task, FastPool::kMaxWorkers + 1> t;
    if (count > t.size()) throw Error("dispatch of " + std::to_string(count) + " tasks, at most " + std::to_string(t.size()));
    for (size_t i = 0; i < count; ++i) t[i] = {tasks[i].fn, tasks[i].ctx};
    host(p).dispatch_and_run(std::span<const FastPool::Task>(t.data(), count));
    return 0;
  } catch (const std::exception& e) {
    if (error && error_size) std::snprintf(error, error_size, "%s", e.what());
  } catch (...) {
    if (error && error_size) std::snprintf(error, error_size, "unknown error");
  }
  return -1;
}
void c_set_idle_prefetch(TesseraPool* p, int32_t executor, const void* ptr, size_t bytes) {
  try {
    host(p).set_idle_prefetch(executor, {ptr, bytes});
  } catch (...) {
  }
}
void c_cancel_idle_prefetch(TesseraPool* p) { host(p).cancel_idle_prefetch(); }
const TesseraPoolApi kHostPoolApi = {sizeof(TesseraPoolApi), &c_dispatch, &c_set_idle_prefetch, &c_cancel_idle_prefetch};

}  // namespace

PoolRef::PoolRef(FastPool* pool) : pool_(pool ? pool->c_handle() : nullptr) {}

FastPool::FastPool(int threads) {
  const int executors = resolve_threads(threads);
  workers_ = executors - 1;
  c_ = {{&kHostPoolApi, executors}, this};
  unsigned hw = std::thread::hardware_concurrency();
  spin_ = hw == 0 || unsigned(executors) <= hw;
  slots_ = std::make_unique<Slot[]>(size_t(std::max(workers_, 1)));
  threads_.reserve(size_t(workers_));
  try {
    for (int w = 0; w < workers_; ++w) threads_.emplace_back([this, w] { worker_main(w); });
  } catch (...) {
    shutdown();  // stop and join the workers that did start
    throw;
  }
}

FastPool::~FastPool() { shutdown(); }

void FastPool::shutdown() {
  stop_.store(true, std::memory_order_seq_cst);
  for (int w = 0; w < int(threads_.size()); ++w) {
    Slot& s = slots_[size_t(w)];
    if (s.sleeping.load(std::memory_order_seq_cst) != 0 && s.sleeping.exchange(0) != 0)
      s.sleeping.notify_one();
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void FastPool::worker_main(int index) {
  Slot& s = slots_[size_t(index)];
  uint64_t seen = 0;  // slots start at generation 0; never read it here (a dispatch may already have bumped it)
  using Clock = std::chrono::steady_clock;
  const auto idle_limit = std::chrono::microseconds(kIdleSleepMicros);

  for (;;) {
    uint64_t g = s.generation.load(std::memory_order_acquire);
    if (g == seen) {
      // Stage 1: spin with pause.
      if (spin_) {
        for (int i = 0; i < kSpinIters; ++i) {
          cpu_relax();
          g = s.generation.load(std::memory_order_acquire);
          if (g != seen || stop_.load(std::memory_order_relaxed)) break;
        }
      }
      // Stage 2: yield until idle for kIdleSleepMicros.
      if (g == seen) {
        const auto start = Clock::now();
        for (;;) {
          if (stop_.load(std::memory_order_acquire)) return;
          std::this_thread::yield();
          g = s.generation.load(std::memory_order_acquire);
          if (g != seen) break;
          if (Clock::now() - start >= idle_limit) break;
        }
      }
      // Stage 3: block on the futex word until a dispatch (or stop) wakes us.
      if (g == seen) {
        s.sleeping.store(1, std::memory_order_seq_cst);
        for (;;) {
          g = s.generation.load(std::memory_order_seq_cst);
          if (g != seen || stop_.load(std::memory_order_seq_cst)) break;
          if (s.sleeping.load(std::memory_order_seq_cst) == 0) {
            // Woken (or a racing dispatcher cleared the flag): re-arm and re-check.
            s.sleeping.store(1, std::memory_order_seq_cst);
            continue;
          }
          s.sleeping.wait(1, std::memory_order_seq_cst);
        }
        s.sleeping.store(0, std::memory_order_relaxed);
      }
      if (g == seen) {  // only stop_ gets here with no new work
        if (stop_.load(std::memory_order_acquire)) return;
        continue;
      }
    }
    const Task t = s.task;
    const PrefetchHint hint = s.hint;  // read before done: the next dispatch rewrites it
    const uint64_t hint_epoch = s.hint_epoch;
    if (t.fn) {
      try {
        t.fn(t.ctx, index + 1);
      } catch (...) {
        s.error = std::current_exception();
      }
    }
    seen = g;
    s.done.store(g, std::memory_order_release);
    touch_until_dispatch(s, hint, hint_epoch, g);
  }
}

// Reads one byte of every cache line of the hint, 64 lines between looks at the slot
// and the cancel epoch. Loads, not prefetch instructions: a prefetch may be dropped
// when the miss buffers are full, a load is not. Loads can fault, so a range may only
// be freed after cancel_idle_prefetch() (the touching flag and the epoch).
void FastPool::touch_until_dispatch(Slot& s, PrefetchHint hint, uint64_t hint_epoch, uint64_t seen) {
  if (hint.bytes == 0) return;
  s.touching.store(1, std::memory_order_seq_cst);
  if (prefetch_epoch_.load(std::memory_order_seq_cst) == hint_epoch) {
    const auto* p = static_cast<const volatile uint8_t*>(hint.p);
    uint32_t sink = 0;
    for (size_t off = 0; off < hint.bytes; off += 64 * 64) {
      if (s.generation.load(std::memory_order_relaxed) != seen ||
          prefetch_epoch_.load(std::memory_order_relaxed) != hint_epoch)
        break;
      const size_t stop = std::min(hint.bytes, off + 64 * 64);
      for (size_t o = off; o < stop; o += 64) sink += p[o];
    }
    [[maybe_unused]] volatile uint32_t keep = sink;
  }
  s.touching.store(0, std::memory_order_release);
}

void FastPool::set_idle_prefetch(int executor, PrefetchHint hint) {
  if (executor < 1 || executor > workers_)
    throw Error("FastPool::set_idle_prefetch: executor " + std::to_string(executor) + " is not a worker (1.." +
                std::to_string(workers_) + ")");
  hints_[executor - 1] = hint;
}

// Dekker with touch_until_dispatch: either the worker's epoch check comes after the
// increment (it touches nothing), or its touching = 1 comes before our read of it
// (we wait, and it sees the new epoch within 64 lines).
void FastPool::cancel_idle_prefetch() {
  for (int w = 0; w < workers_; ++w) hints_[w] = PrefetchHint{};
  prefetch_epoch_.fetch_add(1, std::memory_order_seq_cst);
  for (int w = 0; w < workers_; ++w)
    while (slots_[size_t(w)].touching.load(std::memory_order_seq_cst) != 0) cpu_relax();
}

void FastPool::dispatch_and_run(std::span<const Task> tasks) {
  if (tasks.size() > size_t(executor_count()))
    throw Error("FastPool::dispatch_and_run: " + std::to_string(tasks.size()) + " tasks for " +
                std::to_string(executor_count()) + " executors");
  if (tasks.empty()) return;
  if (in_dispatch_.exchange(true, std::memory_order_acquire))
    throw Error("FastPool::dispatch_and_run: the pool is already dispatching (nested or concurrent call)");

  const int used = int(tasks.size()) - 1;  // workers that get a task
  const uint64_t g = ++generation_;
  for (int w = 0; w < used; ++w) {
    Slot& s = slots_[size_t(w)];
    s.task = tasks[size_t(w) + 1];
    s.hint = hints_[w];
    s.hint_epoch = prefetch_epoch_.load(std::memory_order_relaxed);
    s.generation.store(g, std::memory_order_seq_cst);
    if (s.sleeping.load(std::memory_order_seq_cst) != 0 && s.sleeping.exchange(0) != 0)
      s.sleeping.notify_one();
  }

  std::exception_ptr first;
  if (tasks[0].fn) {
    try {
      tasks[0].fn(tasks[0].ctx, 0);
    } catch (...) {
      first = std::current_exception();
    }
  }

  for (int w = 0; w < used; ++w) {
    Slot& s = slots_[size_t(w)];
    if (s.done.load(std::memory_order_acquire) != g) {
      int spins = spin_ ? kSpinIters : 0;
      while (s.done.load(std::memory_order_acquire) != g) {
        if (spins > 0) {
          --spins;
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
    if (s.error) {
      if (!first) first = s.error;
      s.error = nullptr;
    }
  }
  in_dispatch_.store(false, std::memory_order_release);
  if (first) std::rethrow_exception(first);
}

void FastPool::parallel(void (*fn)(void* ctx, int index), void* ctx) {
  std::array<Task, kMaxWorkers + 1> tasks;
  const int n = executor_count();
  for (int i = 0; i < n; ++i) tasks[size_t(i)] = Task{fn, ctx};
  dispatch_and_run(std::span<const Task>(tasks.data(), size_t(n)));
}

int FastPool::sleeping_workers() const {
  int n = 0;
  for (int w = 0; w < workers_; ++w)
    if (slots_[size_t(w)].sleeping.load(std::memory_order_relaxed) != 0) ++n;
  return n;
}

}  // namespace tessera
