// Paged KV cache (see kv_cache.h).
//
// Memory: per layer a K and a V Buffer of its pool's pages (n_pages, or n_window_pages
// for a sliding-window layer; the attention backend's). A page's plane of one layer
// holds its page_tokens rows:
//   plane(page, layer, kv) = base[layer * 2 + kv] + page * plane_bytes
//   plane_bytes = round_up(page_tokens * row_elems * 2, 64)
// so each plane starts 64-byte aligned; rows inside a plane are packed
// (row stride = row_elems * 2 bytes). Fresh storage is not cleared, and a page taken
// from the free list keeps whatever its last owner wrote: readers must stay below
// length().
//
// Per sequence: a block table (page ids in position order), `length` (positions
// written) and `reserved` (positions [0, reserved) are addressable through
// k_row / v_row). Writers write only positions in [length, reserved): reserve()
// un-shares (copies) every page overlapping [length, n_tokens) whose refcount is
// above 1, so such a write never reaches another sequence. After a fork, or a
// truncate into a shared page, the owner's reserved range is clamped to its length
// when the page holding position `length` is shared: the owner must reserve() again
// (which copies the page) before writing more.
//
// Prefix cache: in each pool every page is exactly one of free, cached or in use
// (page_pool.h). Only full pages below a sequence's length are registered, so writes at or
// after `length` never reach a keyed page, except after a truncate into one: then
// `reserved` is clamped to `length`, and reserve() drops the key of a page it is about
// to hand out for writing (refcount 1) or copies it (refcount > 1; the copy has no
// key). free_sequence releases a block table from its last page to its first, so a cached
// chain is evicted tail first (a tail page is useless once its head is gone).
#include "tessera/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "tessera/error.h"

namespace tessera {

struct KvCache::Sequence {
  std::vector<int32_t> table;
  std::vector<int32_t> wtable;  // the window pool's pages; entries [0, wreleased) are -1
  size_t wreleased = 0;
  int64_t length = 0;
  int64_t reserved = 0;
};

namespace {

size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::string("KvCache: size overflow computing ") + what);
  return r;
}

// The C plugin ABI's view of a KvCache (TesseraKvApi): a failed lookup is NULL / -1,
// never an exception across the boundary.
const KvCache& host(const TesseraKv* kv) { return *static_cast<const KvCache*>(static_cast<const KvAccess*>(kv)); }
KvCache& host_mut(const TesseraKv* kv) { return const_cast<KvCache&>(host(kv)); }

uint16_t* c_row(const TesseraKv* kv, int32_t layer, int32_t seq, int32_t which, int64_t pos) {
  try {
    return which == 0 ? host_mut(kv).k_row(layer, seq, pos) : which == 1 ? host_mut(kv).v_row(layer, seq, pos) : nullptr;
  } catch (...) {
    return nullptr;
  }
}
int32_t c_rows(const TesseraKv* kv, int32_t layer, int32_t seq, int32_t which, int64_t first, int64_t count,
               const uint16_t** out) {
  try {
    host(kv).rows(layer, seq, which, first, count, out);
    return 0;
  } catch (...) {
    return -1;
  }
}
float* c_conv_state(const TesseraKv* kv, int32_t layer, int32_t seq) {
  try {
    return host_mut(kv).conv_state(layer, seq);
  } catch (...) {
    return nullptr;
  }
}
float* c_recurrent_state(const TesseraKv* kv, int32_t layer, int32_t seq) {
  try {
    return host_mut(kv).recurrent_state(layer, seq);
  } catch (...) {
    return nullptr;
  }
}
int32_t c_has_sequence(const TesseraKv* kv, int32_t seq) { return host(kv).has_sequence(seq) ? 1 : 0; }
int64_t c_length(const TesseraKv* kv, int32_t seq) {
  try {
    return host(kv).length(seq);
  } catch (...) {
    return -1;
  }
}
int64_t c_reserved(const TesseraKv* kv, int32_t seq) {
  try {
    return host(kv).reserved(seq);
  } catch (...) {
    return -1;
  }
}
const TesseraKvApi kHostKvApi = {
    sizeof(TesseraKvApi), &c_row, &c_rows, &c_conv_state, &c_recurrent_state, &c_has_sequence, &c_length, &c_reserved,
};

}  // namespace

