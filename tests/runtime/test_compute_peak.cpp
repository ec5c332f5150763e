// The arithmetic-peak probe behind prefill's fraction (tessera/compute_peak.h).
#include <gtest/gtest.h>

#include "tessera/compute_peak.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/hwprobe.h"

using namespace tessera;

TEST(ComputePeak, UsableMatchesTheCpu) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(peak_kernel_usable(PeakKernel::VnniInt8), f.avx512f && f.avx512vnni && f.os_avx512);
  EXPECT_EQ(peak_kernel_usable(PeakKernel::FmaF32), f.avx512f && f.fma && f.os_avx512);
}

// The result describes the pool it ran on, and its statistics are ordered. (How the
// rate scales with executors is a benchmark's question, BM_ComputePeak: under ctest
// -j2 the other vCPU runs another test.)
TEST(ComputePeak, ResultsArePositiveAndOrdered) {
  for (PeakKernel k : {PeakKernel::VnniInt8, PeakKernel::FmaF32}) {
    SCOPED_TRACE(std::string(peak_kernel_name(k)));
    FastPool one(1), two(2);
    if (!peak_kernel_usable(k)) {
      EXPECT_THROW(measure_compute_peak(one, k, 1, 1.0), Error);
      continue;
    }
    const PeakResult a = measure_compute_peak(one, k, 3, 5.0), b = measure_compute_peak(two, k, 3, 5.0);
    EXPECT_EQ(a.threads, 1);
    EXPECT_EQ(b.threads, 2);
    EXPECT_EQ(a.reps, 3);
    EXPECT_GT(a.min_gops, 0.0);
    EXPECT_LE(a.min_gops, a.median_gops);
    EXPECT_LE(a.median_gops, a.max_gops);
    EXPECT_GT(b.min_gops, 0.0);
    EXPECT_EQ(a.kernel, k);
  }
}

TEST(ComputePeak, BadArgumentsAreRefused) {
  FastPool pool(1);
  for (PeakKernel k : {PeakKernel::VnniInt8, PeakKernel::FmaF32}) {
    if (!peak_kernel_usable(k)) continue;
    EXPECT_THROW(measure_compute_peak(pool, k, 0, 5.0), Error);
    EXPECT_THROW(measure_compute_peak(pool, k, 1, 0.0), Error);
  }
}
