// PoolRef: a backend's handle on the host's worker pool through the C plugin ABI
// (TesseraPool), with FastPool's calls. Header-only, so it compiles into the plugin:
// a task's exception is caught on the executor that ran it and rethrown on the
// dispatching thread here, never inside the host. A null PoolRef runs every dispatch
// on the caller.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <type_traits>

#include "tessera/error.h"
#include "tessera/plugin_abi.h"

namespace tessera {

class FastPool;

class PoolRef {
 public:
  static constexpr int kMaxExecutors = 64;
  using Task = TesseraTask;
  struct PrefetchHint {
    const void* p = nullptr;
    size_t bytes = 0;
  };

  PoolRef() = default;
  PoolRef(TesseraPool* pool) : pool_(pool) {}  // NOLINT: implicit, like a pointer
  PoolRef(FastPool* pool);                      // host side (defined in libtessera_core)
  PoolRef(std::nullptr_t) {}

  explicit operator bool() const { return pool_ != nullptr; }
  TesseraPool* handle() const { return pool_; }
  int executor_count() const { return pool_ ? pool_->executors : 1; }

  // Runs tasks[0] on the caller and tasks[i] on worker i-1; returns when all are done.
  // Throws tessera::Error for more tasks than executors or when the host refuses the
  // dispatch; rethrows the first exception a task threw (lowest index).
  void dispatch_and_run(std::span<const Task> tasks) const {
    if (tasks.size() > size_t(executor_count()) || tasks.size() > size_t(kMaxExecutors))
      throw Error("PoolRef: " + std::to_string(tasks.size()) + " tasks for " +
                  std::to_string(executor_count()) + " executors");
    Guarded g[kMaxExecutors];
    TesseraTask wrapped[kMaxExecutors];
    for (size_t i = 0; i < tasks.size(); ++i) {
      g[i].task = tasks[i];
      wrapped[i] = {tasks[i].fn ? &Guarded::run : nullptr, &g[i]};
    }
    if (!pool_) {
      for (size_t i = 0; i < tasks.size(); ++i)
        if (wrapped[i].fn) wrapped[i].fn(wrapped[i].ctx, int(i));
    } else {
      char err[256] = {0};
      if (pool_->api->dispatch(pool_, wrapped, tasks.size(), err, sizeof err) != 0)
        throw Error(std::string("worker pool: ") + err);
    }
    for (size_t i = 0; i < tasks.size(); ++i)
      if (g[i].error) std::rethrow_exception(g[i].error);
  }

  // fn(ctx, i) for i in [0, executor_count()) on all executors.
  void parallel(void (*fn)(void* ctx, int index), void* ctx) const {
    Task t[kMaxExecutors];
    const int n = executor_count() < kMaxExecutors ? executor_count() : kMaxExecutors;
    for (int i = 0; i < n; ++i) t[i] = {fn, ctx};
    dispatch_and_run(std::span<const Task>(t, size_t(n)));
  }

  // f(begin, end) over [0, n) split into executor_count() contiguous chunks.
  template <typename F>
  void parallel_for(int64_t n, F&& f) const {
    struct Ctx { std::remove_reference_t<F>* f; int64_t n; int parts; } c{&f, n, executor_count()};
    parallel([](void* p, int i) {
      auto* cx = static_cast<Ctx*>(p);
      int64_t b = cx->n * i / cx->parts, e = cx->n * (i + 1) / cx->parts;
      if (b < e) (*cx->f)(b, e);
    }, &c);
  }

  // FastPool's idle prefetch (fast_pool.h), when the host offers it.
  void set_idle_prefetch(int executor, PrefetchHint hint) const {
    if (pool_ && TESSERA_HAS_FIELD(pool_->api, TesseraPoolApi, set_idle_prefetch) && pool_->api->set_idle_prefetch)
      pool_->api->set_idle_prefetch(pool_, executor, hint.p, hint.bytes);
  }
  void cancel_idle_prefetch() const {
    if (pool_ && TESSERA_HAS_FIELD(pool_->api, TesseraPoolApi, cancel_idle_prefetch) && pool_->api->cancel_idle_prefetch)
      pool_->api->cancel_idle_prefetch(pool_);
  }

  // The camelCase names of earlier SDKs, for plugins written against them.
  [[deprecated("use executor_count()")]] int executorCount() const { return executor_count(); }
  [[deprecated("use dispatch_and_run()")]] void dispatchAndRun(std::span<const Task> tasks) const {
    dispatch_and_run(tasks);
  }
  [[deprecated("use set_idle_prefetch()")]] void setIdlePrefetch(int executor, PrefetchHint hint) const {
    set_idle_prefetch(executor, hint);
  }
  [[deprecated("use cancel_idle_prefetch()")]] void cancelIdlePrefetch() const { cancel_idle_prefetch(); }

 private:
  struct Guarded {
    Task task{};
    std::exception_ptr error;
    static void run(void* ctx, int index) {
      auto* g = static_cast<Guarded*>(ctx);
      try {
        g->task.fn(g->task.ctx, index);
      } catch (...) {
        g->error = std::current_exception();
      }
    }
  };
  TesseraPool* pool_ = nullptr;
};

}  // namespace tessera