KvCache::KvCache(const KvCacheConfig& cfg, const StorageAlloc& alloc)
    : cfg_(cfg), recurrent_(cfg.recurrent) {
  api = &kHostKvApi;
  info = {cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.page_tokens, cfg.n_pages};
  recurrent = {cfg.recurrent.n_layers, cfg.recurrent.conv_elems, cfg.recurrent.state_elems};
  auto positive = [](int v, const char* name) {
    if (v <= 0) throw Error(std::string("KvCache: config.") + name + " must be > 0, got " + std::to_string(v));
  };
  positive(cfg.n_layers, "n_layers");
  positive(cfg.n_kv_heads, "n_kv_heads");
  positive(cfg.head_dim, "head_dim");
  positive(cfg.page_tokens, "page_tokens");
  positive(cfg.n_pages, "n_pages");
  if (cfg.v_in_k < 0 || cfg.v_in_k > cfg.head_dim || (cfg.v_in_k > 0 && cfg.n_kv_heads != 1))
    throw Error("KvCache: config.v_in_k = " + std::to_string(cfg.v_in_k) + " needs one KV head and at most head_dim (" +
                std::to_string(cfg.head_dim) + ") values");
  if (cfg.window < 0 || cfg.window_slack < 0)
    throw Error("KvCache: config.window (" + std::to_string(cfg.window) + ") and window_slack (" +
                std::to_string(cfg.window_slack) + ") must be >= 0");
  if (cfg.window > 0) {
    positive(cfg.n_window_pages, "n_window_pages");
    if (cfg.window_layers.size() != size_t(cfg.n_layers))
      throw Error("KvCache: config.window_layers has " + std::to_string(cfg.window_layers.size()) +
                  " flags for " + std::to_string(cfg.n_layers) + " layers");
  }

  const size_t row_bytes = checked_mul(row_elems(), 2, "row bytes");
  size_t plane = checked_mul(size_t(cfg.page_tokens), row_bytes, "plane bytes");
  if (plane > std::numeric_limits<size_t>::max() - 63) throw Error("KvCache: size overflow computing plane bytes");
  plane_bytes_ = (plane + 63) / 64 * 64;
  const size_t largest = size_t(std::max(cfg.n_pages, cfg.window > 0 ? cfg.n_window_pages : 0));
  if (checked_mul(plane_bytes_, largest, "pool bytes") > size_t(std::numeric_limits<ptrdiff_t>::max()) / (2 * size_t(cfg.n_layers)))
    throw Error("KvCache: pool of " + std::to_string(largest) + " pages is too large");

  // One buffer per layer and K/V (a backend then needs no offsets into device memory),
  // of its pool's pages.
  const size_t n_planes = size_t(cfg.n_layers) * (cfg.v_in_k > 0 ? 1 : 2);
  storage_.reserve(n_planes);
  host_.assign(n_planes, nullptr);
  storage_tensors_.resize(size_t(cfg.n_layers) * 2);
  for (size_t i = 0; i < n_planes; ++i) {
    const int layer = int(cfg.v_in_k > 0 ? i : i / 2);
    const int pages = windowed(layer) ? cfg.n_window_pages : cfg.n_pages;
    const size_t total = plane_bytes_ * size_t(pages);
    std::unique_ptr<Buffer> b;
    try {
      b = alloc ? alloc(total) : std::make_unique<HostBuffer>(total, BufferUsage::Kv);
    } catch (const std::bad_alloc&) {
      b.reset();
    }
    if (!b || b->size() < total)
      throw Error("KvCache: cannot allocate " + std::to_string(total) + " bytes for " + std::to_string(pages) +
                  " pages of layer " + std::to_string(layer));
    host_[i] = static_cast<uint8_t*>(b->data());
    if (host_[i] && reinterpret_cast<uintptr_t>(host_[i]) % 64 != 0)
      throw Error("KvCache: storage is not 64-byte aligned");
    Tensor& t = storage_tensors_[cfg.v_in_k > 0 ? i * 2 : i];
    t.type = DType::F16;
    t.ne[0] = int64_t(row_elems());
    t.ne[1] = cfg.page_tokens;
    t.ne[2] = pages;
    t.nb[0] = 2;
    t.nb[1] = row_bytes;
    t.nb[2] = plane_bytes_;
    t.nb[3] = total;
    t.data = host_[i];
    t.buffer = b.get();
    t.name = std::string(i % 2 && cfg.v_in_k == 0 ? "v_cache." : "k_cache.") + std::to_string(layer);
    storage_.push_back(std::move(b));
  }
  if (cfg.v_in_k > 0)
    for (int l = 0; l < cfg.n_layers; ++l) {
      Tensor& v = storage_tensors_[size_t(l) * 2 + 1];
      v = storage_tensors_[size_t(l) * 2];
      v.ne[0] = cfg.v_in_k;
      v.name = "v_cache." + std::to_string(l) + " (view of k_cache." + std::to_string(l) + ")";
    }
  pool_ = PagePool(cfg.n_pages, cfg.page_tokens);
  if (cfg.windowed()) window_pool_ = PagePool(cfg.n_window_pages, cfg.page_tokens);
}

