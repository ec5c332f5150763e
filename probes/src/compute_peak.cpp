// Arithmetic peak probe (see compute_peak.h). The kernels carry GCC target attributes
// and run only after peak_kernel_usable() said yes, so this file builds and loads on
// any x86-64 CPU.
#include "tessera/compute_peak.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "probe_stats.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/hwprobe.h"

namespace tessera {
namespace {

constexpr int kAcc = 24;

#if defined(__x86_64__)
// One asm loop per instruction, so the 24 accumulators stay in zmm8-zmm31 (as C++
// arrays the compiler kept them on the stack, and the loads and stores limited the
// rate); every register starts at zero, so no denormal can slow the float loop.
// Returns the operations done: iters x 24 instructions x operations per instruction.
#define TESSERA_PEAK_ZERO                                                                                   \
  "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"                                                                       \
  "vpxord %%zmm1, %%zmm1, %%zmm1\n\t"                                                                       \
  "vpxord %%zmm8, %%zmm8, %%zmm8\n\t vpxord %%zmm9, %%zmm9, %%zmm9\n\t"                                     \
  "vpxord %%zmm10, %%zmm10, %%zmm10\n\t vpxord %%zmm11, %%zmm11, %%zmm11\n\t"                               \
  "vpxord %%zmm12, %%zmm12, %%zmm12\n\t vpxord %%zmm13, %%zmm13, %%zmm13\n\t"                               \
  "vpxord %%zmm14, %%zmm14, %%zmm14\n\t vpxord %%zmm15, %%zmm15, %%zmm15\n\t"                               \
  "vpxord %%zmm16, %%zmm16, %%zmm16\n\t vpxord %%zmm17, %%zmm17, %%zmm17\n\t"                               \
  "vpxord %%zmm18, %%zmm18, %%zmm18\n\t vpxord %%zmm19, %%zmm19, %%zmm19\n\t"                               \
  "vpxord %%zmm20, %%zmm20, %%zmm20\n\t vpxord %%zmm21, %%zmm21, %%zmm21\n\t"                               \
  "vpxord %%zmm22, %%zmm22, %%zmm22\n\t vpxord %%zmm23, %%zmm23, %%zmm23\n\t"                               \
  "vpxord %%zmm24, %%zmm24, %%zmm24\n\t vpxord %%zmm25, %%zmm25, %%zmm25\n\t"                               \
  "vpxord %%zmm26, %%zmm26, %%zmm26\n\t vpxord %%zmm27, %%zmm27, %%zmm27\n\t"                               \
  "vpxord %%zmm28, %%zmm28, %%zmm28\n\t vpxord %%zmm29, %%zmm29, %%zmm29\n\t"                               \
  "vpxord %%zmm30, %%zmm30, %%zmm30\n\t vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
#define TESSERA_PEAK_4(I, A, B, C, D)                                                                       \
  I " %%zmm1, %%zmm0, %%zmm" #A "\n\t" I " %%zmm1, %%zmm0, %%zmm" #B "\n\t" I " %%zmm1, %%zmm0, %%zmm" #C   \
    "\n\t" I " %%zmm1, %%zmm0, %%zmm" #D "\n\t"
#define TESSERA_PEAK_24(I)                                                                                  \
  TESSERA_PEAK_4(I, 8, 9, 10, 11) TESSERA_PEAK_4(I, 12, 13, 14, 15) TESSERA_PEAK_4(I, 16, 17, 18, 19)       \
  TESSERA_PEAK_4(I, 20, 21, 22, 23) TESSERA_PEAK_4(I, 24, 25, 26, 27) TESSERA_PEAK_4(I, 28, 29, 30, 31)
#define TESSERA_PEAK_KERNEL(NAME, TARGET, INSN, OPS_PER_INSN)                                               \
  __attribute__((target(TARGET))) double NAME(long iters) {                                                 \
    long n = iters;                                                                                         \
    asm volatile(TESSERA_PEAK_ZERO "1:\n\t" TESSERA_PEAK_24(INSN) "dec %0\n\tjnz 1b\n\t"                    \
                 : "+r"(n)                                                                                  \
                 :                                                                                          \
                 : "xmm0", "xmm1", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15",    \
                   "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", \
                   "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc");                             \
    return double(iters) * kAcc * (OPS_PER_INSN);                                                           \
  }

TESSERA_PEAK_KERNEL(vnni_ops, "avx512f,avx512vnni", "vpdpbusd", 64 * 2)
TESSERA_PEAK_KERNEL(fma_ops, "avx512f,fma", "vfmadd231ps", 16 * 2)
#endif

using KernelFn = double (*)(long);

KernelFn kernel_fn(PeakKernel k) {
#if defined(__x86_64__)
  return k == PeakKernel::VnniInt8 ? &vnni_ops : &fma_ops;
#else
  (void)k;
  return nullptr;
#endif
}

}  // namespace

std::string_view peak_kernel_name(PeakKernel k) {
  return k == PeakKernel::VnniInt8 ? "int8 vpdpbusd zmm" : "f32 vfmadd231ps zmm";
}

bool peak_kernel_usable(PeakKernel k) {
#if defined(__x86_64__)
  const CpuFeatures& f = cpu_features();
  if (!f.avx512f || !f.os_avx512) return false;
  return k == PeakKernel::VnniInt8 ? f.avx512vnni : f.fma;
#else
  (void)k;
  return false;
#endif
}

PeakResult measure_compute_peak(FastPool& pool, PeakKernel kernel, int reps, double millis) {
  if (!peak_kernel_usable(kernel))
    throw Error("compute peak: " + std::string(peak_kernel_name(kernel)) + " is not usable on this CPU");
  if (reps < 1 || !(millis > 0.0)) throw Error("compute peak: reps must be >= 1 and millis > 0");
  const KernelFn fn = kernel_fn(kernel);
  struct Ctx {
    KernelFn fn;
    long iters;
    double ops[FastPool::kMaxWorkers + 1];
  } ctx{fn, 1000, {}};
  auto timed = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel([](void* p, int i) { auto* c = static_cast<Ctx*>(p); c->ops[i] = c->fn(c->iters); }, &ctx);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double ops = 0;
    for (int i = 0; i < pool.executor_count(); ++i) ops += ctx.ops[i];
    return std::pair{ops, s};
  };
  // Size one run to about `millis`: grow the run until it takes a quarter of that
  // (the first runs also wake sleeping workers), then scale.
  const double target = millis / 1000.0;
  for (int i = 0; i < 40; ++i) {
    const double s = timed().second;
    if (s >= target / 4) {
      ctx.iters = std::max<long>(1000, long(double(ctx.iters) * target / s));
      break;
    }
    ctx.iters *= 2;
  }
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    auto [ops, s] = timed();
    rates.push_back(ops / s / 1e9);
  }
  const detail::Spread sp = detail::spread(rates);
  PeakResult res;
  res.median_gops = sp.median;
  res.min_gops = sp.min;
  res.max_gops = sp.max;
  res.reps = reps;
  res.threads = pool.executor_count();
  res.kernel = kernel;
  return res;
}

}  // namespace tessera
