// Residency of routed experts (expert_stream.h): address-space reservations laid out
// like the file, least-recently-used eviction with never-used prefetches first.
#include "tessera/expert_stream.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "expert_stream/direct_reader.h"
#include "tessera/error.h"

namespace tessera {

namespace {

constexpr uint64_t kPage = detail::DirectReader::kAlign;
uint64_t down(uint64_t v) { return v & ~(kPage - 1); }
uint64_t up(uint64_t v) { return (v + kPage - 1) & ~(kPage - 1); }

std::string mib(uint64_t b) {
  char s[32];
  if (b < (1 << 20)) std::snprintf(s, sizeof s, "%llu bytes", static_cast<unsigned long long>(b));
  else std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1 << 20));
  return s;
}

}  // namespace

struct ExpertStream::Impl {
  struct Slice {
    std::string name;
    uint64_t file_offset = 0;  // expert 0's first byte
    uint64_t bytes = 0;        // per expert
    int64_t n_expert = 0;
    uint8_t* raw = nullptr;    // the reservation (page-aligned)
    size_t raw_len = 0;
    // Address of file byte `off` (raw starts at down(file_offset)).
    uint8_t* at(uint64_t off) const { return raw + (off - down(file_offset)); }
  };
  struct Entry {
    bool resident = false;
    bool loading = false;  // a prefetch is reading it, outside `mu` (room already counted)
    bool unused_prefetch = false;  // read ahead and not used since
    uint64_t last_use = 0;
  };
  // Eviction order: never-used prefetches first, then least recently used.
  using Key = std::tuple<int, uint64_t, int, int>;  // (used ? 1 : 0, last_use, layer, expert)

  detail::DirectReader reader;
  uint64_t cap;
  int64_t held_first = 0, held_end = INT64_MAX;  // hold_only()
  // The I/O thread: jobs run one at a time. `mu` guards the state below; a prefetch
  // releases it while its read is in flight (its experts marked `loading`), so
  // run_async() and stats() never wait for the disk. ensure() waits for the queue to
  // drain and for every loading expert first. `read_mu` serializes the reader.
  std::mutex mu;
  std::mutex read_mu;
  int loading = 0;  // experts being read by a prefetch
  std::function<void()> read_hook;  // set_read_hook()
  std::condition_variable cv;
  std::deque<std::function<void(ExpertStream&)>> jobs;
  bool busy = false, stop = false;
  std::exception_ptr job_error;
  std::thread io;
  std::vector<std::vector<Slice>> layers;
  std::vector<std::vector<Entry>> entries;
  std::set<Key> order;  // resident experts
  uint64_t tick = 0;
  ExpertStreamStats st;