KvCache::~KvCache() = default;

size_t KvCache::bytes_per_token() const {
  return size_t(cfg_.n_layers) * (row_elems() + (cfg_.v_in_k > 0 ? 0 : row_elems())) * 2;
}

uint16_t* KvCache::plane(int32_t page, int layer, int kv) const {
  uint8_t* base = host_[buffer_index(layer, kv)];
  if (!base) throw Error("KvCache: the KV storage is device memory; rows are reached through its backend");
  return reinterpret_cast<uint16_t*>(base + size_t(page) * plane_bytes_);
}

int32_t KvCache::page_at(const Sequence& s, int layer, int64_t pos, const char* what) const {
  const int64_t pt = cfg_.page_tokens;
  if (!windowed(layer)) return s.table[size_t(pos / pt)];
  const int32_t p = s.wtable[size_t(pos / pt)];
  if (p < 0)
    throw Error(std::string("KvCache::") + what + ": position " + std::to_string(pos) + " of layer " +
                std::to_string(layer) + " lies behind its window (" + std::to_string(cfg_.window) +
                " positions); its page was released");
  return p;
}

void KvCache::read_row(int layer, SeqId seq, int64_t pos, int kv, uint16_t* out) const {
  if (layer < 0 || layer >= cfg_.n_layers || (kv != 0 && kv != 1))
    throw Error("KvCache::read_row: layer " + std::to_string(layer) + " / kv " + std::to_string(kv) + " out of range");
  const Sequence& q = seq_ref(seq);
  if (pos < 0 || pos >= q.reserved)
    throw Error("KvCache::read_row: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                " outside the reserved range [0, " + std::to_string(q.reserved) + ")");
  const int64_t pt = cfg_.page_tokens, page = page_at(q, layer, pos, "read_row");
  const size_t stride = row_elems() * 2, row_bytes = (kv ? v_row_elems() : row_elems()) * 2;
  storage_[buffer_index(layer, kv)]->get(size_t(page) * plane_bytes_ + size_t(pos % pt) * stride, out, row_bytes);
}

void KvCache::write_row(int layer, SeqId seq, int64_t pos, int kv, const uint16_t* in) {
  if (layer < 0 || layer >= cfg_.n_layers || (kv != 0 && kv != 1))
    throw Error("KvCache::write_row: layer " + std::to_string(layer) + " / kv " + std::to_string(kv) + " out of range");
  const Sequence& q = seq_ref(seq);
  if (pos < 0 || pos >= q.reserved)
    throw Error("KvCache::write_row: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                " outside the reserved range [0, " + std::to_string(q.reserved) + ")");
  const int64_t pt = cfg_.page_tokens, page = page_at(q, layer, pos, "write_row");
  const size_t stride = row_elems() * 2, row_bytes = (kv ? v_row_elems() : row_elems()) * 2;
  storage_[buffer_index(layer, kv)]->set(size_t(page) * plane_bytes_ + size_t(pos % pt) * stride, in, row_bytes);
}

int32_t KvCache::slot(SeqId seq, int64_t pos) const {
  const Sequence& s = seq_ref(seq);
  if (pos < 0 || pos >= s.reserved)
    throw Error("KvCache::slot: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                " outside the reserved range [0, " + std::to_string(s.reserved) + ")");
  const int64_t pt = cfg_.page_tokens;
  return int32_t(int64_t(s.table[size_t(pos / pt)]) * pt + pos % pt);
}

void KvCache::check_page(const PagePool& pool, int32_t page, const char* what) const {
  if (page < 0 || page >= pool.size())
    throw Error(std::string("KvCache::") + what + ": page " + std::to_string(page) + " outside [0, " +
                std::to_string(pool.size()) + ")");
}

KvCache::Sequence& KvCache::seq_ref(SeqId seq) {
  return const_cast<Sequence&>(static_cast<const KvCache&>(*this).seq_ref(seq));
}

const KvCache::Sequence& KvCache::seq_ref(SeqId seq) const {
  if (seq < 0 || size_t(seq) >= seqs_.size() || !seqs_[size_t(seq)])
    throw Error("KvCache: unknown sequence id " + std::to_string(seq));
  return *seqs_[size_t(seq)];
}

// Appends the outermost public call to the journal when it returns (a call that
// throws is not recorded: it changed nothing a replay could repeat).
class KvCache::Recorder {
 public:
  Recorder(KvCache& kv, Call::Kind kind, SeqId seq, int64_t n = 0) : kv_(kv) {
    ++kv_.call_depth_;
    call_.kind = kind;
    call_.seq = seq;
    call_.n = n;
  }
  ~Recorder() { --kv_.call_depth_; }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  Call& call() { return call_; }
  template <class T>
  T done(T result) {
    call_.result = int64_t(result);
    if (kv_.journal_ && kv_.call_depth_ == 1) kv_.journal_->push_back(std::move(call_));
    return result;
  }
  void done() { done(0); }

 private:
  KvCache& kv_;
  Call call_;
};

void KvCache::replay(const Call& c) {
  int64_t result = 0;
  switch (c.kind) {
    case Call::Kind::Create: result = create_sequence(); break;
    case Call::Kind::Fork: result = fork_sequence(c.seq, c.n); break;
    case Call::Kind::Free: free_sequence(c.seq); break;
    case Call::Kind::Reserve: result = reserve(c.seq, c.n); break;
    case Call::Kind::SetLength: set_length(c.seq, c.n); break;
    case Call::Kind::Truncate: truncate(c.seq, c.n); break;
    case Call::Kind::RegisterPage: result = register_page(c.seq, size_t(c.n), c.key, c.ids); break;
    case Call::Kind::AdoptPages: adopt_pages(c.seq, c.ids); break;
    case Call::Kind::ClearPrefix: clear_prefix_cache(); break;
    default: throw Error("KvCache::replay: unknown call kind " + std::to_string(int(c.kind)));
  }
  if (result != c.result)
    throw Error("KvCache::replay: call " + std::to_string(int(c.kind)) + " on sequence " + std::to_string(c.seq) +
                " returned " + std::to_string(result) + " where it was recorded returning " +
                std::to_string(c.result) + " (the caches have diverged)");
}

bool KvCache::has_sequence(SeqId seq) const {
  return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)] != nullptr;
}

KvCache::SeqId KvCache::create_sequence() {
  Recorder rec(*this, Call::Kind::Create, -1);
  auto s = std::make_unique<Sequence>();
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i]) {
      recurrent_.create(SeqId(i));
      seqs_[i] = std::move(s);
      return rec.done(SeqId(i));
    }
  }
  if (seqs_.size() >= size_t(std::numeric_limits<SeqId>::max())) throw Error("KvCache: too many sequences");
  recurrent_.create(SeqId(seqs_.size()));
  seqs_.push_back(std::move(s));
  return rec.done(SeqId(seqs_.size() - 1));
}

