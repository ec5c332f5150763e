// The KV cache's sliding-window pool: pages behind every window are released, what a
// window reads is kept, forks, truncation, the prefix cache and replay work with both
// pools.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/kv_cache.h"

using tessera::KvCache;
using tessera::KvCacheConfig;

namespace {

constexpr int kWindow = 6, kPage = 4;

// Layers 0 and 2 attend to a window of 6 positions, layer 1 to everything.
KvCacheConfig window_config(int n_pages = 16, int n_window_pages = 6, int slack = 0) {
  KvCacheConfig c;
  c.n_layers = 3;
  c.n_kv_heads = 1;
  c.head_dim = 3;
  c.page_tokens = kPage;
  c.n_pages = n_pages;
  c.window = kWindow;
  c.window_layers = {1, 0, 1};
  c.n_window_pages = n_window_pages;
  c.window_slack = slack;
  return c;
}

uint16_t value(int layer, int kv, int64_t pos, size_t e, int tag) {
  return uint16_t((tag * 7919 + layer * 1000 + kv * 500 + pos * 13 + int64_t(e)) & 0xffff);
}

// Positions [from, to) of every layer, as a step would write them.
void write(KvCache& kv, KvCache::SeqId s, int64_t from, int64_t to, int tag) {
  for (int64_t p = from; p < to; ++p)
    for (int l = 0; l < kv.config().n_layers; ++l)
      for (int which = 0; which < 2; ++which) {
        uint16_t* r = which ? kv.v_row(l, s, p) : kv.k_row(l, s, p);
        for (size_t e = 0; e < kv.row_elems(); ++e) r[e] = value(l, which, p, e, tag);
      }
}

// A step: reserve, write, set the length.
bool step(KvCache& kv, KvCache::SeqId s, int64_t n, int tag) {
  const int64_t len = kv.length(s);
  if (!kv.reserve(s, len + n)) return false;
  write(kv, s, len, len + n, tag);
  kv.set_length(s, len + n);
  return true;
}

// What the next step of a sequence may read: every position of a full layer, the last
// window - 1 of a window layer (and the rows must hold what was written there).
void check_readable(const KvCache& kv, KvCache::SeqId s, const std::vector<int>& tags) {
  const int64_t len = kv.length(s);
  ASSERT_EQ(int64_t(tags.size()), len);
  for (int l = 0; l < kv.config().n_layers; ++l) {
    const int64_t first = kv.windowed(l) ? std::max<int64_t>(0, len - kWindow + 1) : 0;
    for (int64_t p = first; p < len; ++p)
      for (int which = 0; which < 2; ++which) {
        const uint16_t* r = which ? kv.v_row(l, s, p) : kv.k_row(l, s, p);
        for (size_t e = 0; e < kv.row_elems(); ++e)
          ASSERT_EQ(r[e], value(l, which, p, e, tags[size_t(p)])) << "seq " << s << " layer " << l << " pos " << p;
      }
  }
}

int window_pages_held(const KvCache& kv, KvCache::SeqId s) {
  const auto& t = kv.window_block_table(s);
  return int(std::count_if(t.begin(), t.end(), [](int32_t p) { return p >= 0; }));
}

}  // namespace

TEST(KvCacheWindow, ConfigValidation) {
  KvCacheConfig c = window_config();
  c.window_layers = {1, 0};
  EXPECT_THROW(KvCache{c}, tessera::Error);
  c = window_config();
  c.n_window_pages = 0;
  EXPECT_THROW(KvCache{c}, tessera::Error);
  c = window_config();
  c.window_slack = -1;
  EXPECT_THROW(KvCache{c}, tessera::Error);
  KvCache kv(window_config(16, 6));
  EXPECT_TRUE(kv.windowed(0));
  EXPECT_FALSE(kv.windowed(1));
  EXPECT_EQ(kv.k_storage(0).ne[2], 6);  // the window pool's pages
  EXPECT_EQ(kv.k_storage(1).ne[2], 16);
  EXPECT_EQ(kv.window_free_pages(), 6);
}

// A long sequence holds a bounded number of window pages, and keeps what it reads.
TEST(KvCacheWindow, PagesBehindTheWindowAreReleased) {
  KvCache kv(window_config(16, 3));  // 3 window pages: 12 positions, the context is 64
  const KvCache::SeqId s = kv.create_sequence();
  std::vector<int> tags;
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(step(kv, s, 1, i)) << "step " << i;
    tags.push_back(i);
    kv.check_invariants();
    check_readable(kv, s, tags);
    // The window (6 positions) and the page being written span at most 3 pages.
    EXPECT_LE(window_pages_held(kv, s), 3);
  }
  EXPECT_EQ(kv.block_table(s).size(), 15u);  // full layers keep every page
  const auto& wt = kv.window_block_table(s);
  ASSERT_EQ(wt.size(), 15u);
  EXPECT_EQ(wt[0], -1);
  // A released position is an error, not another sequence's row.
  EXPECT_THROW(kv.k_row(0, s, 0), tessera::Error);
  EXPECT_NO_THROW(kv.k_row(1, s, 0));
  kv.free_sequence(s);
  kv.check_invariants();
  EXPECT_EQ(kv.window_free_pages(), 3);
  EXPECT_EQ(kv.free_pages(), 16);
}

