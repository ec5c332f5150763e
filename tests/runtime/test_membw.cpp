// The streaming-read probes behind `tessera bench`'s decode roofline: a fresh buffer
// and memory that already exists (a model's weights where they lie).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <span>
#include <vector>

#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/membw.h"

namespace tessera {
namespace {

// Each read kernel reads every word of its whole steps exactly once (a kernel that
// skipped or re-read lines would report a bandwidth it did not achieve); the 4-stream
// kernel also over lengths that leave a tail after its 4 x 128-byte rounds.
TEST(ReadBandwidth, EveryKernelSumsEveryWordOnce) {
  const size_t max_words = 70000;
  std::vector<uint64_t, std::allocator<uint64_t>> storage(max_words + 8);
  uint64_t* p = storage.data();
  while (reinterpret_cast<uintptr_t>(p) % 64) ++p;
  for (size_t i = 0; i < max_words; ++i) p[i] = i * 0x9E3779B97F4A7C15ull + 12345;
  auto sum = [&](size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; ++i) s += p[i];
    return s;
  };
  for (ReadKernel k : {ReadKernel::Scalar, ReadKernel::Avx2, ReadKernel::Avx512, ReadKernel::Avx2Nta,
                       ReadKernel::Avx2Nta4, ReadKernel::Auto}) {
    if (!read_kernel_usable(k)) continue;
    SCOPED_TRACE(std::string(read_kernel_name(k)));
    for (size_t n : {size_t(0), size_t(64), size_t(128), size_t(4096), size_t(65536)})  // whole 512-byte rounds
      EXPECT_EQ(read_kernel_sum(k, p, n), sum(n)) << n << " words";
  }
  for (ReadKernel k : {ReadKernel::Avx2, ReadKernel::Avx2Nta, ReadKernel::Avx2Nta4}) {
    if (!read_kernel_usable(k)) continue;
    SCOPED_TRACE(std::string(read_kernel_name(k)));
    for (size_t n : {size_t(16), size_t(48), size_t(80), size_t(1000), size_t(69999)})
      EXPECT_EQ(read_kernel_sum(k, p, n), sum(n / 16 * 16)) << n << " words";
  }
}

TEST(ReadBandwidth, SpansAreReadWholeLinesOnly) {
  FastPool pool(2);
  std::vector<std::byte> a((size_t(3) << 20) + 100), b(size_t(1) << 20);
  // Spans that start and end inside a line: only their whole 64-byte lines count.
  std::span<const std::byte> sa(a.data() + 1, a.size() - 1), sb(b.data(), b.size());
  const std::span<const std::byte> spans[] = {sa, sb};
  auto whole = [](std::span<const std::byte> s) {
    const auto p = reinterpret_cast<uintptr_t>(s.data());
    return size_t(((p + s.size()) & ~uintptr_t(63)) - ((p + 63) & ~uintptr_t(63)));
  };
  const BandwidthResult r = measure_read_bandwidth_spans(pool, spans, 2);
  EXPECT_EQ(r.bytes, whole(sa) + whole(sb));
  EXPECT_EQ(spans_read_bytes(spans), r.bytes);
  EXPECT_EQ(r.reps, 2);
  EXPECT_EQ(r.threads, 2);
  EXPECT_GT(r.median_gbs, 0.0);
  EXPECT_LE(r.min_gbs, r.median_gbs);
  EXPECT_GE(r.max_gbs, r.median_gbs);
}

TEST(ReadBandwidth, SpansOfLessThanOneMiBAreRefused) {
  FastPool pool(1);
  std::vector<std::byte> a(size_t(512) << 10);
  const std::span<const std::byte> spans[] = {std::span<const std::byte>(a)};
  EXPECT_THROW(measure_read_bandwidth_spans(pool, spans, 1), Error);
  EXPECT_THROW(measure_read_bandwidth_spans(pool, {}, 1), Error);
  EXPECT_EQ(spans_read_bytes({}), 0u);
  // Less than one whole line: nothing to read.
  const std::span<const std::byte> tiny[] = {std::span<const std::byte>(a.data() + 1, 64)};
  EXPECT_EQ(spans_read_bytes(tiny), 0u);
  std::vector<std::byte> big(size_t(2) << 20);
  const std::span<const std::byte> ok[] = {std::span<const std::byte>(big)};
  EXPECT_THROW(measure_read_bandwidth_spans(pool, ok, 0), Error);
}

// Auto times every streaming pattern and reports the one it kept (the fastest), with
// that pattern's own spread; a kernel asked for is the one used.
TEST(ReadBandwidth, AutoKeepsOneOfThePatternsItTimed) {
  FastPool pool(2);
  const BandwidthResult a = measure_read_bandwidth_ex(pool, size_t(8) << 20, 3, ReadKernel::Auto);
  if (read_kernel_usable(ReadKernel::Avx2))
    EXPECT_TRUE(a.kernel == ReadKernel::Avx2 || a.kernel == ReadKernel::Avx2Nta || a.kernel == ReadKernel::Avx2Nta4)
        << read_kernel_name(a.kernel);
  else
    EXPECT_EQ(a.kernel, ReadKernel::Scalar);
  EXPECT_EQ(a.reps, 3);
  EXPECT_GT(a.median_gbs, 0.0);
  EXPECT_LE(a.min_gbs, a.median_gbs);
  EXPECT_GE(a.max_gbs, a.median_gbs);
  const BandwidthResult s = measure_read_bandwidth_ex(pool, size_t(8) << 20, 2, ReadKernel::Scalar);
  EXPECT_EQ(s.kernel, ReadKernel::Scalar);
  std::vector<std::byte> buf(size_t(4) << 20);
  const std::span<const std::byte> spans[] = {std::span<const std::byte>(buf)};
  const BandwidthResult w = measure_read_bandwidth_spans(pool, spans, 2, ReadKernel::Auto);
  EXPECT_NE(w.kernel, ReadKernel::Auto);
}

// More executors than lines to share: every executor gets a valid (maybe empty) range.
TEST(ReadBandwidth, ManySmallSpansOnManyExecutors) {
  FastPool pool(4);
  std::vector<std::vector<std::byte>> bufs(40, std::vector<std::byte>(size_t(40) << 10));
  std::vector<std::span<const std::byte>> spans;
  for (auto& v : bufs) spans.emplace_back(v.data(), v.size());
  const BandwidthResult r = measure_read_bandwidth_spans(pool, spans, 1);
  EXPECT_GE(r.bytes, size_t(40) * ((size_t(40) << 10) - 64));
  EXPECT_GT(r.median_gbs, 0.0);
}

}  // namespace
}  // namespace tessera