size_t KvCache::first_window_page(int64_t n_tokens) const {
  const int64_t first = n_tokens - cfg_.window + 1;  // the next query's earliest key
  return first > 0 ? size_t(first / cfg_.page_tokens) : 0;
}

bool KvCache::can_truncate(SeqId seq, int64_t n_tokens) const {
  const Sequence& s = seq_ref(seq);
  return !cfg_.windowed() || n_tokens <= 0 || first_window_page(n_tokens) >= s.wreleased;
}

void KvCache::release_window_pages(Sequence& s, size_t end) {
  for (end = std::min(end, s.wtable.size()); s.wreleased < end; ++s.wreleased) {
    window_pool_.release(s.wtable[s.wreleased]);
    s.wtable[s.wreleased] = -1;
  }
}

KvCache::SeqId KvCache::fork_sequence(SeqId parent, int64_t n_tokens) {
  Recorder rec(*this, Call::Kind::Fork, parent, n_tokens);
  Sequence& par = seq_ref(parent);
  if (n_tokens < 0) n_tokens = par.length;
  if (n_tokens > par.length)
    throw Error("KvCache::fork_sequence: cannot share " + std::to_string(n_tokens) + " positions of sequence " +
                std::to_string(parent) + ", which has " + std::to_string(par.length) + " written");
  if (has_recurrent() && n_tokens != par.length)
    throw Error("KvCache::fork_sequence: the model has recurrent layers, whose state exists only at the end of "
                "sequence " + std::to_string(parent) + " (position " + std::to_string(par.length) +
                "); cannot fork at position " + std::to_string(n_tokens));
  if (!can_truncate(parent, n_tokens))
    throw Error("KvCache::fork_sequence: the sliding-window layers of sequence " + std::to_string(parent) +
                " no longer hold the positions before " + std::to_string(n_tokens) + "; cannot fork there");
  const size_t pt = size_t(cfg_.page_tokens);
  const size_t shared = (size_t(n_tokens) + pt - 1) / pt;

  SeqId child = create_sequence();
  Sequence& ch = *seqs_[size_t(child)];
  ch.table.assign(par.table.begin(), par.table.begin() + ptrdiff_t(shared));
  for (int32_t p : ch.table) pool_.retain(p);
  if (cfg_.windowed()) {
    ch.wtable.assign(par.wtable.begin(), par.wtable.begin() + ptrdiff_t(shared));
    ch.wreleased = std::min(par.wreleased, shared);
    for (int32_t p : ch.wtable)
      if (p >= 0) window_pool_.retain(p);
  }
  ch.length = n_tokens;
  ch.reserved = n_tokens;
  recurrent_.copy(parent, child);
  // The parent may no longer write in place into the page holding its next position
  // if that page is now shared: force a reserve() (and with it a copy).
  if (size_t(par.length) < shared * pt) par.reserved = std::min(par.reserved, par.length);
  return rec.done(child);
}