  Impl(const std::string& path, uint64_t cache) : reader(path), cap(cache) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (io.joinable()) io.join();
    for (auto& l : layers)
      for (auto& s : l) ::munmap(s.raw, s.raw_len);
  }

  int64_t n_expert(int layer) const { return layers[size_t(layer)].empty() ? 0 : layers[size_t(layer)][0].n_expert; }

  uint64_t cost(int layer) const {  // bytes one expert of `layer` occupies (widened ranges)
    uint64_t c = 0;
    for (const Slice& s : layers[size_t(layer)]) c += up(s.bytes) + kPage;
    return c;
  }

  Key key(int layer, int e) const {
    const Entry& x = entries[size_t(layer)][size_t(e)];
    return {x.unused_prefetch ? 0 : 1, x.last_use, layer, e};
  }

  // Hands back the pages of expert e of `layer` (only those wholly inside its
  // slices: a page shared with a neighbour stays).
  void release_pages(int layer, int e) {
    for (const Slice& s : layers[size_t(layer)]) {
      const uint64_t a = s.file_offset + uint64_t(e) * s.bytes, b = a + s.bytes;
      if (up(a) < down(b)) ::madvise(s.at(up(a)), down(b) - up(a), MADV_DONTNEED);
    }
  }

  void evict(int layer, int e) {
    Entry& x = entries[size_t(layer)][size_t(e)];
    order.erase(key(layer, e));
    release_pages(layer, e);
    x.resident = false;
    x.unused_prefetch = false;
    st.resident_bytes -= cost(layer);
  }

  // Frees room for `need` bytes, evicting only experts not in `keep` of `layer` and,
  // when `only_older` is set, only experts not used in the current step.
  bool make_room(uint64_t need, int layer, const std::vector<char>& keep, bool only_older) {
    auto it = order.begin();
    while (st.resident_bytes + need > cap && it != order.end()) {
      const auto [used, last, l, e] = *it;
      ++it;
      if (only_older && last >= tick) return false;
      if (l == layer && keep[size_t(e)]) continue;
      evict(l, e);
    }
    return st.resident_bytes + need <= cap;
  }

  // The widened byte ranges of experts `missing` of `layer` (counted as read).
  std::vector<detail::DirectReader::Request> requests(int layer, const std::vector<int>& missing) {
    std::vector<detail::DirectReader::Request> reqs;
    for (int e : missing)
      for (const Slice& s : layers[size_t(layer)]) {
        const uint64_t a = s.file_offset + uint64_t(e) * s.bytes;
        const uint64_t a0 = down(a), a1 = up(a + s.bytes);
        reqs.push_back({a0, a1 - a0, s.at(a0), s.name + " expert " + std::to_string(e)});
        st.bytes_read += a1 - a0;
      }
    return reqs;
  }
  // Seconds the reads took (the caller adds them to st.read_seconds under `mu`).
  double read_requests(std::span<const detail::DirectReader::Request> reqs) {
    if (read_hook) read_hook();
    std::lock_guard<std::mutex> lk(read_mu);
    const auto t0 = std::chrono::steady_clock::now();
    reader.read_all(reqs);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void read(int layer, const std::vector<int>& missing) {  // under `mu`
    const auto reqs = requests(layer, missing);
    st.read_seconds += read_requests(reqs);
  }

  void touch(int layer, int e, bool prefetch) {
    Entry& x = entries[size_t(layer)][size_t(e)];
    if (x.resident) order.erase(key(layer, e));
    x.resident = true;
    x.last_use = tick;
    x.unused_prefetch = prefetch;
    order.insert(key(layer, e));
  }

  std::vector<char> wanted(int layer, std::span<const int32_t> ids) const {
    const int64_t n = n_expert(layer);
    std::vector<char> w(size_t(n), 0);
    for (int32_t id : ids) {
      if (id < 0 || id >= n)
        throw Error("expert id " + std::to_string(id) + " out of range [0, " + std::to_string(n) + ") in layer " +
                    std::to_string(layer));
      if (id >= held_first && id < held_end) w[size_t(id)] = 1;
    }
    return w;
  }
};

ExpertStream::ExpertStream(const std::string& path, uint64_t cache_bytes)
    : impl_(std::make_unique<Impl>(path, cache_bytes)) {
  impl_->st.cache_bytes = cache_bytes;
  impl_->st.direct_io = impl_->reader.direct();
  impl_->st.io_uring = impl_->reader.uring();
}

void ExpertStream::run_async(std::function<void(ExpertStream&)> job) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  if (!m.io.joinable())
    m.io = std::thread([this] {
      Impl& mm = *impl_;
      std::unique_lock<std::mutex> lk2(mm.mu);
      for (;;) {
        mm.cv.wait(lk2, [&] { return mm.stop || !mm.jobs.empty(); });
        if (mm.stop) return;
        auto j = std::move(mm.jobs.front());
        mm.jobs.pop_front();
        mm.busy = true;
        lk2.unlock();  // the job takes mu itself (through prefetch())
        std::exception_ptr err;
        try {
          j(*this);
        } catch (...) {
          err = std::current_exception();
        }
        lk2.lock();
        if (err && !mm.job_error) mm.job_error = err;
        mm.busy = false;
        mm.cv.notify_all();
      }
    });
  m.jobs.push_back(std::move(job));
  m.cv.notify_all();
}