// A prefill chunk longer than the window: the next step releases what lies behind it.
TEST(KvCacheWindow, LongChunkThenDecode) {
  KvCache kv(window_config(16, 8));
  const KvCache::SeqId s = kv.create_sequence();
  std::vector<int> tags(30, 1);
  ASSERT_TRUE(step(kv, s, 30, 1));
  EXPECT_EQ(window_pages_held(kv, s), 8);  // nothing released before the next reserve
  ASSERT_TRUE(step(kv, s, 1, 2));
  tags.push_back(2);
  // Length 30 at that reserve: its queries see 25.., pages from 6 on.
  EXPECT_EQ(window_pages_held(kv, s), 2);
  check_readable(kv, s, tags);
  kv.check_invariants();
}

TEST(KvCacheWindow, SlackKeepsPositionsForRollback) {
  KvCache kv(window_config(16, 8, /*slack=*/5));
  const KvCache::SeqId s = kv.create_sequence();
  std::vector<int> tags;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(step(kv, s, 1, i));
    tags.push_back(i);
  }
  // Length 29 at the last reserve: queries of positions down to 29 - 5 = 24 may come
  // back, and see 19 on: page 4 (16..19) is kept, page 3 released.
  EXPECT_EQ(kv.window_block_table(s)[3], -1);
  EXPECT_GE(kv.window_block_table(s)[4], 0);
  EXPECT_TRUE(kv.can_truncate(s, 21));
  EXPECT_FALSE(kv.can_truncate(s, 20));
  EXPECT_TRUE(kv.can_truncate(s, 25));
  kv.truncate(s, 25);
  tags.resize(25);
  check_readable(kv, s, tags);
  // Below the kept positions a truncation is refused and changes nothing.
  EXPECT_FALSE(kv.can_truncate(s, 10));
  EXPECT_THROW(kv.truncate(s, 10), tessera::Error);
  EXPECT_EQ(kv.length(s), 25);
  check_readable(kv, s, tags);
  EXPECT_TRUE(kv.can_truncate(s, 0));
  kv.truncate(s, 0);
  kv.check_invariants();
  tags.clear();
  ASSERT_TRUE(step(kv, s, 9, 7));
  tags.assign(9, 7);
  check_readable(kv, s, tags);
  kv.check_invariants();
}

TEST(KvCacheWindow, ForkSharesAndCopiesOnWrite) {
  KvCache kv(window_config(16, 8));
  const KvCache::SeqId a = kv.create_sequence();
  std::vector<int> ta;
  for (int i = 0; i < 14; ++i) {
    ASSERT_TRUE(step(kv, a, 1, i));
    ta.push_back(i);
  }
  const KvCache::SeqId b = kv.fork_sequence(a);
  std::vector<int> tb = ta;
  const auto wa = kv.window_block_table(a), wb = kv.window_block_table(b);
  EXPECT_EQ(wa, wb);
  for (int32_t p : wb) {
    if (p >= 0) {
      EXPECT_EQ(kv.window_page_refcount(p), 2);
    }
  }
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(step(kv, a, 1, 100 + i));
    ta.push_back(100 + i);
    ASSERT_TRUE(step(kv, b, 1, 200 + i));
    tb.push_back(200 + i);
    kv.check_invariants();
    check_readable(kv, a, ta);
    check_readable(kv, b, tb);
  }
  // A fork where the parent's window layers no longer hold the positions before it.
  EXPECT_THROW(kv.fork_sequence(a, 4), tessera::Error);
  kv.free_sequence(a);
  kv.free_sequence(b);
  kv.check_invariants();
  EXPECT_EQ(kv.window_free_pages(), 8);
}

