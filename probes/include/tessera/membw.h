// Memory bandwidth measurement: the physical bound of decode. A decode step reads
// every weight once per token, so tokens/s can never exceed (measured read GB/s) /
// (weight bytes per token). `tessera bench` divides by this number to print the
// roofline; bench/ compares the read kernels. Which access pattern reads fastest
// depends on the machine (4 prefetched streams per executor on a Zen 5 VM, one plain
// stream on a Zen 4 VM), so by default every pattern is timed and the fastest counts
// (decision 33): a bound below what the products themselves stream would overstate
// how close decode comes to it.
//
// The measurement: a buffer larger than the last-level cache (default 512 MiB) is
// allocated and first touched by the executors that will read it (so pages exist and
// sit near their reader), then every executor of the FastPool streams through its
// contiguous chunk summing 64-bit words; the median GB/s (1e9 bytes/s) over `reps`
// passes is returned. About 1 s for the defaults on a 10 GB/s machine (3 patterns).
#pragma once
#include <cstddef>
#include <span>
#include <string_view>

namespace tessera {

class FastPool;

enum class ReadKernel {
  Auto,    // Avx2, Avx2Nta and Avx2Nta4 in turn, the fastest (Scalar without AVX2)
  Scalar,  // plain uint64 sums (the compiler auto-vectorizes them to SSE2)
  Avx2,    // 256-bit loads (compiled with a target attribute, used after a runtime check)
  Avx512,  // 512-bit loads (same)
  Avx2Nta, // 256-bit loads with a non-temporal prefetch 2 KiB ahead
  Avx2Nta4,  // the same over 4 streams (the quarters of each executor's range) in turn
};
std::string_view read_kernel_name(ReadKernel k);
// True if this CPU and OS can run kernel k (Auto and Scalar always can).
bool read_kernel_usable(ReadKernel k);

struct BandwidthResult {
  double median_gbs = 0, min_gbs = 0, max_gbs = 0;
  size_t bytes = 0;   // bytes read per pass
  int reps = 0;
  int threads = 0;    // executors that read
  ReadKernel kernel = ReadKernel::Scalar;  // the kernel actually used
};

// Memory for data that is streamed from DRAM (repacked weights, the probe's buffer):
// 64-byte aligned, and above 2 MiB 2 MiB-aligned and advised MADV_HUGEPAGE (where
// THP allows it), so the stream spares a page walk every 4 KiB and the hardware
// prefetcher is not stopped at 4 KiB boundaries. The probe uses the same pages as the
// weights it bounds. nullptr when out of memory; release with std::free.
void* alloc_streamed(size_t bytes);

// Multi-threaded streaming read bandwidth; median GB/s over `reps` passes. With Auto,
// `reps` passes of each pattern, alternated pass by pass; the result is the pattern
// with the highest median (`kernel` says which). Throws tessera::Error if the kernel
// is not usable here or bytes/reps are invalid.
BandwidthResult measure_read_bandwidth_ex(FastPool& pool, size_t bytes = size_t(512) << 20, int reps = 5,
                                          ReadKernel kernel = ReadKernel::Auto);

// The same streaming read over memory that already exists (e.g. a model's weights,
// where they lie), split evenly across the executors in the order given; each span
// is read from its first to its last whole 64-byte line. No first touch, one untimed
// pass first. Throws tessera::Error if spans_read_bytes(spans) is under 1 MiB.
BandwidthResult measure_read_bandwidth_spans(FastPool& pool, std::span<const std::span<const std::byte>> spans,
                                             int reps = 3, ReadKernel kernel = ReadKernel::Auto);

// The bytes measure_read_bandwidth_spans reads: every span's whole 64-byte lines.
size_t spans_read_bytes(std::span<const std::span<const std::byte>> spans);

// What read kernel k computes over n_words 64-bit words at p (64-byte aligned): their
// sum, leaving out the words after the kernel's last whole step (64 bytes for Scalar,
// 128 for the AVX2 kernels, 256 for Avx512), so that tests can check each kernel reads
// every word once. Throws if k is not usable here.
uint64_t read_kernel_sum(ReadKernel k, const uint64_t* p, size_t n_words);

// Just the median GB/s of measure_read_bandwidth_ex.
double measure_read_bandwidth(FastPool& pool, size_t bytes = size_t(512) << 20, int reps = 5);

}  // namespace tessera
