// ExpertStream against a file of known bytes: resident experts read back exactly the
// file's bytes at the tensor's addresses, the cache never holds more than its limit,
// eviction keeps neighbours intact, and every misuse is a clear error.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/expert_stream.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

struct TempFile {
  fs::path path;
  std::vector<uint8_t> bytes;
  explicit TempFile(size_t n, const fs::path& dir = fs::temp_directory_path()) {
    std::string tmpl = (dir / "tessera-experts-XXXXXX").string();
    const int fd = mkstemp(tmpl.data());
    path = tmpl;
    bytes.resize(n);
    std::mt19937 rng(7);
    for (auto& b : bytes) b = uint8_t(rng());
    EXPECT_EQ(::write(fd, bytes.data(), n), ssize_t(n));
    ::close(fd);
  }
  ~TempFile() { fs::remove(path); }
};

// Three tensors of 8 experts of 5,000 bytes (not a page multiple) per layer, 2 layers,
// at offsets that are not page-aligned either.
constexpr uint64_t kExpert = 5000;
constexpr int64_t kN = 8;
uint64_t tensor_offset(int layer, int t) { return 777 + uint64_t(layer * 3 + t) * (kExpert * kN + 123); }

struct Layers {
  ExpertStream s;
  uint8_t* ptr[2][3];
  Layers(const std::string& path, uint64_t cap) : s(path, cap) {
    for (int l = 0; l < 2; ++l)
      for (int t = 0; t < 3; ++t)
        ptr[l][t] = static_cast<uint8_t*>(
            s.add_tensor("blk." + std::to_string(l) + ".t" + std::to_string(t), l, tensor_offset(l, t), kExpert, kN));
  }
};

void expect_expert(const Layers& st, const TempFile& f, int l, int e) {
  for (int t = 0; t < 3; ++t)
    ASSERT_EQ(std::memcmp(st.ptr[l][t] + e * kExpert, f.bytes.data() + tensor_offset(l, t) + e * kExpert, kExpert), 0)
        << "layer " << l << " tensor " << t << " expert " << e;
}

}  // namespace

TEST(ExpertStream, ResidentExpertsHoldTheFilesBytes) {
  TempFile f(tensor_offset(2, 0) + 4096);
  Layers st(f.path.string(), 64 << 20);
  st.s.finish_setup();
  const std::vector<int32_t> ids{3, 0, 7, 3};
  st.s.ensure(1, ids);
  for (int e : {0, 3, 7}) expect_expert(st, f, 1, e);
  auto s = st.s.stats();
  EXPECT_EQ(s.lookups, 3u);
  EXPECT_EQ(s.hits, 0u);
  st.s.ensure(1, ids);
  s = st.s.stats();
  EXPECT_EQ(s.lookups, 6u);
  EXPECT_EQ(s.hits, 3u);
  EXPECT_GT(s.bytes_read, 3 * 3 * kExpert);
}

TEST(ExpertStream, EvictionStaysWithinTheLimitAndKeepsNeighbours) {
  TempFile f(tensor_offset(2, 0) + 4096);
  uint64_t min_cap;
  {
    Layers probe(f.path.string(), 1ull << 40);
    min_cap = probe.s.min_cache_bytes();
  }
  Layers st(f.path.string(), min_cap);  // exactly one layer's experts
  st.s.finish_setup();
  std::mt19937 rng(3);
  for (int step = 0; step < 200; ++step) {
    const int l = int(rng() % 2);
    std::vector<int32_t> ids{int32_t(rng() % kN), int32_t(rng() % kN)};
    st.s.ensure(l, ids);
    for (int32_t e : ids) expect_expert(st, f, l, e);
    ASSERT_LE(st.s.stats().resident_bytes, min_cap);
  }
  // Every expert of one layer at once fits the minimum.
  std::vector<int32_t> all;
  for (int e = 0; e < kN; ++e) all.push_back(e);
  st.s.ensure(0, all);
  for (int e = 0; e < kN; ++e) expect_expert(st, f, 0, e);
  st.s.ensure(1, all);
  for (int e = 0; e < kN; ++e) expect_expert(st, f, 1, e);
}

TEST(ExpertStream, PrefetchedExpertsCountAsPrefetchHitsAndNeverEvictTheStep) {
  TempFile f(tensor_offset(2, 0) + 4096);
  uint64_t min_cap;
  {
    Layers probe(f.path.string(), 1ull << 40);
    min_cap = probe.s.min_cache_bytes();
  }
  Layers st(f.path.string(), min_cap * 2);
  const std::vector<int32_t> now{0, 1}, next{5, 6};
  st.s.ensure(0, now);
  st.s.prefetch(1, next);
  EXPECT_EQ(st.s.stats().prefetched, 2u);
  st.s.ensure(1, next);
  for (int e : {5, 6}) expect_expert(st, f, 1, e);
  EXPECT_EQ(st.s.stats().prefetch_hits, 2u);
}

