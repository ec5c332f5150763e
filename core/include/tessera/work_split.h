// WorkSplit: hands out the items [0, n) of one FastPool dispatch to its executors.
//
// Each executor owns a contiguous share (executor i starts with the i-th of
// `executors` equal parts) and claims from the front of it a quarter of what is
// left, at least `grain` items (a claim is a locked instruction, which waits for the
// executor's outstanding loads, so claims stay coarse; figures in docs/performance.md).
// An executor whose share is empty takes the back half of the fullest other share
// and goes on claiming from that. So while every executor has work of its own, a
// claim is an atomic on a cache line no other core touches (a shared counter costs a
// cross-core transfer per claim), every executor streams one
// contiguous range, and the executors still finish together when one of them starts
// late or runs slower. Every item is handed out exactly once.
//
// One WorkSplit serves one dispatch: reset() before dispatching, next() from the
// tasks. Items are counted in 32 bits.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "tessera/error.h"
#include "tessera/fast_pool.h"

namespace tessera {

class WorkSplit {
 public:
  static constexpr int kMaxExecutors = FastPool::kMaxWorkers + 1;
  static constexpr int64_t kDivisor = 4;  // a claim takes 1 / kDivisor of the share's rest

  void reset(int64_t n, int executors, int64_t grain) {
    if (n < 0 || n > int64_t(UINT32_MAX) || executors < 1 || executors > kMaxExecutors || grain < 1)
      throw Error("WorkSplit: bad item count, executor count or grain");
    executors_ = executors;
    grain_ = grain;
    for (int i = 0; i < executors; ++i)
      shares_[i].range.store(pack(n * i / executors, n * (i + 1) / executors), std::memory_order_relaxed);
  }

  // The next items [b, e) for executor `index`; false once none are left anywhere.
  bool next(int index, int64_t& b, int64_t& e) {
    std::atomic<uint64_t>& own = shares_[index].range;
    for (;;) {
      uint64_t r = own.load(std::memory_order_relaxed);
      while (begin(r) < end(r)) {
        const int64_t left = end(r) - begin(r), take = std::min(left, std::max(grain_, left / kDivisor));
        if (own.compare_exchange_weak(r, pack(begin(r) + take, end(r)), std::memory_order_relaxed)) {
          b = begin(r);
          e = b + take;
          return true;
        }
      }
      if (!steal_into(index)) return false;
    }
  }

 private:
  static uint64_t pack(int64_t b, int64_t e) { return uint64_t(b) | uint64_t(e) << 32; }
  static int64_t begin(uint64_t r) { return int64_t(r & 0xffffffffu); }
  static int64_t end(uint64_t r) { return int64_t(r >> 32); }

  // Moves the back half of the fullest other share into executor index's (empty)
  // share. No other executor writes an empty share (thieves skip it, and a stale
  // compare-exchange cannot match: a range once handed out never comes back).
  bool steal_into(int index) {
    for (;;) {
      int victim = -1;
      uint64_t vr = 0;
      int64_t most = 0;
      for (int k = 1; k < executors_; ++k) {
        const int i = (index + k) % executors_;
        const uint64_t r = shares_[i].range.load(std::memory_order_relaxed);
        if (end(r) - begin(r) > most) {
          most = end(r) - begin(r);
          victim = i;
          vr = r;
        }
      }
      if (victim < 0) return false;
      const int64_t mid = begin(vr) + most / 2;
      if (shares_[victim].range.compare_exchange_strong(vr, pack(begin(vr), mid), std::memory_order_relaxed)) {
        shares_[index].range.store(pack(mid, end(vr)), std::memory_order_relaxed);
        return true;
      }
    }
  }

  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};  // [begin, end): begin in the low 32 bits
  };
  Share shares_[kMaxExecutors];
  int executors_ = 1;
  int64_t grain_ = 1;
};

}  // namespace tessera