void KvCache::free_sequence(SeqId seq) {
  Recorder rec(*this, Call::Kind::Free, seq);
  Sequence& s = seq_ref(seq);
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) pool_.release(*it);  // tail first, see top
  for (auto it = s.wtable.rbegin(); it != s.wtable.rend(); ++it)
    if (*it >= 0) window_pool_.release(*it);
  recurrent_.free(seq);
  seqs_[size_t(seq)].reset();
  rec.done();
}

void KvCache::copy_page(int32_t to, int32_t from, bool window) {
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (windowed(l) != window) continue;
    for (int kv = 0; kv < (cfg_.v_in_k > 0 ? 1 : 2); ++kv)
      storage_[buffer_index(l, kv)]->copy(size_t(to) * plane_bytes_, size_t(from) * plane_bytes_, plane_bytes_);
  }
}

void KvCache::prepare_writes(std::vector<int32_t>& table, size_t first, size_t end, bool window) {
  PagePool& pool = window ? window_pool_ : pool_;
  for (size_t i = first; i < end; ++i) {
    const int32_t old = table[i];
    if (pool.refcount(old) <= 1) {
      if (pool.key(old) != 0) pool.drop_key(old);
      continue;
    }
    const int32_t fresh = pool.take();
    copy_page(fresh, old, window);
    pool.release(old);
    table[i] = fresh;
  }
}

bool KvCache::reserve(SeqId seq, int64_t n_tokens) {
  Recorder rec(*this, Call::Kind::Reserve, seq, n_tokens);
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0) throw Error("KvCache::reserve: negative position count " + std::to_string(n_tokens));
  const int64_t pt = cfg_.page_tokens;
  const int64_t capacity = int64_t(cfg_.n_pages) * pt;
  if (n_tokens > capacity) return rec.done(false);
  // Window pages no later step reads go first, even if the reservation then fails:
  // they are of no use to anyone but the prefix cache, which keeps them if keyed. A
  // later step's queries start at `length` at the earliest (less window_slack, for a
  // rollback) and see window - 1 positions before it.
  if (cfg_.windowed()) release_window_pages(s, first_window_page(s.length - cfg_.window_slack));
  const size_t need_pages = size_t((n_tokens + pt - 1) / pt);
  const size_t have = s.table.size();
  const size_t new_pages = need_pages > have ? need_pages - have : 0;

  // Pages overlapping the positions to be written, [length, n_tokens): shared ones are
  // copied, keyed ones with refcount 1 lose their key. The window table's are never
  // released (they are at or after the length).
  const size_t first_cow = size_t(s.length / pt);
  const size_t end_cow = n_tokens > s.length ? std::min(have, need_pages) : first_cow;
  size_t cow = 0, wcow = 0;
  for (size_t i = first_cow; i < end_cow; ++i) {
    if (pool_.refcount(s.table[i]) > 1) ++cow;
    if (cfg_.windowed() && window_pool_.refcount(s.wtable[i]) > 1) ++wcow;
  }
  if (new_pages + cow > size_t(pool_.available())) return rec.done(false);
  if (cfg_.windowed() && new_pages + wcow > size_t(window_pool_.available())) return rec.done(false);

  prepare_writes(s.table, first_cow, end_cow, false);
  if (cfg_.windowed()) prepare_writes(s.wtable, first_cow, end_cow, true);
  s.table.reserve(need_pages);
  for (size_t i = 0; i < new_pages; ++i) s.table.push_back(pool_.take());
  if (cfg_.windowed())
    for (size_t i = 0; i < new_pages; ++i) s.wtable.push_back(window_pool_.take());
  s.reserved = std::max(s.reserved, n_tokens);
  return rec.done(true);
}