ExpertStream::~ExpertStream() = default;

void* ExpertStream::add_tensor(const std::string& name, int layer, uint64_t file_offset, uint64_t expert_bytes,
                               int64_t n_expert) {
  Impl& m = *impl_;
  if (layer < 0 || n_expert <= 0 || expert_bytes == 0) throw Error("expert stream: bad tensor " + name);
  const uint64_t total = expert_bytes * uint64_t(n_expert);
  if (total / uint64_t(n_expert) != expert_bytes || file_offset > m.reader.file_size() ||
      total > m.reader.file_size() - file_offset)
    throw Error(m.reader.path() + ": tensor " + name + " lies outside the file");
  if (size_t(layer) >= m.layers.size()) {
    m.layers.resize(size_t(layer) + 1);
    m.entries.resize(size_t(layer) + 1);
  }
  auto& slices = m.layers[size_t(layer)];
  if (!slices.empty() && slices[0].n_expert != n_expert)
    throw Error("expert stream: " + name + " has " + std::to_string(n_expert) + " experts, " + slices[0].name +
                " " + std::to_string(slices[0].n_expert));
  Impl::Slice s;
  s.name = name;
  s.file_offset = file_offset;
  s.bytes = expert_bytes;
  s.n_expert = n_expert;
  s.raw_len = size_t(up(file_offset + total) - down(file_offset) + kPage);
  void* p = ::mmap(nullptr, s.raw_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw Error("expert stream: cannot reserve " + mib(s.raw_len) + " of address space for " + name);
  s.raw = static_cast<uint8_t*>(p);
  slices.push_back(s);
  m.entries[size_t(layer)].assign(size_t(n_expert), Impl::Entry{});
  return s.at(file_offset);
}

uint64_t ExpertStream::min_cache_bytes() const {
  uint64_t most = 0;
  for (size_t l = 0; l < impl_->layers.size(); ++l) {
    const int64_t n = impl_->n_expert(int(l));
    const int64_t held = std::max<int64_t>(0, std::min(n, impl_->held_end) - std::max<int64_t>(0, impl_->held_first));
    most = std::max(most, impl_->cost(int(l)) * uint64_t(held));
  }
  return most;
}

void ExpertStream::hold_only(int64_t first, int64_t end) {
  if (first < 0 || end <= first) throw Error("expert stream: bad range of held experts");
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->held_first = first;
  impl_->held_end = end;
}

void ExpertStream::set_cache_bytes(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->st.resident_bytes > 0) throw Error("expert stream: the cache size is fixed once experts are resident");
  impl_->cap = bytes;
  impl_->st.cache_bytes = bytes;
}

void ExpertStream::finish_setup() {
  const uint64_t need = min_cache_bytes();
  if (impl_->cap < need)
    throw Error("expert cache of " + mib(impl_->cap) + " is too small: one layer's experts need " + mib(need) +
                " (a batch may route to all of them); use --expert-cache " +
                std::to_string((need + (1 << 20) - 1) >> 20) + "M or more");
}

void ExpertStream::ensure(int layer, std::span<const int32_t> ids) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(m.mu);
  struct Stall {  // the whole call, waiting for earlier jobs included
    Impl& m;
    std::chrono::steady_clock::time_point t0;
    ~Stall() { m.st.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } stall{m, t0};
  // Jobs queued before this call, and reads of prefetches called outside a job.
  m.cv.wait(lk, [&] { return m.jobs.empty() && !m.busy && m.loading == 0; });
  if (m.job_error) std::rethrow_exception(std::exchange(m.job_error, nullptr));
  if (layer < 0 || size_t(layer) >= m.layers.size() || m.layers[size_t(layer)].empty())
    throw Error("expert stream: layer " + std::to_string(layer) + " has no streamed experts");
  ++m.tick;
  const std::vector<char> want = m.wanted(layer, ids);
  std::vector<int> missing;
  for (size_t e = 0; e < want.size(); ++e) {
    if (!want[e]) continue;
    ++m.st.lookups;
    Impl::Entry& x = m.entries[size_t(layer)][e];
    if (x.resident) {
      ++m.st.hits;
      if (x.unused_prefetch) ++m.st.prefetch_hits;
      m.touch(layer, int(e), false);
    } else {
      missing.push_back(int(e));
    }
  }
  if (missing.empty()) return;
  const uint64_t need = m.cost(layer) * missing.size();
  if (!m.make_room(need, layer, want, false))
    throw Error("expert cache of " + mib(m.cap) + " cannot hold layer " + std::to_string(layer) + "'s " +
                std::to_string(missing.size()) + " missing experts");
  m.read(layer, missing);
  for (int e : missing) {
    m.touch(layer, e, false);
    m.st.resident_bytes += m.cost(layer);
  }
}