// A prompt's prefix is adopted only as far as its window's last pages are still cached.
TEST(KvCacheWindow, PrefixCacheKeepsTheWindowPages) {
  KvCache kv(window_config(16, 6));
  const KvCache::SeqId a = kv.create_sequence();
  ASSERT_TRUE(step(kv, a, 20, 1));  // 5 full pages
  std::vector<std::vector<int32_t>> toks;
  std::vector<int32_t> pages;
  for (size_t i = 0; i < 5; ++i) {
    toks.push_back(std::vector<int32_t>(kPage, int32_t(i)));
    ASSERT_TRUE(kv.register_page(a, i, KvCache::PageKey(i + 1), toks[i]));
    pages.push_back(kv.block_table(a)[i]);
  }
  ASSERT_TRUE(step(kv, a, 1, 2));  // releases window pages 0-2 (queries see 15..): cached, keyed
  EXPECT_EQ(kv.window_cached_pages(), 3);
  kv.free_sequence(a);
  kv.check_invariants();

  // Adopting all 5 pages (20 positions) needs window pages 3 and 4 (positions 15..19): cached.
  const KvCache::SeqId b = kv.create_sequence();
  EXPECT_EQ(kv.adoptable_pages(b, pages), 5u);
  kv.adopt_pages(b, pages);
  EXPECT_EQ(kv.length(b), 20);
  EXPECT_EQ(kv.window_block_table(b)[0], -1);
  EXPECT_GE(kv.window_block_table(b)[3], 0);
  check_readable(kv, b, std::vector<int>(20, 1));
  kv.check_invariants();
  kv.free_sequence(b);

  // Fill the window pool with another sequence: the cached window pages are evicted,
  // oldest first, and the prefix is adoptable only where its window pages remain.
  const KvCache::SeqId c = kv.create_sequence();
  ASSERT_TRUE(step(kv, c, 20, 3));  // takes the free window page and 4 of the 5 cached ones
  const KvCache::SeqId d = kv.create_sequence();
  const size_t n = kv.adoptable_pages(d, pages);
  EXPECT_EQ(n, 0u);  // page 4's window page, and every earlier one but 3, is gone
  kv.adopt_pages(d, std::span<const int32_t>(pages.data(), n));
  kv.check_invariants();
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(kv.find_cached_page(KvCache::PageKey(i + 1), toks[i]), pages[i]);
  const KvCache::SeqId e = kv.create_sequence();
  EXPECT_THROW(kv.adopt_pages(e, pages), tessera::Error);
  EXPECT_EQ(kv.length(e), 0);
  kv.check_invariants();
}

// Random steps, forks, truncations and frees: what each sequence's next step reads is
// always what was written there, and the bookkeeping holds.
TEST(KvCacheWindow, RandomWalk) {
  for (int slack : {0, 3}) {
    KvCache kv(window_config(40, 24, slack));
    std::mt19937 rng(7 + uint32_t(slack));
    std::map<KvCache::SeqId, std::vector<int>> tags;
    int tag = 0;
    for (int it = 0; it < 3000; ++it) {
      const int op = int(rng() % 10);
      if (tags.empty() || op == 0) {
        if (tags.size() < 4) tags[kv.create_sequence()] = {};
        continue;
      }
      auto pick = tags.begin();
      std::advance(pick, ptrdiff_t(rng() % tags.size()));
      const KvCache::SeqId s = pick->first;
      std::vector<int>& t = pick->second;
      if (op <= 5) {
        const int64_t n = 1 + int64_t(rng() % (op == 5 ? 9 : 2));
        if (step(kv, s, n, ++tag)) t.insert(t.end(), size_t(n), tag);
      } else if (op == 6 && tags.size() < 4) {
        const KvCache::SeqId f = kv.fork_sequence(s);
        tags[f] = t;
      } else if (op == 7) {
        const int64_t n = int64_t(t.size()) - int64_t(rng() % 4);
        if (n >= 0 && kv.can_truncate(s, n)) {
          kv.truncate(s, n);
          t.resize(size_t(n));
        } else if (n >= 0) {
          EXPECT_THROW(kv.truncate(s, n), tessera::Error);
        }
      } else if (op == 8) {
        kv.free_sequence(s);
        tags.erase(pick);
      }
      kv.check_invariants();
      for (const auto& [id, tt] : tags) check_readable(kv, id, tt);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(KvCacheWindow, ReplayedCallsGiveTheSameBookkeeping) {
  KvCache a(window_config(16, 6)), b(window_config(16, 6));
  std::vector<KvCache::Call> journal;
  a.record_calls(&journal);
  const KvCache::SeqId s = a.create_sequence();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(step(a, s, 1, i));
  const KvCache::SeqId f = a.fork_sequence(s);
  ASSERT_TRUE(step(a, f, 3, 50));
  a.record_calls(nullptr);
  for (const KvCache::Call& c : journal) b.replay(c);
  EXPECT_EQ(a.block_table(s), b.block_table(s));
  EXPECT_EQ(a.window_block_table(s), b.window_block_table(s));
  EXPECT_EQ(a.window_block_table(f), b.window_block_table(f));
  b.check_invariants();
}
