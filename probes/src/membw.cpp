// Streaming read bandwidth (see membw.h). This file is compiled without ISA flags:
// the AVX2 / AVX-512 kernels carry GCC target attributes and run only after
// cpu_features() says the CPU and OS support them.
#include "tessera/membw.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "probe_stats.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/hwprobe.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

constexpr size_t kAlign = size_t(2) << 20;  // 2 MiB: huge-page aligned where THP is "always"
constexpr size_t kChunkAlign = 4096;        // executor chunks start on page boundaries

// 8 independent accumulators, 64 bytes per step: scalar loads already reach two
// 8-byte loads per cycle, far above DRAM bandwidth per core; the compiler may widen it.
uint64_t sum_scalar(const uint64_t* p, size_t n_words) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (size_t i = 0; i + 8 <= n_words; i += 8) {
    a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
    a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
  }
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#if defined(__x86_64__)
// 256-bit loads, 128 bytes per step. kRequest: also a non-temporal software prefetch
// 2 KiB ahead, the request the decode kernels make (two executors read 3-33% faster
// with it than without in 5 runs of 9 alternations; decision 33).
template <bool kRequest>
__attribute__((target("avx2"))) uint64_t sum_avx2_loop(const uint64_t* p, size_t n_words) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  constexpr size_t kAhead = 2048 / sizeof(__m256i);  // prefetches never fault past the end
  for (size_t i = 0; i + 4 <= n_words / 4; i += 4) {
    if constexpr (kRequest) {
      _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead), _MM_HINT_NTA);
      _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead + 2), _MM_HINT_NTA);
    }
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}
uint64_t sum_avx2(const uint64_t* p, size_t n_words) { return sum_avx2_loop<false>(p, n_words); }
uint64_t sum_avx2_nta(const uint64_t* p, size_t n_words) { return sum_avx2_loop<true>(p, n_words); }

// The same as four streams, one per quarter of the range, a 128-byte step of each in
// turn (as cpu_avx512's decode kernel reads 4 tiles side by side).
__attribute__((target("avx2"))) uint64_t sum_avx2_nta4(const uint64_t* p, size_t n_words) {
  const size_t steps = n_words / 16 / 4;  // 128-byte steps per stream
  const __m256i* v[4];
  __m256i a[4];
  for (int k = 0; k < 4; ++k) v[k] = reinterpret_cast<const __m256i*>(p) + size_t(k) * steps * 4, a[k] = _mm256_setzero_si256();
  constexpr size_t kAhead = 2048 / sizeof(__m256i);
  for (size_t i = 0; i < steps * 4; i += 4)
    for (int k = 0; k < 4; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(v[k] + i + kAhead), _MM_HINT_NTA);
      _mm_prefetch(reinterpret_cast<const char*>(v[k] + i + kAhead + 2), _MM_HINT_NTA);
      a[k] = _mm256_add_epi64(a[k], _mm256_add_epi64(_mm256_load_si256(v[k] + i), _mm256_load_si256(v[k] + i + 1)));
      a[k] = _mm256_add_epi64(a[k], _mm256_add_epi64(_mm256_load_si256(v[k] + i + 2), _mm256_load_si256(v[k] + i + 3)));
    }
  // The words after the 4 streams' whole steps (under 512 bytes).
  const uint64_t tail = sum_avx2_nta(p + steps * 64, n_words - steps * 64);
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3] + tail;
}

__attribute__((target("avx512f"))) uint64_t sum_avx512(const uint64_t* p, size_t n_words) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  const __m512i* v = reinterpret_cast<const __m512i*>(p);
  for (size_t i = 0; i + 4 <= n_words / 8; i += 4) {  // 256 bytes per step
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
  }
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

using SumFn = uint64_t (*)(const uint64_t*, size_t);

SumFn kernel_fn(ReadKernel k) {
  switch (k) {
#if defined(__x86_64__)
    case ReadKernel::Avx2: return sum_avx2;
    case ReadKernel::Avx2Nta: return sum_avx2_nta;
    case ReadKernel::Avx2Nta4: return sum_avx2_nta4;
    case ReadKernel::Avx512: return sum_avx512;
#endif
    default: return sum_scalar;
  }
}

struct FreeAligned {
  size_t bytes;
  void operator()(void* p) const { std::free(p); }
};

struct ReadCtx {
  const unsigned char* base = nullptr;
  size_t pages = 0;  // kChunkAlign units in the buffer
  int parts = 1;
  SumFn fn = sum_scalar;
  bool touch = false;
  alignas(64) uint64_t sink[FastPool::kMaxWorkers + 1][8] = {};  // one cache line per executor
};

