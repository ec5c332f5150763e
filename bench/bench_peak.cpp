// The arithmetic peak that prefill is bounded by, measured on this machine
// (tessera/compute_peak.h): back-to-back independent multiply-accumulates on every
// executor of a FastPool.
//   BM_ComputePeak/vnni_int8/threads:N  vpdpbusd zmm (64 int8 multiply-adds each):
//       the inner instruction of cpu_avx512's quantized products
//   BM_ComputePeak/fma_f32/threads:N    vfmadd231ps zmm (16 float multiply-adds each):
//       the F32/F16/BF16 products
// Counter OP/s counts a multiply-add as 2 operations, like the GFLOP/s that `tessera
// bench` prints for prefill, so the two compare directly. Registered only where the
// CPU and OS support the instruction.
#include <benchmark/benchmark.h>

#include <set>
#include <string>

#include "bench_common.h"
#include "tessera/compute_peak.h"
#include "tessera/fast_pool.h"

namespace tessera::bench {

void register_peak_benchmarks() {
  std::set<int> counts{1, bench_threads()};
  for (auto [k, name] : {std::pair{PeakKernel::VnniInt8, "vnni_int8"}, std::pair{PeakKernel::FmaF32, "fma_f32"}}) {
    if (!peak_kernel_usable(k)) continue;
    for (int n : counts) {
      const std::string bm = std::string("BM_ComputePeak/") + name + "/threads:" + std::to_string(n);
      benchmark::RegisterBenchmark(bm.c_str(),
                                   [k = k, n](benchmark::State& state) {
                                     FastPool pool(n);
                                     PeakResult r;
                                     for (auto _ : state) r = measure_compute_peak(pool, k, 9, 20.0);
                                     state.counters["OP/s"] = r.median_gops * 1e9;
                                     state.counters["OP/s_min"] = r.min_gops * 1e9;
                                     state.counters["OP/s_max"] = r.max_gops * 1e9;
                                   })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace tessera::bench
