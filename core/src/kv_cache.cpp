// Paged KV cache (see kv_cache.h).
//
// Memory: per layer a K and a V Buffer of n_pages planes (the attention backend's). A
// page's plane of one layer holds its page_tokens rows:
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
// Prefix cache: every page is exactly one of free (refcount 0, no key, in free_list_),
// cached (refcount 0, a key, in the LRU list) or in use (refcount > 0, with or without
// a key). Only full pages below a sequence's length are registered, so writes at or
// after `length` never reach a keyed page, except after a truncate into one: then
// `reserved` is clamped to `length`, and reserve() drops the key of a page it is about
// to hand out for writing (refcount 1) or copies it (refcount > 1; the copy has no
// key). take_page() prefers the free list and otherwise evicts the LRU head.
// free_sequence releases a block table from its last page to its first, so a cached
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

KvCache::KvCache(const KvCacheConfig& cfg, const StorageAlloc& alloc) : cfg_(cfg), recurrent_(cfg.recurrent) {
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

  const size_t row_bytes = checked_mul(row_elems(), 2, "row bytes");
  size_t plane = checked_mul(size_t(cfg.page_tokens), row_bytes, "plane bytes");
  if (plane > std::numeric_limits<size_t>::max() - 63) throw Error("KvCache: size overflow computing plane bytes");
  plane_bytes_ = (plane + 63) / 64 * 64;
  const size_t total = checked_mul(plane_bytes_, size_t(cfg.n_pages), "pool bytes");
  if (total > size_t(std::numeric_limits<ptrdiff_t>::max()) / (2 * size_t(cfg.n_layers)))
    throw Error("KvCache: pool of " + std::to_string(cfg.n_pages) + " pages is too large");

  // One buffer per layer and K/V (a backend then needs no offsets into device memory).
  const size_t n_planes = size_t(cfg.n_layers) * (cfg.v_in_k > 0 ? 1 : 2);
  storage_.reserve(n_planes);
  host_.assign(n_planes, nullptr);
  storage_tensors_.resize(size_t(cfg.n_layers) * 2);
  for (size_t i = 0; i < n_planes; ++i) {
    std::unique_ptr<Buffer> b;
    try {
      b = alloc ? alloc(total) : std::make_unique<HostBuffer>(total, BufferUsage::Kv);
    } catch (const std::bad_alloc&) {
      b.reset();
    }
    if (!b || b->size() < total)
      throw Error("KvCache: cannot allocate " + std::to_string(total * n_planes) + " bytes for " +
                  std::to_string(cfg.n_pages) + " pages");
    host_[i] = static_cast<uint8_t*>(b->data());
    if (host_[i] && reinterpret_cast<uintptr_t>(host_[i]) % 64 != 0)
      throw Error("KvCache: storage is not 64-byte aligned");
    Tensor& t = storage_tensors_[cfg.v_in_k > 0 ? i * 2 : i];
    t.type = DType::F16;
    t.ne[0] = int64_t(row_elems());
    t.ne[1] = cfg.page_tokens;
    t.ne[2] = cfg.n_pages;
    t.nb[0] = 2;
    t.nb[1] = row_bytes;
    t.nb[2] = plane_bytes_;
    t.nb[3] = total;
    t.data = host_[i];
    t.buffer = b.get();
    t.name = std::string(i % 2 && cfg.v_in_k == 0 ? "v_cache." : "k_cache.") +
             std::to_string(cfg.v_in_k > 0 ? i : i / 2);
    storage_.push_back(std::move(b));
  }
  if (cfg.v_in_k > 0)
    for (int l = 0; l < cfg.n_layers; ++l) {
      Tensor& v = storage_tensors_[size_t(l) * 2 + 1];
      v = storage_tensors_[size_t(l) * 2];
      v.ne[0] = cfg.v_in_k;
      v.name = "v_cache." + std::to_string(l) + " (view of k_cache." + std::to_string(l) + ")";
    }

  refcount_.assign(size_t(cfg.n_pages), 0);
  page_key_.assign(size_t(cfg.n_pages), 0);
  page_token_ids_.assign(checked_mul(size_t(cfg.n_pages), size_t(cfg.page_tokens), "prefix cache token ids"), 0);
  lru_prev_.assign(size_t(cfg.n_pages), -1);
  lru_next_.assign(size_t(cfg.n_pages), -1);
  free_list_.reserve(size_t(cfg.n_pages));
  // Pop from the back: page 0 is handed out first.
  for (int32_t i = cfg.n_pages - 1; i >= 0; --i) free_list_.push_back(i);
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

void KvCache::read_row(int layer, SeqId seq, int64_t pos, int kv, uint16_t* out) const {
  if (layer < 0 || layer >= cfg_.n_layers || (kv != 0 && kv != 1))
    throw Error("KvCache::read_row: layer " + std::to_string(layer) + " / kv " + std::to_string(kv) + " out of range");
  const int64_t s = slot(seq, pos), pt = cfg_.page_tokens;
  const size_t stride = row_elems() * 2, row_bytes = (kv ? v_row_elems() : row_elems()) * 2;
  storage_[buffer_index(layer, kv)]->get(size_t(s / pt) * plane_bytes_ + size_t(s % pt) * stride, out, row_bytes);
}

void KvCache::write_row(int layer, SeqId seq, int64_t pos, int kv, const uint16_t* in) {
  if (layer < 0 || layer >= cfg_.n_layers || (kv != 0 && kv != 1))
    throw Error("KvCache::write_row: layer " + std::to_string(layer) + " / kv " + std::to_string(kv) + " out of range");
  const int64_t s = slot(seq, pos), pt = cfg_.page_tokens;
  const size_t stride = row_elems() * 2, row_bytes = (kv ? v_row_elems() : row_elems()) * 2;
  storage_[buffer_index(layer, kv)]->set(size_t(s / pt) * plane_bytes_ + size_t(s % pt) * stride, in, row_bytes);
}

int32_t KvCache::slot(SeqId seq, int64_t pos) const {
  const Sequence& s = seq_ref(seq);
  if (pos < 0 || pos >= s.reserved)
    throw Error("KvCache::slot: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                " outside the reserved range [0, " + std::to_string(s.reserved) + ")");
  const int64_t pt = cfg_.page_tokens;
  return int32_t(int64_t(s.table[size_t(pos / pt)]) * pt + pos % pt);
}

int32_t KvCache::take_page() {
  int32_t p;
  if (!free_list_.empty()) {
    p = free_list_.back();
    free_list_.pop_back();
  } else {
    // Callers check free_pages() first; this is a guard, not a code path.
    if (lru_head_ < 0) throw Error("KvCache: out of pages");
    p = lru_head_;
    lru_remove(p);
    key_to_page_.erase(page_key_[size_t(p)]);
    page_key_[size_t(p)] = 0;
  }
  refcount_[size_t(p)] = 1;
  return p;
}

void KvCache::release_page(int32_t page) {
  if (--refcount_[size_t(page)] != 0) return;
  if (page_key_[size_t(page)] != 0)
    lru_push_back(page);
  else
    free_list_.push_back(page);
}

// Drops the key of an in-use page.
void KvCache::unregister(int32_t page) {
  key_to_page_.erase(page_key_[size_t(page)]);
  page_key_[size_t(page)] = 0;
}

void KvCache::lru_push_back(int32_t page) {
  lru_prev_[size_t(page)] = lru_tail_;
  lru_next_[size_t(page)] = -1;
  if (lru_tail_ >= 0)
    lru_next_[size_t(lru_tail_)] = page;
  else
    lru_head_ = page;
  lru_tail_ = page;
  ++cached_count_;
}

void KvCache::lru_remove(int32_t page) {
  const int32_t prev = lru_prev_[size_t(page)], next = lru_next_[size_t(page)];
  (prev >= 0 ? lru_next_[size_t(prev)] : lru_head_) = next;
  (next >= 0 ? lru_prev_[size_t(next)] : lru_tail_) = prev;
  lru_prev_[size_t(page)] = lru_next_[size_t(page)] = -1;
  --cached_count_;
}

void KvCache::check_page(int32_t page, const char* what) const {
  if (page < 0 || page >= cfg_.n_pages)
    throw Error(std::string("KvCache::") + what + ": page " + std::to_string(page) + " outside [0, " +
                std::to_string(cfg_.n_pages) + ")");
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
  const size_t pt = size_t(cfg_.page_tokens);
  const size_t shared = (size_t(n_tokens) + pt - 1) / pt;

  SeqId child = create_sequence();
  Sequence& ch = *seqs_[size_t(child)];
  ch.table.assign(par.table.begin(), par.table.begin() + ptrdiff_t(shared));
  for (int32_t p : ch.table) ++refcount_[size_t(p)];
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
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) release_page(*it);  // tail first, see top
  recurrent_.free(seq);
  seqs_[size_t(seq)].reset();
  rec.done();
}

bool KvCache::reserve(SeqId seq, int64_t n_tokens) {
  Recorder rec(*this, Call::Kind::Reserve, seq, n_tokens);
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0) throw Error("KvCache::reserve: negative position count " + std::to_string(n_tokens));
  const int64_t pt = cfg_.page_tokens;
  const int64_t capacity = int64_t(cfg_.n_pages) * pt;
  if (n_tokens > capacity) return rec.done(false);
  const size_t need_pages = size_t((n_tokens + pt - 1) / pt);
  const size_t have = s.table.size();
  const size_t new_pages = need_pages > have ? need_pages - have : 0;

  // Pages overlapping the positions to be written, [length, n_tokens): shared ones are
  // copied, keyed ones with refcount 1 lose their key.
  size_t first_cow = size_t(s.length / pt);
  size_t end_cow = n_tokens > s.length ? std::min(have, need_pages) : first_cow;
  size_t cow = 0;
  for (size_t i = first_cow; i < end_cow; ++i)
    if (refcount_[size_t(s.table[i])] > 1) ++cow;

  if (new_pages + cow > size_t(free_pages())) return rec.done(false);

  for (size_t i = first_cow; i < end_cow; ++i) {
    int32_t old = s.table[i];
    if (refcount_[size_t(old)] <= 1) {
      if (page_key_[size_t(old)] != 0) unregister(old);
      continue;
    }
    int32_t fresh = take_page();
    for (const auto& b : storage_) b->copy(size_t(fresh) * plane_bytes_, size_t(old) * plane_bytes_, plane_bytes_);
    release_page(old);
    s.table[i] = fresh;
  }
  s.table.reserve(need_pages);
  for (size_t i = 0; i < new_pages; ++i) s.table.push_back(take_page());
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
  if (has_recurrent() && n_tokens == 0) recurrent_.reset(seq);
  const int64_t pt = cfg_.page_tokens;
  const size_t keep = size_t((n_tokens + pt - 1) / pt);
  while (s.table.size() > keep) {
    release_page(s.table.back());
    s.table.pop_back();
  }
  s.length = std::min(s.length, n_tokens);
  s.reserved = std::min(s.reserved, n_tokens);
  // Writing resumes at `length`: if that page is shared, force a reserve() first.
  const size_t cur = size_t(s.length / pt);
  if (cur < s.table.size() && refcount_[size_t(s.table[cur])] > 1) s.reserved = std::min(s.reserved, s.length);
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
    const int64_t pt = cfg_.page_tokens;                                                           \
    return plane(s.table[size_t(pos / pt)], layer, KV) + size_t(pos % pt) * row_elems();           \
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
    const uint16_t* base = plane(s.table[size_t(pos / pt)], layer, kv);
    const int64_t page_end = std::min(end, (pos / pt + 1) * pt);
    for (; pos < page_end; ++pos) *out++ = base + (pos % pt) * stride;
  }
}

