// Arithmetic peak measurement: the physical bound of prefill. A prefill multiplies
// every weight matrix by many tokens at once, so its FLOP/s can never exceed the rate
// at which the CPU retires multiply-accumulates; `tessera bench` divides by this
// number to print prefill's fraction of it, and bench/ reports it per executor count.
//
// The measurement: on every executor of a FastPool, 24 independent accumulators in
// zmm registers take back-to-back multiply-accumulate instructions (enough to hide
// their latency); the median rate over `reps` runs of `millis` ms each is returned.
// A multiply-add counts as 2 operations, as prefill's GFLOP/s count them.
#pragma once
#include <string_view>

namespace tessera {

class FastPool;

enum class PeakKernel {
  VnniInt8,  // vpdpbusd zmm: 64 int8 multiply-adds (the quantized products' instruction)
  FmaF32,    // vfmadd231ps zmm: 16 float multiply-adds (F32 / F16 / BF16 products)
};
std::string_view peak_kernel_name(PeakKernel k);
// True if this CPU and OS can run kernel k (both need AVX-512 state enabled).
bool peak_kernel_usable(PeakKernel k);

struct PeakResult {
  double median_gops = 0, min_gops = 0, max_gops = 0;  // 1e9 operations per second
  int reps = 0;
  int threads = 0;  // executors that ran the kernel
  PeakKernel kernel = PeakKernel::FmaF32;
};

// Throws tessera::Error if the kernel is not usable here or reps/millis are invalid.
PeakResult measure_compute_peak(FastPool& pool, PeakKernel kernel, int reps = 5, double millis = 20.0);

}  // namespace tessera