void read_task(void* p, int i) {
  auto* c = static_cast<ReadCtx*>(p);
  size_t b = c->pages * size_t(i) / size_t(c->parts) * kChunkAlign;
  size_t e = c->pages * size_t(i + 1) / size_t(c->parts) * kChunkAlign;
  if (b >= e) return;
  if (c->touch) {  // first touch: the page is created by the executor that will read it
    std::memset(const_cast<unsigned char*>(c->base) + b, int(i + 1), e - b);
    return;
  }
  c->sink[i][0] += c->fn(reinterpret_cast<const uint64_t*>(c->base + b), (e - b) / 8);
}

// The kernels to time: Auto -> every usable streaming pattern (the fastest is kept);
// otherwise the one asked for. Throws if that one cannot run here.
std::vector<ReadKernel> kernels_to_time(ReadKernel kernel) {
  if (kernel == ReadKernel::Auto) {
    std::vector<ReadKernel> ks;
    for (ReadKernel k : {ReadKernel::Avx2, ReadKernel::Avx2Nta, ReadKernel::Avx2Nta4})
      if (read_kernel_usable(k)) ks.push_back(k);
    if (ks.empty()) ks.push_back(ReadKernel::Scalar);
    return ks;
  }
  if (!read_kernel_usable(kernel))
    throw Error("measure_read_bandwidth: kernel '" + std::string(read_kernel_name(kernel)) +
                "' is not supported by this CPU/OS");
  return {kernel};
}

// The first and past-the-last address of a span's whole 64-byte lines (the kernels
// use aligned loads); e <= b when it holds none.
std::pair<uintptr_t, uintptr_t> whole_lines(std::span<const std::byte> sp) {
  const auto p = reinterpret_cast<uintptr_t>(sp.data());
  return {(p + 63) & ~uintptr_t(63), (p + sp.size()) & ~uintptr_t(63)};
}

// Existing memory read as one sequence of spans; executor i reads bytes
// [total * i / parts, total * (i + 1) / parts) of it (cut at 64-byte lines).
struct SpanCtx {
  std::vector<const unsigned char*> begin;  // 64-byte aligned
  std::vector<size_t> offset;               // of each span in the sequence; back() = total
  size_t total = 0;
  int parts = 1;
  SumFn fn = sum_scalar;
  alignas(64) uint64_t sink[FastPool::kMaxWorkers + 1][8] = {};
};

void span_task(void* p, int i) {
  auto* c = static_cast<SpanCtx*>(p);
  size_t b = (c->total / 64) * size_t(i) / size_t(c->parts) * 64;
  const size_t e = (c->total / 64) * size_t(i + 1) / size_t(c->parts) * 64;
  size_t k = size_t(std::upper_bound(c->offset.begin(), c->offset.end(), b) - c->offset.begin()) - 1;
  uint64_t sum = 0;
  while (b < e && k + 1 < c->offset.size()) {
    const size_t n = std::min(e, c->offset[k + 1]) - b;
    sum += c->fn(reinterpret_cast<const uint64_t*>(c->begin[k] + (b - c->offset[k])), n / 8);
    b += n;
    ++k;
  }
  c->sink[i][0] += sum;
}

// The executors' sums must be observable, or the compiler could drop the reads.
void keep_sums(const uint64_t (*sink)[8], int parts) {
  volatile uint64_t keep = 0;
  for (int i = 0; i < parts; ++i) keep = keep + sink[i][0];
  (void)keep;
}

// `reps` timed passes of `task` over `bytes` with each of `kernels` (set in ctx.fn), in
// turn pass by pass so that they share the machine's drift; the kernel with the
// highest median, with its median, min and max GB/s.
template <typename Ctx>
BandwidthResult timed_passes(FastPool& pool, void (*task)(void*, int), Ctx& ctx, size_t bytes, int reps,
                             const std::vector<ReadKernel>& kernels) {
  std::vector<std::vector<double>> gbs(kernels.size());
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < kernels.size(); ++k) {
      ctx.fn = kernel_fn(kernels[k]);
      auto t0 = std::chrono::steady_clock::now();
      pool.parallel(task, &ctx);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      gbs[k].push_back(double(bytes) / dt / 1e9);
    }
  BandwidthResult res;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const detail::Spread sp = detail::spread(gbs[k]);
    if (k > 0 && sp.median <= res.median_gbs) continue;
    res.median_gbs = sp.median;
    res.min_gbs = sp.min;
    res.max_gbs = sp.max;
    res.kernel = kernels[k];
  }
  res.bytes = bytes;
  res.reps = reps;
  res.threads = pool.executor_count();
  return res;
}

}  // namespace

