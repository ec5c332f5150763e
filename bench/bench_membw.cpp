// Streaming read bandwidth per kernel (scalar uint64 sums vs AVX2 vs AVX-512 loads vs
// AVX2 with a non-temporal prefetch ahead)
// and per executor count: shows which kernel reads fastest (Auto should be it),
// and what `tessera bench` divides by for its decode roofline.
//   BM_ReadBandwidth/avx2/threads:2  -> counter GB/s = median of 5 passes over 512 MiB
#include <benchmark/benchmark.h>

#include <set>
#include <string>

#include "bench_common.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/membw.h"

namespace tessera::bench {

void register_membw_benchmarks() {
  std::set<int> counts{1, bench_threads()};
  for (ReadKernel k : {ReadKernel::Scalar, ReadKernel::Avx2, ReadKernel::Avx512, ReadKernel::Avx2Nta, ReadKernel::Avx2Nta4}) {
    if (!read_kernel_usable(k)) continue;
    for (int n : counts) {
      std::string name = "BM_ReadBandwidth/" + std::string(read_kernel_name(k)) + "/threads:" + std::to_string(n);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [k, n](benchmark::State& state) {
                                     FastPool pool(n);
                                     BandwidthResult r;
                                     for (auto _ : state) r = measure_read_bandwidth_ex(pool, size_t(512) << 20, 5, k);
                                     state.counters["GB/s"] = r.median_gbs;
                                     state.counters["GB/s_min"] = r.min_gbs;
                                     state.counters["GB/s_max"] = r.max_gbs;
                                   })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace tessera::bench