const std::vector<int32_t>& KvCache::block_table(SeqId seq) const { return seq_ref(seq).table; }

int KvCache::page_refcount(int32_t page) const {
  check_page(page, "page_refcount");
  return refcount_[size_t(page)];
}

int KvCache::free_pages() const { return int(free_list_.size()) + cached_count_; }

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
  const int32_t page = s.table[page_index];
  if (page_key_[size_t(page)] != 0 || key_to_page_.count(key)) return rec.done(false);
  key_to_page_.emplace(key, page);
  page_key_[size_t(page)] = key;
  std::copy(tokens.begin(), tokens.end(), page_token_ids_.begin() + ptrdiff_t(size_t(page) * pt));
  return rec.done(true);
}

int32_t KvCache::find_cached_page(PageKey key, std::span<const int32_t> tokens) const {
  const size_t pt = size_t(cfg_.page_tokens);
  auto it = key_to_page_.find(key);
  if (it == key_to_page_.end() || tokens.size() != pt) return -1;
  const auto ids = page_token_ids_.begin() + ptrdiff_t(size_t(it->second) * pt);
  return std::equal(tokens.begin(), tokens.end(), ids) ? it->second : -1;
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
    check_page(p, "adopt_pages");
    if (page_key_[size_t(p)] == 0)
      throw Error("KvCache::adopt_pages: page " + std::to_string(p) + " is not registered");
  }
  s.table.reserve(s.table.size() + pages.size());
  for (int32_t p : pages) {
    if (refcount_[size_t(p)]++ == 0) lru_remove(p);
    s.table.push_back(p);
  }
  // length == reserved == table size * page_tokens before (reserved never exceeds the table).
  s.length += int64_t(pages.size()) * pt;
  s.reserved = s.length;
  rec.done();
}