void ExpertStream::prefetch(int layer, std::span<const int32_t> ids) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  if (layer < 0 || size_t(layer) >= m.layers.size() || m.layers[size_t(layer)].empty()) return;
  const std::vector<char> want = m.wanted(layer, ids);
  std::vector<int> missing;
  for (size_t e = 0; e < want.size(); ++e) {
    const Impl::Entry& x = m.entries[size_t(layer)][e];
    if (want[e] && !x.resident && !x.loading) missing.push_back(int(e));
  }
  // Never evict what this step used: read only as many as fit without that.
  while (!missing.empty() && !m.make_room(m.cost(layer) * missing.size(), layer, want, true)) missing.pop_back();
  if (missing.empty()) return;
  // Room is taken now; the experts join the eviction order once read, so nothing
  // evicts them while the read is in flight.
  for (int e : missing) {
    m.entries[size_t(layer)][size_t(e)].loading = true;
    m.st.resident_bytes += m.cost(layer);
  }
  m.loading += int(missing.size());
  const auto reqs = m.requests(layer, missing);
  lk.unlock();
  std::exception_ptr err;
  double seconds = 0;
  try {
    seconds = m.read_requests(reqs);
  } catch (...) {
    err = std::current_exception();
  }
  lk.lock();
  m.st.read_seconds += seconds;
  for (int e : missing) {
    m.entries[size_t(layer)][size_t(e)].loading = false;
    if (err) {
      m.release_pages(layer, e);
      m.st.resident_bytes -= m.cost(layer);
    } else {
      m.touch(layer, e, true);
      ++m.st.prefetched;
    }
  }
  m.loading -= int(missing.size());
  m.cv.notify_all();
  if (err) std::rethrow_exception(err);
}

void ExpertStream::set_read_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->read_hook = std::move(hook);
}

int ExpertStream::layer_of(const void* data) const {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t l = 0; l < impl_->layers.size(); ++l)
    for (const auto& s : impl_->layers[l])
      if (p >= s.raw && p < s.raw + s.raw_len) return int(l);
  return -1;
}

ExpertStreamStats ExpertStream::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st;
}

uint64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const uint64_t d = uint64_t(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) throw Error("size '" + text + "' is too large");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) throw Error("size '" + text + "' must start with a number (e.g. 4G, 512M)");
  uint64_t mult = 1;
  if (i < text.size()) {
    const char u = char(std::toupper(static_cast<unsigned char>(text[i])));
    mult = u == 'K' ? 1ull << 10 : u == 'M' ? 1ull << 20 : u == 'G' ? 1ull << 30 : u == 'T' ? 1ull << 40 : 0;
    if (!mult) throw Error("size '" + text + "': unknown unit (K, M, G or T)");
    ++i;
    if (i < text.size() && (text[i] == 'i' || text[i] == 'I')) ++i;  // 4GiB
    if (i < text.size() && (text[i] == 'b' || text[i] == 'B')) ++i;  // 4GB
    if (i != text.size()) throw Error("size '" + text + "': unexpected text after the unit");
  }
  if (v > UINT64_MAX / mult) throw Error("size '" + text + "' is too large");
  return v * mult;
}

}  // namespace tessera
