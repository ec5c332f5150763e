// Shared pieces of tessera_bench_kernels.
#pragma once
#include <cstdlib>
#include <string>

namespace tessera::bench {

// Executors (caller + workers) of the FastPool handed to backends and used by the
// bandwidth benchmark: 2 by default, $TESSERA_BENCH_THREADS overrides.
inline int bench_threads() {
  if (const char* e = std::getenv("TESSERA_BENCH_THREADS")) {
    int n = std::atoi(e);
    if (n >= 1) return n;
  }
  return 2;
}

// Each file registers its benchmarks at run time (so plugin backends are included).
void register_pool_benchmarks();
void register_matmul_benchmarks();
void register_membw_benchmarks();
void register_peak_benchmarks();

}  // namespace tessera::bench