KvCache::PageKey KvCache::page_key(int32_t page) const {
  check_page(page, "page_key");
  return page_key_[size_t(page)];
}

void KvCache::clear_prefix_cache() {
  Recorder rec(*this, Call::Kind::ClearPrefix, -1);
  for (int32_t p = lru_head_; p >= 0; p = lru_next_[size_t(p)]) free_list_.push_back(p);
  std::fill(lru_prev_.begin(), lru_prev_.end(), -1);
  std::fill(lru_next_.begin(), lru_next_.end(), -1);
  lru_head_ = lru_tail_ = -1;
  cached_count_ = 0;
  std::fill(page_key_.begin(), page_key_.end(), PageKey(0));
  key_to_page_.clear();
  rec.done();
}

void KvCache::check_invariants() const {
  auto fail = [](const std::string& what) { throw Error("KvCache::check_invariants: " + what); };
  const size_t n = size_t(cfg_.n_pages);
  const int64_t pt = cfg_.page_tokens;
  std::vector<int64_t> uses(n, 0);
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (!seqs_[id]) continue;
    const Sequence& s = *seqs_[id];
    if (s.length < 0 || s.length > s.reserved || s.reserved > int64_t(s.table.size()) * pt)
      fail("sequence " + std::to_string(id) + " has length " + std::to_string(s.length) + ", reserved " +
           std::to_string(s.reserved) + " and " + std::to_string(s.table.size()) + " pages");
    for (int32_t p : s.table) {
      if (p < 0 || size_t(p) >= n) fail("sequence " + std::to_string(id) + " holds page " + std::to_string(p));
      ++uses[size_t(p)];
    }
  }
  for (size_t p = 0; p < n; ++p)
    if (refcount_[p] != uses[p])
      fail("page " + std::to_string(p) + " has refcount " + std::to_string(refcount_[p]) + " but " +
           std::to_string(uses[p]) + " block-table entries");

  std::vector<int> in_free(n, 0), in_lru(n, 0);
  for (int32_t p : free_list_) {
    if (p < 0 || size_t(p) >= n) fail("free list holds page " + std::to_string(p));
    ++in_free[size_t(p)];
  }
  int count = 0;
  for (int32_t p = lru_head_, prev = -1; p >= 0; prev = p, p = lru_next_[size_t(p)]) {
    if (size_t(p) >= n || count >= cfg_.n_pages) fail("LRU list is corrupt at page " + std::to_string(p));
    if (lru_prev_[size_t(p)] != prev) fail("LRU list has a wrong back link at page " + std::to_string(p));
    if (lru_next_[size_t(p)] < 0 && lru_tail_ != p) fail("LRU list tail is not its last page");
    ++in_lru[size_t(p)];
    ++count;
  }
  if (lru_head_ < 0 && lru_tail_ >= 0) fail("LRU list is empty but has a tail");
  if (count != cached_count_)
    fail("LRU list holds " + std::to_string(count) + " pages, cached count is " + std::to_string(cached_count_));

  size_t keyed = 0;
  for (size_t p = 0; p < n; ++p) {
    const std::string page = "page " + std::to_string(p);
    const bool has_key = page_key_[p] != 0;
    keyed += has_key;
    if (refcount_[p] < 0) fail(page + " has a negative refcount");
    if (refcount_[p] > 0) {
      if (in_free[p] || in_lru[p]) fail(page + " is in use but on the free or LRU list");
    } else if (has_key) {
      if (in_lru[p] != 1 || in_free[p]) fail(page + " is cached but not on the LRU list exactly once");
    } else if (in_free[p] != 1 || in_lru[p]) {
      fail(page + " is free but not on the free list exactly once");
    }
    if (has_key) {
      auto it = key_to_page_.find(page_key_[p]);
      if (it == key_to_page_.end() || it->second != int32_t(p)) fail(page + "'s key maps to another page");
    }
  }
  if (keyed != key_to_page_.size())
    fail("the key map has " + std::to_string(key_to_page_.size()) + " entries for " + std::to_string(keyed) +
         " keyed pages");
}

}  // namespace tessera