uint64_t read_kernel_sum(ReadKernel k, const uint64_t* p, size_t n_words) {
  return kernel_fn(kernels_to_time(k).back())(p, n_words);
}

std::string_view read_kernel_name(ReadKernel k) {
  switch (k) {
    case ReadKernel::Auto: return "auto";
    case ReadKernel::Scalar: return "scalar";
    case ReadKernel::Avx2: return "avx2";
    case ReadKernel::Avx2Nta: return "avx2+nta";
    case ReadKernel::Avx2Nta4: return "avx2+nta x4";
    case ReadKernel::Avx512: return "avx512";
  }
  return "?";
}

bool read_kernel_usable(ReadKernel k) {
  const CpuFeatures& f = cpu_features();
  switch (k) {
    case ReadKernel::Auto:
    case ReadKernel::Scalar: return true;
#if defined(__x86_64__)
    case ReadKernel::Avx2:
    case ReadKernel::Avx2Nta:
    case ReadKernel::Avx2Nta4: return f.avx2 && f.os_avx;
    case ReadKernel::Avx512: return f.avx512f && f.os_avx512;
#endif
    default: return false;
  }
}

void* alloc_streamed(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < kHuge) return std::aligned_alloc(64, (bytes + 63) & ~size_t(63));
  const size_t rounded = (bytes + kHuge - 1) & ~(kHuge - 1);
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  return p;
}

BandwidthResult measure_read_bandwidth_ex(FastPool& pool, size_t bytes, int reps, ReadKernel kernel) {
  if (reps < 1) throw Error("measure_read_bandwidth: reps must be >= 1");
  if (bytes < (size_t(1) << 20)) throw Error("measure_read_bandwidth: buffer must be at least 1 MiB");
  const std::vector<ReadKernel> kernels = kernels_to_time(kernel);

  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  // The same pages as the weights (alloc_streamed): the bound must be the best
  // streaming read, or a decode on huge pages could appear to beat it.
  std::unique_ptr<unsigned char, FreeAligned> buf(static_cast<unsigned char*>(alloc_streamed(bytes)),
                                                  FreeAligned{bytes});
  if (!buf) throw Error("measure_read_bandwidth: cannot allocate " + std::to_string(bytes >> 20) + " MiB");

  auto ctx = std::make_unique<ReadCtx>();
  ctx->base = buf.get();
  ctx->pages = bytes / kChunkAlign;
  ctx->parts = pool.executor_count();
  ctx->fn = kernel_fn(kernels.back());
  ctx->touch = true;
  pool.parallel(read_task, ctx.get());
  ctx->touch = false;
  pool.parallel(read_task, ctx.get());  // warm-up pass (TLB, frequency)

  BandwidthResult res = timed_passes(pool, read_task, *ctx, bytes, reps, kernels);
  keep_sums(ctx->sink, ctx->parts);
  return res;
}

BandwidthResult measure_read_bandwidth_spans(FastPool& pool, std::span<const std::span<const std::byte>> spans,
                                             int reps, ReadKernel kernel) {
  if (reps < 1) throw Error("measure_read_bandwidth: reps must be >= 1");
  const std::vector<ReadKernel> kernels = kernels_to_time(kernel);
  auto ctx = std::make_unique<SpanCtx>();
  for (const auto& sp : spans) {
    const auto [b, e] = whole_lines(sp);
    if (e <= b) continue;
    ctx->begin.push_back(reinterpret_cast<const unsigned char*>(b));
    ctx->offset.push_back(ctx->total);
    ctx->total += e - b;
  }
  if (ctx->total < (size_t(1) << 20)) throw Error("measure_read_bandwidth: less than 1 MiB to read");
  ctx->offset.push_back(ctx->total);
  ctx->parts = pool.executor_count();
  ctx->fn = kernel_fn(kernels.back());
  pool.parallel(span_task, ctx.get());  // untimed pass (TLB, frequency)
  BandwidthResult res = timed_passes(pool, span_task, *ctx, ctx->total, reps, kernels);
  keep_sums(ctx->sink, ctx->parts);
  return res;
}

size_t spans_read_bytes(std::span<const std::span<const std::byte>> spans) {
  size_t n = 0;
  for (const auto& sp : spans) {
    const auto [b, e] = whole_lines(sp);
    if (e > b) n += e - b;
  }
  return n;
}

double measure_read_bandwidth(FastPool& pool, size_t bytes, int reps) {
  return measure_read_bandwidth_ex(pool, bytes, reps, ReadKernel::Auto).median_gbs;
}

}  // namespace tessera
