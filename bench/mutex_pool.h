// A straightforward mutex + condition-variable worker pool, the baseline FastPool is
// measured against: a generation counter under a mutex, notify_all to start the
// workers, a completion counter and a second condvar to wait for them. Same
// dispatch contract as FastPool::dispatch_and_run (task 0 on the caller).
#pragma once
#include <condition_variable>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "tessera/fast_pool.h"

namespace tessera::bench {

class MutexPool {
 public:
  using Task = FastPool::Task;

  explicit MutexPool(int executors) {
    for (int w = 0; w + 1 < executors; ++w) threads_.emplace_back([this, w] { worker(w); });
  }
  ~MutexPool() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  MutexPool(const MutexPool&) = delete;
  MutexPool& operator=(const MutexPool&) = delete;

  int executor_count() const { return int(threads_.size()) + 1; }

  void dispatch_and_run(std::span<const Task> tasks) {
    {
      std::lock_guard lk(m_);
      tasks_ = tasks;
      pending_ = int(threads_.size());
      ++generation_;
    }
    start_cv_.notify_all();
    if (!tasks.empty() && tasks[0].fn) tasks[0].fn(tasks[0].ctx, 0);
    std::unique_lock lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }

 private:
  void worker(int w) {
    uint64_t seen = 0;
    for (;;) {
      std::span<const Task> tasks;
      {
        std::unique_lock lk(m_);
        start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        tasks = tasks_;
      }
      size_t i = size_t(w) + 1;
      if (i < tasks.size() && tasks[i].fn) tasks[i].fn(tasks[i].ctx, int(i));
      bool last;
      {
        std::lock_guard lk(m_);
        last = --pending_ == 0;
      }
      if (last) done_cv_.notify_one();
    }
  }

  std::mutex m_;
  std::condition_variable start_cv_, done_cv_;
  std::span<const Task> tasks_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::bench
