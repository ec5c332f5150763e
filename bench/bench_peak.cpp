// The arithmetic peak that prefill is bounded by, measured on this machine: back-to-
// back independent multiply-accumulates on every executor of a FastPool.
//   BM_ComputePeak/vnni_int8/threads:N  vpdpbusd zmm (64 int8 products + sums each):
//       the inner instruction of cpu_avx512's quantized products
//   BM_ComputePeak/fma_f32/threads:N    vfmadd zmm (16 float multiply-adds each):
//       the F32/F16/BF16 products
// Counter OP/s counts a multiply-add as 2 operations, like the GFLOP/s that `tessera
// bench` prints for prefill, so the two compare directly. 24 independent accumulators
// per executor hide the instructions' latency (all values zero, so no denormal can
// slow the float loop); the kernels carry GCC target attributes and are registered
// only where the CPU and OS support them.
#include <benchmark/benchmark.h>

#include <chrono>
#include <set>
#include <string>

#include "bench_common.h"
#include "tessera/fast_pool.h"
#include "tessera/hwprobe.h"

namespace tessera::bench {
namespace {

constexpr int kAcc = 24;

// One asm loop per instruction, so the 24 accumulators stay in zmm8-zmm31 (as C++
// arrays the compiler kept them on the stack, and the loads and stores limited the
// rate); every register starts at zero. Returns the operations one executor did:
// iters x 24 instructions x operations per instruction.
#define TESSERA_PEAK_ZERO \
  "vpxord %%zmm0, %%zmm0, %%zmm0\n\t" "vpxord %%zmm1, %%zmm1, %%zmm1\n\t" "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" \
  "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" "vpxord %%zmm12, %%zmm12, %%zmm12\n\t" "vpxord %%zmm13, %%zmm13, %%zmm13\n\t" \
  "vpxord %%zmm14, %%zmm14, %%zmm14\n\t" "vpxord %%zmm15, %%zmm15, %%zmm15\n\t" "vpxord %%zmm16, %%zmm16, %%zmm16\n\t" "vpxord %%zmm17, %%zmm17, %%zmm17\n\t" \
  "vpxord %%zmm18, %%zmm18, %%zmm18\n\t" "vpxord %%zmm19, %%zmm19, %%zmm19\n\t" "vpxord %%zmm20, %%zmm20, %%zmm20\n\t" "vpxord %%zmm21, %%zmm21, %%zmm21\n\t" \
  "vpxord %%zmm22, %%zmm22, %%zmm22\n\t" "vpxord %%zmm23, %%zmm23, %%zmm23\n\t" "vpxord %%zmm24, %%zmm24, %%zmm24\n\t" "vpxord %%zmm25, %%zmm25, %%zmm25\n\t" \
  "vpxord %%zmm26, %%zmm26, %%zmm26\n\t" "vpxord %%zmm27, %%zmm27, %%zmm27\n\t" "vpxord %%zmm28, %%zmm28, %%zmm28\n\t" "vpxord %%zmm29, %%zmm29, %%zmm29\n\t" \
  "vpxord %%zmm30, %%zmm30, %%zmm30\n\t" "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
#define TESSERA_PEAK_24(I) \
  I " %%zmm1, %%zmm0, %%zmm8\n\t" I " %%zmm1, %%zmm0, %%zmm9\n\t" I " %%zmm1, %%zmm0, %%zmm10\n\t" I " %%zmm1, %%zmm0, %%zmm11\n\t" \
  I " %%zmm1, %%zmm0, %%zmm12\n\t" I " %%zmm1, %%zmm0, %%zmm13\n\t" I " %%zmm1, %%zmm0, %%zmm14\n\t" I " %%zmm1, %%zmm0, %%zmm15\n\t" \
  I " %%zmm1, %%zmm0, %%zmm16\n\t" I " %%zmm1, %%zmm0, %%zmm17\n\t" I " %%zmm1, %%zmm0, %%zmm18\n\t" I " %%zmm1, %%zmm0, %%zmm19\n\t" \
  I " %%zmm1, %%zmm0, %%zmm20\n\t" I " %%zmm1, %%zmm0, %%zmm21\n\t" I " %%zmm1, %%zmm0, %%zmm22\n\t" I " %%zmm1, %%zmm0, %%zmm23\n\t" \
  I " %%zmm1, %%zmm0, %%zmm24\n\t" I " %%zmm1, %%zmm0, %%zmm25\n\t" I " %%zmm1, %%zmm0, %%zmm26\n\t" I " %%zmm1, %%zmm0, %%zmm27\n\t" \
  I " %%zmm1, %%zmm0, %%zmm28\n\t" I " %%zmm1, %%zmm0, %%zmm29\n\t" I " %%zmm1, %%zmm0, %%zmm30\n\t" I " %%zmm1, %%zmm0, %%zmm31\n\t"
#define TESSERA_PEAK_KERNEL(NAME, TARGET, INSN, OPS_PER_INSN)                                            \
  __attribute__((target(TARGET))) double NAME(long iters) {                                               \
    long n = iters;                                                                                        \
    asm volatile(TESSERA_PEAK_ZERO "1:\n\t" TESSERA_PEAK_24(INSN) "dec %0\n\tjnz 1b\n\t"                  \
                 : "+r"(n)                                                                                 \
                 :                                                                                         \
                 : "xmm0", "xmm1", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", \
                   "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc"); \
    return double(iters) * kAcc * (OPS_PER_INSN);                                                          \
  }

TESSERA_PEAK_KERNEL(vnni_ops, "avx512f,avx512vnni", "vpdpbusd", 64 * 2)
TESSERA_PEAK_KERNEL(fma_ops, "avx512f,fma", "vfmadd231ps", 16 * 2)

void bm_peak(benchmark::State& state, double (*kernel)(long), int threads) {
  FastPool pool(threads);
  struct Ctx {
    double (*kernel)(long);
    long iters;
    double ops[FastPool::kMaxWorkers + 1];
  } ctx{kernel, 2000000, {}};
  double ops = 0, secs = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel([](void* p, int i) { auto* c = static_cast<Ctx*>(p); c->ops[i] = c->kernel(c->iters); }, &ctx);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < pool.executorCount(); ++i) ops += ctx.ops[i];
  }
  state.counters["OP/s"] = benchmark::Counter(ops / secs, benchmark::Counter::kDefaults, benchmark::Counter::kIs1000);
}

}  // namespace

void register_peak_benchmarks() {
  const CpuFeatures& f = cpu_features();
  std::set<int> counts{1, bench_threads()};
  struct K {
    const char* name;
    double (*fn)(long);
    bool usable;
  };
  for (const K& k : {K{"vnni_int8", &vnni_ops, f.avx512f && f.avx512vnni && f.os_avx512},
                     K{"fma_f32", &fma_ops, f.avx512f && f.fma && f.os_avx512}}) {
    if (!k.usable) continue;
    for (int n : counts) {
      const std::string name = std::string("BM_ComputePeak/") + k.name + "/threads:" + std::to_string(n);
      benchmark::RegisterBenchmark(name.c_str(), [fn = k.fn, n](benchmark::State& s) { bm_peak(s, fn, n); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace tessera::bench