int64_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }
int64_t KvCache::reserved(SeqId seq) const { return seq_ref(seq).reserved; }

void KvCache::set_length(SeqId seq, int64_t n_tokens) {
  Recorder rec(*this, Call::Kind::SetLength, seq, n_tokens);
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0 || n_tokens > s.reserved)
    throw Error("KvCache::set_length: length " + std::to_string(n_tokens) + " of sequence " + std::to_string(seq) +
                " is outside the reserved range [0, " + std::to_string(s.reserved) + "]");
  s.length = n_tokens;
  rec.done();
}

void KvCache::truncate(SeqId seq, int64_t n_tokens) {
  Recorder rec(*this, Call::Kind::Truncate, seq, n_tokens);
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0) throw Error("KvCache::truncate: negative position count " + std::to_string(n_tokens));
  if (has_recurrent() && n_tokens > 0 && n_tokens < s.length)
    throw Error("KvCache::truncate: the model has recurrent layers, whose state cannot be rewound from position " +
                std::to_string(s.length) + " to " + std::to_string(n_tokens) + " (only to 0)");
  if (!can_truncate(seq, n_tokens))
    throw Error("KvCache::truncate: the sliding-window layers of sequence " + std::to_string(seq) +
                " released the positions before " + std::to_string(int64_t(s.wreleased) * cfg_.page_tokens) +
                ", which a sequence of " + std::to_string(n_tokens) + " positions would read (only 0 or at least " +
                std::to_string(int64_t(s.wreleased) * cfg_.page_tokens + cfg_.window - 1) + " is possible)");
  if (has_recurrent() && n_tokens == 0) recurrent_.reset(seq);
  const int64_t pt = cfg_.page_tokens;
  const size_t keep = size_t((n_tokens + pt - 1) / pt);
  while (s.table.size() > keep) {
    pool_.release(s.table.back());
    s.table.pop_back();
  }
  while (s.wtable.size() > keep) {
    if (s.wtable.back() >= 0) window_pool_.release(s.wtable.back());
    s.wtable.pop_back();
  }
  s.wreleased = std::min(s.wreleased, keep);
  s.length = std::min(s.length, n_tokens);
  s.reserved = std::min(s.reserved, n_tokens);
  // Writing resumes at `length`: if that page is shared, force a reserve() first.
  const size_t cur = size_t(s.length / pt);
  if (cur < s.table.size() &&
      (pool_.refcount(s.table[cur]) > 1 || (cfg_.windowed() && window_pool_.refcount(s.wtable[cur]) > 1)))
    s.reserved = std::min(s.reserved, s.length);
  rec.done();
}

namespace {
[[noreturn]] void bad_row(const char* what, int layer, int n_layers, KvCache::SeqId seq, int64_t pos,
                          int64_t reserved) {
  if (layer < 0 || layer >= n_layers)
    throw Error(std::string("KvCache::") + what + ": layer " + std::to_string(layer) + " outside [0, " +
                std::to_string(n_layers) + ")");
  throw Error(std::string("KvCache::") + what + ": position " + std::to_string(pos) + " of sequence " +
              std::to_string(seq) + " outside the reserved range [0, " + std::to_string(reserved) + ")");
}
}  // namespace

