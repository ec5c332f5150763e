// What one FastPool dispatch of empty tasks costs on this machine, now: the barrier
// under every parallel op. On a VM the host moves the vCPUs: on the one of
// docs/performance.md (sixth session) it went between ~100 ns and ~430-590 ns within
// minutes, and the read bandwidth moved with the placement in some of those minutes,
// so `tessera bench` records it beside each run's roofline.
#pragma once
#include "tessera/fast_pool.h"

namespace tessera {

struct DispatchResult {
  double median_ns = 0, min_ns = 0, max_ns = 0;  // per dispatch, over the batches
  int reps = 0;                 // batches
  int dispatches_per_batch = 0;
  int executors = 0;
};

// Times `batches` batches of `per_batch` back-to-back dispatch_and_run calls of empty
// tasks on every executor of `pool` (after one untimed batch that wakes the workers);
// each batch gives its mean time per dispatch. Throws tessera::Error unless both
// counts are >= 1.
DispatchResult measure_dispatch(FastPool& pool, int batches = 9, int per_batch = 2000);

}  // namespace tessera
