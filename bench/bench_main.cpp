// tessera_bench_kernels: Google Benchmark driver. Registers every benchmark at run
// time, records the machine in the context block, and defaults to a short
// --benchmark_min_time so a full run stays sane on a small machine.
#include <benchmark/benchmark.h>

#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "tessera/hwprobe.h"

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) has_min_time = true;
  static char min_time[] = "--benchmark_min_time=0.05";
  if (!has_min_time) args.insert(args.begin() + 1, min_time);
  int n = int(args.size());
  args.push_back(nullptr);

  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;

  const auto& f = tessera::cpu_features();
  benchmark::AddCustomContext("cpu_brand", f.brand);
  benchmark::AddCustomContext("cpu_features", f.summary());
  benchmark::AddCustomContext("bench_threads", std::to_string(tessera::bench::bench_threads()));
  benchmark::AddCustomContext("plugin_dir", TESSERA_PLUGIN_DIR);
  {
    std::ifstream la("/proc/loadavg");
    std::string l1, l5, l15;
    if (la >> l1 >> l5 >> l15) benchmark::AddCustomContext("loadavg", l1 + " " + l5 + " " + l15);
  }
  try {
    tessera::bench::register_pool_benchmarks();
    tessera::bench::register_membw_benchmarks();
    tessera::bench::register_peak_benchmarks();
    tessera::bench::register_matmul_benchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_bench_kernels: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