#define TESSERA_KV_ROW(NAME, KV)                                                                    \
  const uint16_t* KvCache::NAME(int layer, SeqId seq, int64_t pos) const {                         \
    const Sequence& s = seq_ref(seq);                                                              \
    if (layer < 0 || layer >= cfg_.n_layers || pos < 0 || pos >= s.reserved)                       \
      bad_row(#NAME, layer, cfg_.n_layers, seq, pos, s.reserved);                                  \
    return plane(page_at(s, layer, pos, #NAME), layer, KV) + size_t(pos % cfg_.page_tokens) * row_elems(); \
  }                                                                                                \
  uint16_t* KvCache::NAME(int layer, SeqId seq, int64_t pos) {                                     \
    return const_cast<uint16_t*>(static_cast<const KvCache&>(*this).NAME(layer, seq, pos));        \
  }

TESSERA_KV_ROW(k_row, 0)
TESSERA_KV_ROW(v_row, 1)
#undef TESSERA_KV_ROW

void KvCache::rows(int layer, SeqId seq, int kv, int64_t first, int64_t count, const uint16_t** out) const {
  const Sequence& s = seq_ref(seq);
  if (kv != 0 && kv != 1) throw Error("KvCache::rows: kv must be 0 (K) or 1 (V), got " + std::to_string(kv));
  if (layer < 0 || layer >= cfg_.n_layers) bad_row("rows", layer, cfg_.n_layers, seq, first, s.reserved);
  if (count < 0) throw Error("KvCache::rows: negative count " + std::to_string(count));
  if (first < 0 || first + count > s.reserved)
    bad_row("rows", layer, cfg_.n_layers, seq, first < 0 ? first : first + count - 1, s.reserved);
  const int64_t pt = cfg_.page_tokens, stride = int64_t(row_elems());
  for (int64_t pos = first, end = first + count; pos < end;) {
    const uint16_t* base = plane(page_at(s, layer, pos, "rows"), layer, kv);
    const int64_t page_end = std::min(end, (pos / pt + 1) * pt);
    for (; pos < page_end; ++pos) *out++ = base + (pos % pt) * stride;
  }
}

const std::vector<int32_t>& KvCache::block_table(SeqId seq) const { return seq_ref(seq).table; }
const std::vector<int32_t>& KvCache::window_block_table(SeqId seq) const { return seq_ref(seq).wtable; }

int KvCache::page_refcount(int32_t page) const {
  check_page(pool_, page, "page_refcount");
  return pool_.refcount(page);
}

int KvCache::window_page_refcount(int32_t page) const {
  check_page(window_pool_, page, "window_page_refcount");
  return window_pool_.refcount(page);
}

bool KvCache::register_page(SeqId seq, size_t page_index, PageKey key, std::span<const int32_t> tokens) {
  Recorder rec(*this, Call::Kind::RegisterPage, seq, int64_t(page_index));
  rec.call().key = key;
  rec.call().ids.assign(tokens.begin(), tokens.end());
  const Sequence& s = seq_ref(seq);
  const size_t pt = size_t(cfg_.page_tokens);
  if (page_index >= s.table.size())
    throw Error("KvCache::register_page: page " + std::to_string(page_index) + " outside the block table of sequence " +
                std::to_string(seq) + " (" + std::to_string(s.table.size()) + " pages)");
  if (tokens.size() != pt)
    throw Error("KvCache::register_page: " + std::to_string(tokens.size()) + " token ids for a page of " +
                std::to_string(pt));
  if (key == 0) throw Error("KvCache::register_page: key 0 is reserved for 'no key'");
  if ((page_index + 1) * pt > size_t(s.length))
    throw Error("KvCache::register_page: page " + std::to_string(page_index) + " of sequence " + std::to_string(seq) +
                " is not full (length " + std::to_string(s.length) + ")");
  // The window layers' page of the same positions, while kept, under the same key (a
  // later prompt with this prefix needs the window's last pages).
  if (cfg_.windowed() && s.wtable[page_index] >= 0) window_pool_.add_key(s.wtable[page_index], key, tokens);
  return rec.done(pool_.add_key(s.table[page_index], key, tokens));
}

int32_t KvCache::find_cached_page(PageKey key, std::span<const int32_t> tokens) const {
  return pool_.find(key, tokens);
}

size_t KvCache::adoptable_pages(SeqId seq, std::span<const int32_t> pages) const {
  const Sequence& s = seq_ref(seq);
  if (!cfg_.windowed()) return pages.size();
  const int64_t pt = cfg_.page_tokens;
  for (size_t m = pages.size(); m > 0; --m) {
    bool ok = true;
    const size_t total = s.table.size() + m;
    for (size_t i = first_window_page(int64_t(total) * pt); i < total && ok; ++i) {
      if (i < s.table.size()) {
        ok = s.wtable[i] >= 0;
      } else {
        const int32_t p = pages[i - s.table.size()];
        ok = p >= 0 && p < pool_.size() && pool_.key(p) != 0 && window_pool_.find(pool_.key(p), pool_.key_tokens(p)) >= 0;
      }
    }
    if (ok) return m;
  }
  return 0;
}

void KvCache::adopt_pages(SeqId seq, std::span<const int32_t> pages) {
  Recorder rec(*this, Call::Kind::AdoptPages, seq);
  rec.call().ids.assign(pages.begin(), pages.end());
  Sequence& s = seq_ref(seq);
  const int64_t pt = cfg_.page_tokens;
  if (s.length != int64_t(s.table.size()) * pt)
    throw Error("KvCache::adopt_pages: sequence " + std::to_string(seq) + " does not end on a page boundary (length " +
                std::to_string(s.length) + ", " + std::to_string(s.table.size()) + " pages)");
  for (int32_t p : pages) {
    check_page(pool_, p, "adopt_pages");
    if (pool_.key(p) == 0)
      throw Error("KvCache::adopt_pages: page " + std::to_string(p) + " is not registered");
  }
  if (adoptable_pages(seq, pages) != pages.size())
    throw Error("KvCache::adopt_pages: the sliding-window layers' pages of the last " +
                std::to_string(cfg_.window) + " positions of this prefix are no longer cached");
  const size_t before = s.table.size(), total = before + pages.size();
  s.table.reserve(total);
  for (int32_t p : pages) {
    pool_.retain(p);
    s.table.push_back(p);
  }
  if (cfg_.windowed()) {
    const size_t first = first_window_page(int64_t(total) * pt);
    for (size_t i = before; i < total; ++i) {
      int32_t w = -1;
      if (i >= first) {
        const int32_t p = pages[i - before];
        w = window_pool_.find(pool_.key(p), pool_.key_tokens(p));
        window_pool_.retain(w);
      }
      s.wtable.push_back(w);
    }
    release_window_pages(s, std::min(first, before));
    s.wreleased = std::max(s.wreleased, first);
  }
  // length == reserved == table size * page_tokens before (reserved never exceeds the table).
  s.length += int64_t(pages.size()) * pt;
  s.reserved = s.length;
  rec.done();
}

KvCache::PageKey KvCache::page_key(int32_t page) const {
  check_page(pool_, page, "page_key");
  return pool_.key(page);
}

void KvCache::clear_prefix_cache() {
  Recorder rec(*this, Call::Kind::ClearPrefix, -1);
  pool_.clear_keys();
  window_pool_.clear_keys();
  rec.done();
}

void KvCache::check_invariants() const {
  auto fail = [](const std::string& what) { throw Error("KvCache::check_invariants: " + what); };
  const int64_t pt = cfg_.page_tokens;
  std::vector<int64_t> uses(size_t(pool_.size()), 0), wuses(size_t(window_pool_.size()), 0);
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (!seqs_[id]) continue;
    const Sequence& s = *seqs_[id];
    const std::string seq = "sequence " + std::to_string(id);
    if (s.length < 0 || s.length > s.reserved || s.reserved > int64_t(s.table.size()) * pt)
      fail(seq + " has length " + std::to_string(s.length) + ", reserved " + std::to_string(s.reserved) + " and " +
           std::to_string(s.table.size()) + " pages");
    for (int32_t p : s.table) {
      if (p < 0 || p >= pool_.size()) fail(seq + " holds page " + std::to_string(p));
      ++uses[size_t(p)];
    }
    if (!cfg_.windowed()) {
      if (!s.wtable.empty()) fail(seq + " has a window table without window layers");
      continue;
    }
    if (s.wtable.size() != s.table.size() || s.wreleased > s.wtable.size())
      fail(seq + " has " + std::to_string(s.wtable.size()) + " window pages (" + std::to_string(s.wreleased) +
           " released) for " + std::to_string(s.table.size()) + " pages");
    for (size_t i = 0; i < s.wtable.size(); ++i) {
      const int32_t p = s.wtable[i];
      if (i < s.wreleased ? p != -1 : (p < 0 || p >= window_pool_.size()))
        fail(seq + " holds window page " + std::to_string(p) + " at " + std::to_string(i) + " (" +
             std::to_string(s.wreleased) + " released)");
      if (p >= 0) ++wuses[size_t(p)];
    }
  }
  pool_.check(uses, "pool");
  window_pool_.check(wuses, "window pool");
}

}  // namespace tessera
