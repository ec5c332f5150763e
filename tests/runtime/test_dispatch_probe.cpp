// measure_dispatch: the FastPool barrier probe behind `tessera bench`'s dispatch line.
#include <gtest/gtest.h>

#include "tessera/dispatch_probe.h"
#include "tessera/error.h"

namespace tessera {
namespace {

TEST(DispatchProbe, ReportsAPositiveSpreadPerDispatch) {
  for (int threads : {1, 2}) {
    FastPool pool(threads);
    const DispatchResult r = measure_dispatch(pool, 5, 200);
    EXPECT_EQ(r.executors, threads);
    EXPECT_EQ(r.reps, 5);
    EXPECT_EQ(r.dispatches_per_batch, 200);
    EXPECT_GT(r.min_ns, 0.0);
    EXPECT_LE(r.min_ns, r.median_ns);
    EXPECT_LE(r.median_ns, r.max_ns);
  }
}

TEST(DispatchProbe, LeavesThePoolUsable) {
  FastPool pool(2);
  measure_dispatch(pool, 2, 50);
  int ran[2] = {0, 0};
  pool.parallel([](void* ctx, int i) { static_cast<int*>(ctx)[i] = 1; }, ran);
  EXPECT_EQ(ran[0] + ran[1], 2);
}

TEST(DispatchProbe, RejectsEmptyCounts) {
  FastPool pool(1);
  EXPECT_THROW(measure_dispatch(pool, 0, 10), Error);
  EXPECT_THROW(measure_dispatch(pool, 3, 0), Error);
}

}  // namespace
}  // namespace tessera
