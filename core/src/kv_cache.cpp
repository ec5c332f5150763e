// Paged KV cache (see kv_cache.h).
//
// Memory: one 64-byte aligned allocation of n_pages * page_bytes. A page holds, for
// every layer, a K plane then a V plane:
//   plane(page, layer, kv) = base + page * page_bytes + (layer * 2 + kv) * plane_bytes
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

void free_storage(uint8_t* p) { std::free(p); }

size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::string("KvCache: size overflow computing ") + what);
  return r;
}

}  // namespace

KvCache::KvCache(const KvCacheConfig& cfg)
    : cfg_(cfg), storage_(nullptr, free_storage), recurrent_(cfg.recurrent) {
  auto positive = [](int v, const char* name) {
    if (v <= 0) throw Error(std::string("KvCache: config.") + name + " must be > 0, got " + std::to_string(v));
  };
  positive(cfg.n_layers, "n_layers");
  positive(cfg.n_kv_heads, "n_kv_heads");
  positive(cfg.head_dim, "head_dim");
  positive(cfg.page_tokens, "page_tokens");
  positive(cfg.n_pages, "n_pages");

  const size_t row_bytes = checked_mul(row_elems(), 2, "row bytes");
  size_t plane = checked_mul(size_t(cfg.page_tokens), row_bytes, "plane bytes");
  if (plane > std::numeric_limits<size_t>::max() - 63) throw Error("KvCache: size overflow computing plane bytes");
  plane_bytes_ = (plane + 63) / 64 * 64;
  page_bytes_ = checked_mul(plane_bytes_, checked_mul(size_t(cfg.n_layers), 2, "planes per page"), "page bytes");
  const size_t total = checked_mul(page_bytes_, size_t(cfg.n_pages), "pool bytes");
  if (total > size_t(std::numeric_limits<ptrdiff_t>::max()))
    throw Error("KvCache: pool of " + std::to_string(total) + " bytes is too large");

  void* p = std::aligned_alloc(64, total);  // total is a multiple of 64
  if (!p)
    throw Error("KvCache: cannot allocate " + std::to_string(total) + " bytes for " + std::to_string(cfg.n_pages) +
                " pages");
  storage_.reset(static_cast<uint8_t*>(p));

  refcount_.assign(size_t(cfg.n_pages), 0);
  free_list_.reserve(size_t(cfg.n_pages));
  // Pop from the back: page 0 is handed out first.
  for (int32_t i = cfg.n_pages - 1; i >= 0; --i) free_list_.push_back(i);
}

KvCache::~KvCache() = default;

uint16_t* KvCache::plane(int32_t page, int layer, int kv) const {
  return reinterpret_cast<uint16_t*>(storage_.get() + size_t(page) * page_bytes_ +
                                     (size_t(layer) * 2 + size_t(kv)) * plane_bytes_);
}

int32_t KvCache::take_page() {
  // Callers check free_pages() first; this is a guard, not a code path.
  if (free_list_.empty()) throw Error("KvCache: out of pages");
  int32_t p = free_list_.back();
  free_list_.pop_back();
  refcount_[size_t(p)] = 1;
  return p;
}

void KvCache::release_page(int32_t page) {
  if (--refcount_[size_t(page)] == 0) free_list_.push_back(page);
}

KvCache::Sequence& KvCache::seq_ref(SeqId seq) {
  return const_cast<Sequence&>(static_cast<const KvCache&>(*this).seq_ref(seq));
}

const KvCache::Sequence& KvCache::seq_ref(SeqId seq) const {
  if (seq < 0 || size_t(seq) >= seqs_.size() || !seqs_[size_t(seq)])
    throw Error("KvCache: unknown sequence id " + std::to_string(seq));
  return *seqs_[size_t(seq)];
}

bool KvCache::has_sequence(SeqId seq) const {
  return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)] != nullptr;
}

KvCache::SeqId KvCache::create_sequence() {
  auto s = std::make_unique<Sequence>();
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i]) {
      recurrent_.create(SeqId(i));
      seqs_[i] = std::move(s);
      return SeqId(i);
    }
  }
  if (seqs_.size() >= size_t(std::numeric_limits<SeqId>::max())) throw Error("KvCache: too many sequences");
  recurrent_.create(SeqId(seqs_.size()));
  seqs_.push_back(std::move(s));
  return SeqId(seqs_.size() - 1);
}

KvCache::SeqId KvCache::fork_sequence(SeqId parent, int64_t n_tokens) {
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
  return child;
}

void KvCache::free_sequence(SeqId seq) {
  Sequence& s = seq_ref(seq);
  for (int32_t p : s.table) release_page(p);
  recurrent_.free(seq);
  seqs_[size_t(seq)].reset();
}

bool KvCache::reserve(SeqId seq, int64_t n_tokens) {
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0) throw Error("KvCache::reserve: negative position count " + std::to_string(n_tokens));
  const int64_t pt = cfg_.page_tokens;
  const int64_t capacity = int64_t(cfg_.n_pages) * pt;
  if (n_tokens > capacity) return false;
  const size_t need_pages = size_t((n_tokens + pt - 1) / pt);
  const size_t have = s.table.size();
  const size_t new_pages = need_pages > have ? need_pages - have : 0;

  // Shared pages overlapping the positions to be written, [length, n_tokens).
  size_t first_cow = size_t(s.length / pt);
  size_t end_cow = n_tokens > s.length ? std::min(have, need_pages) : first_cow;
  size_t cow = 0;
  for (size_t i = first_cow; i < end_cow; ++i)
    if (refcount_[size_t(s.table[i])] > 1) ++cow;

  if (new_pages + cow > free_list_.size()) return false;

  for (size_t i = first_cow; i < end_cow; ++i) {
    int32_t old = s.table[i];
    if (refcount_[size_t(old)] <= 1) continue;
    int32_t fresh = take_page();
    std::memcpy(plane(fresh, 0, 0), plane(old, 0, 0), page_bytes_);
    release_page(old);
    s.table[i] = fresh;
  }
  s.table.reserve(need_pages);
  for (size_t i = 0; i < new_pages; ++i) s.table.push_back(take_page());
  s.reserved = std::max(s.reserved, n_tokens);
  return true;
}

int64_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }

void KvCache::set_length(SeqId seq, int64_t n_tokens) {
  Sequence& s = seq_ref(seq);
  if (n_tokens < 0 || n_tokens > s.reserved)
    throw Error("KvCache::set_length: length " + std::to_string(n_tokens) + " of sequence " + std::to_string(seq) +
                " is outside the reserved range [0, " + std::to_string(s.reserved) + "]");
  s.length = n_tokens;
}

void KvCache::truncate(SeqId seq, int64_t n_tokens) {
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
  if (page < 0 || page >= cfg_.n_pages)
    throw Error("KvCache::page_refcount: page " + std::to_string(page) + " outside [0, " +
                std::to_string(cfg_.n_pages) + ")");
  return refcount_[size_t(page)];
}

int KvCache::free_pages() const { return int(free_list_.size()); }

}  // namespace tessera