// A prefetch on the stream's thread does not hold the stream's lock while its read is
// in flight: stats() and run_async() return while the read is held up, and the next
// ensure() waits for it and finds the experts resident with the file's bytes. A
// failed prefetch read gives its room back and is rethrown by that ensure().
TEST(ExpertStream, PrefetchReadsWithoutHoldingTheLock) {
  TempFile f(tensor_offset(2, 0) + 4096);
  Layers st(f.path.string(), 64 << 20);
  st.s.finish_setup();
  std::promise<void> entered, release;
  std::shared_future<void> go = release.get_future().share();
  bool first = true;
  st.s.set_read_hook([&] {
    if (!std::exchange(first, false)) return;
    entered.set_value();
    go.wait();
  });
  struct Release {  // whatever fails below, the held-up read goes on
    std::promise<void>& p;
    bool done = false;
    void now() {
      if (!std::exchange(done, true)) p.set_value();
    }
    ~Release() { now(); }
  } rel{release};
  const std::vector<int32_t> ahead{1, 2};
  st.s.run_async([ahead](ExpertStream& s) { s.prefetch(0, ahead); });
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto stats = std::async(std::launch::async, [&] { return st.s.stats(); });
  ASSERT_EQ(stats.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "stats() waited for the read";
  const ExpertStreamStats during = stats.get();
  EXPECT_EQ(during.prefetched, 0u);  // not resident yet, but its room is taken
  EXPECT_GT(during.resident_bytes, 0u);
  auto queued = std::async(std::launch::async, [&] { st.s.run_async([](ExpertStream&) {}); });
  ASSERT_EQ(queued.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "run_async() waited for the read";
  rel.now();
  st.s.ensure(0, ahead);
  for (int e : {1, 2}) expect_expert(st, f, 0, e);
  EXPECT_EQ(st.s.stats().prefetched, 2u);
  EXPECT_EQ(st.s.stats().prefetch_hits, 2u);
  st.s.set_read_hook({});

  // A prefetch whose read fails: its room is given back, ensure() rethrows the error.
  const uint64_t before = st.s.stats().resident_bytes;
  fs::resize_file(f.path, tensor_offset(1, 0));  // layer 1 is gone
  const std::vector<int32_t> gone{3};
  st.s.run_async([gone](ExpertStream& s) { s.prefetch(1, gone); });
  EXPECT_THROW(st.s.ensure(0, ahead), Error);
  EXPECT_EQ(st.s.stats().resident_bytes, before);
  EXPECT_EQ(st.s.stats().prefetched, 2u);
}

TEST(ExpertStream, MisuseIsAClearError) {
  TempFile f(tensor_offset(2, 0) + 4096);
  {
    Layers st(f.path.string(), 100000);
    try {
      st.s.finish_setup();
      FAIL() << "a cache below one layer's experts must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is too small: one layer's experts need"), std::string::npos) << e.what();
    }
    const std::vector<int32_t> bad{8};
    EXPECT_THROW(st.s.ensure(0, bad), Error);
  }
  ExpertStream s(f.path.string(), 1 << 20);
  EXPECT_THROW(s.add_tensor("beyond", 0, f.bytes.size() - 100, kExpert, kN), Error);
  EXPECT_THROW(ExpertStream("/nonexistent/file.gguf", 1 << 20), Error);
}

TEST(ExpertStream, AFileTruncatedUnderneathIsAnErrorNamingTheTensor) {
  TempFile f(tensor_offset(2, 0) + 4096);
  Layers st(f.path.string(), 64 << 20);
  fs::resize_file(f.path, tensor_offset(1, 0));  // layer 1 is gone
  const std::vector<int32_t> ids{2};
  try {
    st.s.ensure(1, ids);
    FAIL() << "reading past the truncated end must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.t0 expert 2"), std::string::npos) << e.what();
  }
}

// The fallbacks where O_DIRECT or io_uring are refused, chosen on purpose.
TEST(ExpertStream, TheFallbackReadsGiveTheSameBytes) {
  TempFile f(tensor_offset(2, 0) + 4096);
  for (const char* mode : {"pread", "buffered"}) {
    ::setenv("TESSERA_EXPERT_IO", mode, 1);
    Layers st(f.path.string(), 64 << 20);
    const auto s = st.s.stats();
    EXPECT_FALSE(s.io_uring) << mode;
    // pread keeps O_DIRECT where this filesystem allows it; buffered never uses it.
    const int probe = ::open(f.path.c_str(), O_RDONLY | O_DIRECT);
    if (probe >= 0) ::close(probe);
    EXPECT_EQ(s.direct_io, std::string(mode) == "pread" && probe >= 0) << mode;
    const std::vector<int32_t> ids{1, 6};
    st.s.ensure(0, ids);
    for (int e : {1, 6}) expect_expert(st, f, 0, e);
  }
  ::setenv("TESSERA_EXPERT_IO", "fast", 1);
  EXPECT_THROW(ExpertStream(f.path.string(), 1 << 20), Error);
  ::unsetenv("TESSERA_EXPERT_IO");
}

TEST(ExpertStream, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("4G"), 4ull << 30);
  EXPECT_EQ(parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("2gb"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("123"), 123u);
  for (const char* bad : {"", "G", "4X", "4G!", "-1", "99999999999999999999"}) EXPECT_THROW(parse_byte_size(bad), Error) << bad;
}
