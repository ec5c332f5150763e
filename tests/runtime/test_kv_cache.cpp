#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/kv_cache.h"

using tessera::KvCache;
using tessera::KvCacheConfig;

namespace {

KvCacheConfig small_config(int n_pages = 8) {
  KvCacheConfig c;
  c.n_layers = 3;
  c.n_kv_heads = 2;
  c.head_dim = 5;  // row of 10 elements = 20 bytes: planes need padding to 64
  c.page_tokens = 4;
  c.n_pages = n_pages;
  return c;
}

uint16_t value(int layer, int kv, int64_t pos, size_t e, int tag = 0) {
  return uint16_t((tag * 7919 + layer * 1000 + kv * 500 + pos * 13 + int64_t(e)) & 0xffff);
}

void write_rows(KvCache& kv, KvCache::SeqId s, int64_t from, int64_t to, int tag = 0) {
  for (int64_t p = from; p < to; ++p)
    for (int l = 0; l < kv.config().n_layers; ++l) {
      uint16_t* k = kv.k_row(l, s, p);
      uint16_t* v = kv.v_row(l, s, p);
      for (size_t e = 0; e < kv.row_elems(); ++e) {
        k[e] = value(l, 0, p, e, tag);
        v[e] = value(l, 1, p, e, tag);
      }
    }
}

void check_rows(const KvCache& kv, KvCache::SeqId s, int64_t from, int64_t to, int tag = 0) {
  for (int64_t p = from; p < to; ++p)
    for (int l = 0; l < kv.config().n_layers; ++l) {
      const uint16_t* k = kv.k_row(l, s, p);
      const uint16_t* v = kv.v_row(l, s, p);
      for (size_t e = 0; e < kv.row_elems(); ++e) {
        ASSERT_EQ(k[e], value(l, 0, p, e, tag)) << "seq " << s << " pos " << p << " layer " << l;
        ASSERT_EQ(v[e], value(l, 1, p, e, tag)) << "seq " << s << " pos " << p << " layer " << l;
      }
    }
}

}  // namespace

TEST(KvCache, ConfigValidation) {
  EXPECT_NO_THROW(KvCache{small_config()});
  for (int field = 0; field < 5; ++field) {
    for (int bad : {0, -3}) {
      KvCacheConfig c = small_config();
      int* f[] = {&c.n_layers, &c.n_kv_heads, &c.head_dim, &c.page_tokens, &c.n_pages};
      *f[field] = bad;
      EXPECT_THROW(KvCache{c}, tessera::Error) << "field " << field << " = " << bad;
    }
  }
  KvCacheConfig huge = small_config();
  huge.n_layers = huge.n_kv_heads = huge.head_dim = huge.page_tokens = huge.n_pages =
      std::numeric_limits<int>::max();
  EXPECT_THROW(KvCache{huge}, tessera::Error);
}

TEST(KvCache, WriteReadAndFree) {
  KvCache kv(small_config());
  EXPECT_EQ(kv.total_pages(), 8);
  EXPECT_EQ(kv.free_pages(), 8);
  EXPECT_EQ(kv.type(), tessera::DType::F16);
  EXPECT_EQ(kv.row_elems(), 10u);

  auto a = kv.create_sequence();
  auto b = kv.create_sequence();
  EXPECT_NE(a, b);
  EXPECT_TRUE(kv.has_sequence(a));
  EXPECT_EQ(kv.length(a), 0);
  ASSERT_TRUE(kv.reserve(a, 10));  // 3 pages
  ASSERT_TRUE(kv.reserve(b, 4));   // 1 page
  EXPECT_EQ(kv.block_table(a).size(), 3u);
  EXPECT_EQ(kv.block_table(b).size(), 1u);
  EXPECT_EQ(kv.free_pages(), 4);
  for (int32_t p : kv.block_table(a)) EXPECT_EQ(kv.page_refcount(p), 1);

  write_rows(kv, a, 0, 10, 1);
  write_rows(kv, b, 0, 4, 2);
  kv.set_length(a, 10);
  kv.set_length(b, 4);
  check_rows(kv, a, 0, 10, 1);
  check_rows(kv, b, 0, 4, 2);

  // Growing keeps the data.
  ASSERT_TRUE(kv.reserve(a, 13));
  EXPECT_EQ(kv.block_table(a).size(), 4u);
  write_rows(kv, a, 10, 13, 1);
  kv.set_length(a, 13);
  check_rows(kv, a, 0, 13, 1);

  kv.free_sequence(a);
  EXPECT_FALSE(kv.has_sequence(a));
  EXPECT_EQ(kv.free_pages(), 7);
  check_rows(kv, b, 0, 4, 2);
  kv.free_sequence(b);
  EXPECT_EQ(kv.free_pages(), 8);
}

TEST(KvCache, PlaneAlignment) {
  KvCache kv(small_config());
  auto s = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(s, 8 * 4));  // every page
  const int64_t pt = kv.config().page_tokens;
  for (int64_t p = 0; p < 8 * pt; p += pt)  // first row of a page = start of its planes
    for (int l = 0; l < kv.config().n_layers; ++l) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.k_row(l, s, p)) % 64, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.v_row(l, s, p)) % 64, 0u);
      // Rows within a plane are packed.
      EXPECT_EQ(kv.k_row(l, s, p + 1) - kv.k_row(l, s, p), ptrdiff_t(kv.row_elems()));
    }
  // Each layer's K and V are a buffer of their own, whose pages are consecutive planes
  // of page_tokens rows rounded up to 64 bytes (the storage tensor's layout).
  const ptrdiff_t plane_elems = (ptrdiff_t(pt * kv.row_elems() * 2) + 63) / 64 * 64 / 2;
  ASSERT_EQ(kv.block_table(s)[0] + 1, kv.block_table(s)[1]);
  EXPECT_EQ(kv.k_row(0, s, pt) - kv.k_row(0, s, 0), plane_elems);
  EXPECT_EQ(kv.k_storage(0).nb[2], size_t(plane_elems) * 2);
  EXPECT_EQ(kv.k_storage(0).nb[1], kv.row_elems() * 2);
  std::set<const tessera::Buffer*> buffers;
  for (int l = 0; l < kv.config().n_layers; ++l) {
    buffers.insert(kv.k_storage(l).buffer);
    buffers.insert(kv.v_storage(l).buffer);
    EXPECT_EQ(static_cast<const void*>(kv.k_row(l, s, 0)),
              static_cast<const char*>(kv.k_storage(l).data) + size_t(kv.block_table(s)[0]) * kv.k_storage(l).nb[2]);
  }
  EXPECT_EQ(buffers.size(), size_t(2 * kv.config().n_layers));
}

TEST(KvCache, ForkSharesAndCopiesOnWrite) {
  KvCache kv(small_config());
  auto parent = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(parent, 6));  // pages for [0,4) and [4,8)
  write_rows(kv, parent, 0, 6, 1);
  kv.set_length(parent, 6);
  const auto ptable = kv.block_table(parent);
  ASSERT_EQ(ptable.size(), 2u);

  auto child = kv.fork_sequence(parent);
  EXPECT_EQ(kv.length(child), 6);
  EXPECT_EQ(kv.block_table(child), ptable);
  for (int32_t p : ptable) EXPECT_EQ(kv.page_refcount(p), 2);
  EXPECT_EQ(kv.free_pages(), 6);
  check_rows(kv, child, 0, 6, 1);

  // The child writes position 6: its second page is copied, the first stays shared.
  ASSERT_TRUE(kv.reserve(child, 7));
  const auto ctable = kv.block_table(child);
  ASSERT_EQ(ctable.size(), 2u);
  EXPECT_EQ(ctable[0], ptable[0]);
  EXPECT_NE(ctable[1], ptable[1]);
  EXPECT_EQ(kv.page_refcount(ptable[0]), 2);
  EXPECT_EQ(kv.page_refcount(ptable[1]), 1);
  EXPECT_EQ(kv.page_refcount(ctable[1]), 1);
  EXPECT_EQ(kv.free_pages(), 5);
  check_rows(kv, child, 0, 6, 1);  // copied contents
  write_rows(kv, child, 4, 7, 9);  // overwrite the child's copy, incl. old positions
  kv.set_length(child, 7);
  check_rows(kv, parent, 0, 6, 1);  // parent intact
  check_rows(kv, child, 0, 4, 1);
  check_rows(kv, child, 4, 7, 9);

  // The parent's page 0 is shared: growing the parent writes page 1 only (unshared).
  ASSERT_TRUE(kv.reserve(parent, 8));
  EXPECT_EQ(kv.block_table(parent), ptable);
  write_rows(kv, parent, 6, 8, 1);
  kv.set_length(parent, 8);
  check_rows(kv, child, 4, 7, 9);

  // Freeing the parent keeps the shared page alive for the child.
  kv.free_sequence(parent);
  EXPECT_EQ(kv.page_refcount(ptable[0]), 1);
  EXPECT_EQ(kv.page_refcount(ptable[1]), 0);
  check_rows(kv, child, 0, 4, 1);
  kv.free_sequence(child);
  EXPECT_EQ(kv.free_pages(), 8);
}

// Latent attention: V is the leading part of each K row (no V planes of its own).
TEST(KvCache, ValuesReadOutOfTheKeyRows) {
  KvCacheConfig c = small_config();
  c.n_kv_heads = 1;
  c.head_dim = 10;  // latent 8 + rope 2
  c.v_in_k = 8;
  KvCache kv(c);
  EXPECT_EQ(kv.v_row_elems(), 8u);
  EXPECT_EQ(kv.bytes_per_token(), size_t(3 * 10 * 2));  // one row per layer
  for (int l = 0; l < 3; ++l) {
    const tessera::Tensor &k = kv.k_storage(l), &v = kv.v_storage(l);
    EXPECT_EQ(v.data, k.data);
    EXPECT_EQ(v.buffer, k.buffer);
    EXPECT_EQ(v.ne[0], 8);
    EXPECT_EQ(k.ne[0], 10);
    EXPECT_EQ(v.nb[1], k.nb[1]);
    EXPECT_EQ(v.nb[2], k.nb[2]);
  }
  auto s = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(s, 6));
  for (int64_t p = 0; p < 6; ++p)
    for (int l = 0; l < 3; ++l) {
      uint16_t* k = kv.k_row(l, s, p);
      for (size_t e = 0; e < 10; ++e) k[e] = value(l, 0, p, e, 3);
    }
  kv.set_length(s, 6);
  // V rows are K's first 8 values, through every accessor, also after a copy on write.
  auto child = kv.fork_sequence(s);
  ASSERT_TRUE(kv.reserve(child, 7));
  for (auto seq : {s, child})
    for (int64_t p = 0; p < 6; ++p)
      for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(kv.v_row(l, seq, p), kv.k_row(l, seq, p));
        std::vector<uint16_t> got(8, 0);
        kv.read_row(l, seq, p, 1, got.data());
        for (size_t e = 0; e < 8; ++e) ASSERT_EQ(got[e], value(l, 0, p, e, 3)) << "pos " << p << " layer " << l;
      }
  // Writing a V row writes the leading part of the K row and nothing after it.
  std::vector<uint16_t> v(8, 0x3c00);
  kv.write_row(1, child, 5, 1, v.data());
  EXPECT_EQ(kv.k_row(1, child, 5)[7], 0x3c00);
  EXPECT_EQ(kv.k_row(1, child, 5)[8], value(1, 0, 5, 8, 3));
  EXPECT_EQ(kv.k_row(1, s, 5)[0], value(1, 0, 5, 0, 3));  // the parent's page was not written
  kv.check_invariants();

  KvCacheConfig bad = c;
  bad.n_kv_heads = 2;
  EXPECT_THROW(KvCache{bad}, tessera::Error);
  bad = c;
  bad.v_in_k = 11;
  EXPECT_THROW(KvCache{bad}, tessera::Error);
}

TEST(KvCache, ForkPrefixAndParentMustReserveAgain) {
  KvCache kv(small_config());
  auto parent = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(parent, 12));
  write_rows(kv, parent, 0, 10, 1);
  kv.set_length(parent, 10);

  auto child = kv.fork_sequence(parent, 5);  // shares pages 0 and 1
  EXPECT_EQ(kv.length(child), 5);
  EXPECT_EQ(kv.block_table(child).size(), 2u);
  EXPECT_EQ(kv.page_refcount(kv.block_table(parent)[2]), 1);
  EXPECT_THROW(kv.fork_sequence(parent, 11), tessera::Error);  // beyond what was written
  EXPECT_THROW(kv.k_row(0, child, 5), tessera::Error);           // not reserved by the child

  // Parent writes at 10 (page 2, its own): no copy needed, its reservation still stands.
  write_rows(kv, parent, 10, 12, 1);
  kv.set_length(parent, 12);

  // Truncating the parent into the shared page 1 forces a reserve (copy) before writing.
  kv.truncate(parent, 6);
  EXPECT_EQ(kv.length(parent), 6);
  EXPECT_EQ(kv.block_table(parent).size(), 2u);
  EXPECT_THROW(kv.k_row(0, parent, 6), tessera::Error);
  const int32_t shared = kv.block_table(parent)[1];
  ASSERT_TRUE(kv.reserve(parent, 8));
  EXPECT_NE(kv.block_table(parent)[1], shared);
  write_rows(kv, parent, 6, 8, 5);
  kv.set_length(parent, 8);
  check_rows(kv, child, 0, 5, 1);
  check_rows(kv, parent, 0, 6, 1);
  check_rows(kv, parent, 6, 8, 5);
}

TEST(KvCache, ExhaustionChangesNothing) {
  KvCache kv(small_config(4));
  auto a = kv.create_sequence();
  auto b = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 9));  // 3 pages
  EXPECT_FALSE(kv.reserve(b, 5));  // needs 2, 1 free
  EXPECT_TRUE(kv.block_table(b).empty());
  EXPECT_EQ(kv.free_pages(), 1);
  EXPECT_FALSE(kv.reserve(a, 1000));
  EXPECT_EQ(kv.block_table(a).size(), 3u);
  EXPECT_THROW(kv.k_row(0, a, 9), tessera::Error);  // still only 9 reserved

  // Copy on write that does not fit is all-or-nothing too.
  write_rows(kv, a, 0, 6, 1);
  kv.set_length(a, 6);
  auto c = kv.fork_sequence(a);  // shares pages 0, 1
  ASSERT_TRUE(kv.reserve(b, 4));  // takes the last free page
  EXPECT_EQ(kv.free_pages(), 0);
  const auto before = kv.block_table(c);
  EXPECT_FALSE(kv.reserve(c, 7));  // needs a copy of page 1
  EXPECT_EQ(kv.block_table(c), before);
  EXPECT_EQ(kv.page_refcount(before[1]), 2);
  kv.free_sequence(b);
  EXPECT_TRUE(kv.reserve(c, 7));
  EXPECT_EQ(kv.free_pages(), 0);
  check_rows(kv, c, 0, 6, 1);
}

TEST(KvCache, Truncate) {
  KvCache kv(small_config());
  auto s = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(s, 16));
  write_rows(kv, s, 0, 16, 3);
  kv.set_length(s, 16);
  EXPECT_EQ(kv.free_pages(), 4);
  kv.truncate(s, 5);
  EXPECT_EQ(kv.length(s), 5);
  EXPECT_EQ(kv.block_table(s).size(), 2u);
  EXPECT_EQ(kv.free_pages(), 6);
  check_rows(kv, s, 0, 5, 3);
  EXPECT_THROW(kv.k_row(0, s, 5), tessera::Error);
  kv.truncate(s, 100);  // no-op beyond the end
  EXPECT_EQ(kv.length(s), 5);
  kv.truncate(s, 0);
  EXPECT_EQ(kv.length(s), 0);
  EXPECT_TRUE(kv.block_table(s).empty());
  EXPECT_EQ(kv.free_pages(), 8);
  EXPECT_THROW(kv.truncate(s, -1), tessera::Error);
}

TEST(KvCache, InvalidArgumentsThrow) {
  KvCache kv(small_config());
  auto s = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(s, 4));
  for (KvCache::SeqId bad : {-1, 1, 99}) {
    EXPECT_FALSE(kv.has_sequence(bad));
    EXPECT_THROW(kv.length(bad), tessera::Error);
    EXPECT_THROW(kv.reserve(bad, 1), tessera::Error);
    EXPECT_THROW(kv.free_sequence(bad), tessera::Error);
    EXPECT_THROW(kv.fork_sequence(bad), tessera::Error);
    EXPECT_THROW(kv.block_table(bad), tessera::Error);
    EXPECT_THROW(kv.k_row(0, bad, 0), tessera::Error);
    EXPECT_THROW(kv.set_length(bad, 0), tessera::Error);
    EXPECT_THROW(kv.truncate(bad, 0), tessera::Error);
  }
  EXPECT_THROW(kv.k_row(0, s, 4), tessera::Error);
  EXPECT_THROW(kv.v_row(0, s, -1), tessera::Error);
  EXPECT_THROW(kv.k_row(3, s, 0), tessera::Error);
  EXPECT_THROW(kv.v_row(-1, s, 0), tessera::Error);
  const KvCache& ckv = kv;
  EXPECT_THROW(ckv.k_row(0, s, 4), tessera::Error);
  EXPECT_NO_THROW(ckv.v_row(2, s, 3));
  EXPECT_THROW(kv.set_length(s, 5), tessera::Error);
  EXPECT_THROW(kv.set_length(s, -1), tessera::Error);
  EXPECT_THROW(kv.reserve(s, -1), tessera::Error);
  EXPECT_THROW(kv.page_refcount(-1), tessera::Error);
  EXPECT_THROW(kv.page_refcount(8), tessera::Error);

  // A freed id is invalid until reused.
  kv.free_sequence(s);
  EXPECT_THROW(kv.length(s), tessera::Error);
  EXPECT_THROW(kv.free_sequence(s), tessera::Error);
  auto t = kv.create_sequence();
  EXPECT_TRUE(kv.has_sequence(t));
  EXPECT_EQ(kv.length(t), 0);
}

// Recurrent (delta-net / SSM) state lives beside the pages: zeroed on creation, copied
// by a fork at the sequence's end, reset by a truncate to 0, and never rewound.
TEST(KvCache, RecurrentStateFollowsTheSequence) {
  KvCacheConfig c = small_config();
  c.recurrent.n_layers = 2;
  c.recurrent.conv_elems = 6;
  c.recurrent.state_elems = 9;
  KvCache kv(c);
  ASSERT_TRUE(kv.has_recurrent());
  auto s = kv.create_sequence();
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 6; ++e) EXPECT_EQ(kv.conv_state(l, s)[e], 0.0f);
    for (int e = 0; e < 9; ++e) EXPECT_EQ(kv.recurrent_state(l, s)[e], 0.0f);
  }
  // Layers and kinds are separate slots.
  kv.conv_state(1, s)[5] = 1.5f;
  kv.recurrent_state(0, s)[0] = -2.0f;
  EXPECT_EQ(kv.recurrent_state(0, s)[1], 0.0f);
  EXPECT_EQ(kv.conv_state(0, s)[5], 0.0f);

  ASSERT_TRUE(kv.reserve(s, 6));
  kv.set_length(s, 6);
  // A fork mid-way cannot have the state of position 3; a fork at the end copies it.
  EXPECT_THROW(kv.fork_sequence(s, 3), tessera::Error);
  auto f = kv.fork_sequence(s);
  EXPECT_EQ(kv.conv_state(1, f)[5], 1.5f);
  EXPECT_EQ(kv.recurrent_state(0, f)[0], -2.0f);
  kv.conv_state(1, f)[5] = 7.0f;  // the copy is independent
  EXPECT_EQ(kv.conv_state(1, s)[5], 1.5f);

  EXPECT_THROW(kv.truncate(s, 2), tessera::Error);
  EXPECT_NO_THROW(kv.truncate(s, 6));
  kv.truncate(s, 0);
  EXPECT_EQ(kv.conv_state(1, s)[5], 0.0f);
  EXPECT_EQ(kv.recurrent_state(0, s)[0], 0.0f);

  EXPECT_THROW(kv.conv_state(2, s), tessera::Error);
  kv.free_sequence(f);
  EXPECT_THROW(kv.recurrent_state(0, f), tessera::Error);
  // A reused id starts from zero.
  auto g = kv.create_sequence();
  EXPECT_EQ(kv.conv_state(1, g)[5], 0.0f);

  // Models without recurrent layers keep the old rules.
  KvCache plain(small_config());
  EXPECT_FALSE(plain.has_recurrent());
  auto p = plain.create_sequence();
  ASSERT_TRUE(plain.reserve(p, 6));
  plain.set_length(p, 6);
  EXPECT_NO_THROW(plain.fork_sequence(p, 3));
  EXPECT_NO_THROW(plain.truncate(p, 2));
}

// rows() gives, page by page, exactly the pointers k_row / v_row give one at a time.
TEST(KvCache, RowsEqualsTheRowByRowPointers) {
  KvCache kv(small_config());
  auto a = kv.create_sequence();
  auto b = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(b, 3));   // interleave the pages of a and b
  ASSERT_TRUE(kv.reserve(a, 6));
  ASSERT_TRUE(kv.reserve(b, 9));
  ASSERT_TRUE(kv.reserve(a, 13));
  const int64_t reserved = 13;
  for (int layer = 0; layer < kv.config().n_layers; ++layer)
    for (int which = 0; which < 2; ++which)
      for (int64_t first = 0; first <= reserved; ++first)
        for (int64_t count = 0; first + count <= reserved; ++count) {
          std::vector<const uint16_t*> got(size_t(count) + 1, nullptr);
          kv.rows(layer, a, which, first, count, got.data());
          for (int64_t j = 0; j < count; ++j)
            ASSERT_EQ(got[size_t(j)], which ? kv.v_row(layer, a, first + j) : kv.k_row(layer, a, first + j))
                << "layer " << layer << " kv " << which << " first " << first << " position " << first + j;
          EXPECT_EQ(got[size_t(count)], nullptr) << "wrote past count";
        }
  const uint16_t* out[16];
  EXPECT_THROW(kv.rows(0, a, 0, 0, reserved + 1, out), tessera::Error);
  EXPECT_THROW(kv.rows(0, a, 0, -1, 2, out), tessera::Error);
  EXPECT_THROW(kv.rows(0, a, 0, 0, -1, out), tessera::Error);
  EXPECT_THROW(kv.rows(0, a, 2, 0, 1, out), tessera::Error);
  EXPECT_THROW(kv.rows(kv.config().n_layers, a, 0, 0, 1, out), tessera::Error);
  EXPECT_THROW(kv.rows(0, 99, 0, 0, 1, out), tessera::Error);
}

// ---- Prefix cache ------------------------------------------------------------------

namespace {

std::vector<int32_t> page_ids(int32_t first) { return {first, first + 1, first + 2, first + 3}; }

}  // namespace

// Register + free keeps the pages as cached; a new sequence finds and adopts them and
// reads what the first one wrote; adopting into a live owner shares the page.
TEST(KvCache, PrefixCacheRegisterFindAdopt) {
  KvCache kv(small_config());
  kv.check_invariants();
  auto a = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 8));
  write_rows(kv, a, 0, 8, 1);
  kv.set_length(a, 8);
  const auto ta = kv.block_table(a);
  const auto t0 = page_ids(1), t1 = page_ids(5);
  EXPECT_TRUE(kv.register_page(a, 0, 11, t0));
  EXPECT_TRUE(kv.register_page(a, 1, 22, t1));
  kv.check_invariants();
  EXPECT_EQ(kv.page_key(ta[0]), 11u);
  EXPECT_EQ(kv.page_key(ta[1]), 22u);
  EXPECT_EQ(kv.find_cached_page(11, t0), ta[0]);
  EXPECT_EQ(kv.find_cached_page(22, t1), ta[1]);
  EXPECT_EQ(kv.find_cached_page(22, t0), -1);  // key matches, tokens do not
  EXPECT_EQ(kv.find_cached_page(33, t0), -1);
  EXPECT_EQ(kv.find_cached_page(11, std::vector<int32_t>{1, 2, 3}), -1);
  EXPECT_EQ(kv.cached_pages(), 0);
  EXPECT_EQ(kv.free_pages(), 6);

  kv.free_sequence(a);
  kv.check_invariants();
  EXPECT_EQ(kv.cached_pages(), 2);
  EXPECT_EQ(kv.free_pages(), 8);  // cached pages are available
  EXPECT_EQ(kv.page_refcount(ta[0]), 0);
  EXPECT_EQ(kv.find_cached_page(11, t0), ta[0]);

  auto b = kv.create_sequence();
  const int32_t found[] = {kv.find_cached_page(11, t0), kv.find_cached_page(22, t1)};
  kv.adopt_pages(b, found);
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(b), ta);
  EXPECT_EQ(kv.length(b), 8);
  EXPECT_EQ(kv.cached_pages(), 0);
  EXPECT_EQ(kv.free_pages(), 6);
  EXPECT_EQ(kv.page_refcount(ta[0]), 1);
  check_rows(kv, b, 0, 8, 1);
  EXPECT_THROW(kv.k_row(0, b, 8), tessera::Error);  // reserved == length

  // A second sequence adopts the first page while b holds it: shared.
  auto c = kv.create_sequence();
  kv.adopt_pages(c, std::span<const int32_t>(found, 1));
  EXPECT_EQ(kv.page_refcount(ta[0]), 2);
  EXPECT_EQ(kv.length(c), 4);
  // ... and continues the chain (c ends on a page boundary).
  kv.adopt_pages(c, std::span<const int32_t>(found + 1, 1));
  EXPECT_EQ(kv.block_table(c), ta);
  check_rows(kv, c, 0, 8, 1);
  kv.check_invariants();

  // c grows past the adopted pages into a page of its own; the keyed pages stay keyed.
  ASSERT_TRUE(kv.reserve(c, 10));
  write_rows(kv, c, 8, 10, 1);
  kv.set_length(c, 10);
  EXPECT_EQ(kv.page_key(ta[1]), 22u);
  check_rows(kv, b, 0, 8, 1);

  // Preconditions.
  EXPECT_THROW(kv.adopt_pages(c, std::span<const int32_t>(found, 1)), tessera::Error);  // length 10: mid-page
  auto d = kv.create_sequence();
  const int32_t unkeyed[] = {kv.block_table(c)[2]};
  EXPECT_THROW(kv.adopt_pages(d, unkeyed), tessera::Error);
  const int32_t out_of_range[] = {found[0], 8};
  EXPECT_THROW(kv.adopt_pages(d, out_of_range), tessera::Error);
  EXPECT_TRUE(kv.block_table(d).empty());  // nothing taken by a rejected adopt
  EXPECT_EQ(kv.page_refcount(found[0]), 2);
  EXPECT_THROW(kv.adopt_pages(99, found), tessera::Error);
  EXPECT_THROW(kv.page_key(-1), tessera::Error);
  EXPECT_THROW(kv.page_key(8), tessera::Error);
  kv.check_invariants();

  kv.free_sequence(b);
  kv.free_sequence(c);
  kv.free_sequence(d);
  EXPECT_EQ(kv.cached_pages(), 2);
  EXPECT_EQ(kv.free_pages(), 8);
  kv.check_invariants();
}

TEST(KvCache, PrefixCacheRegisterValidation) {
  KvCache kv(small_config());
  auto a = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 12));
  kv.set_length(a, 6);
  const auto t = page_ids(0);
  EXPECT_THROW(kv.register_page(a, 1, 5, t), tessera::Error);   // positions 4..7, length 6: not full
  EXPECT_THROW(kv.register_page(a, 2, 5, t), tessera::Error);   // not full either
  EXPECT_THROW(kv.register_page(a, 3, 5, t), tessera::Error);   // outside the table
  EXPECT_THROW(kv.register_page(a, 0, 0, t), tessera::Error);   // key 0
  EXPECT_THROW(kv.register_page(a, 0, 5, std::vector<int32_t>{1, 2, 3}), tessera::Error);
  EXPECT_THROW(kv.register_page(a, 0, 5, std::vector<int32_t>{1, 2, 3, 4, 5}), tessera::Error);
  EXPECT_THROW(kv.register_page(7, 0, 5, t), tessera::Error);
  for (int32_t p = 0; p < kv.total_pages(); ++p) EXPECT_EQ(kv.page_key(p), 0u);

  EXPECT_TRUE(kv.register_page(a, 0, 5, t));
  EXPECT_FALSE(kv.register_page(a, 0, 5, t));  // already registered
  EXPECT_FALSE(kv.register_page(a, 0, 6, t));  // the page already has a key
  EXPECT_EQ(kv.page_key(kv.block_table(a)[0]), 5u);
  kv.set_length(a, 8);
  EXPECT_FALSE(kv.register_page(a, 1, 5, t));  // the key belongs to another page
  EXPECT_EQ(kv.page_key(kv.block_table(a)[1]), 0u);
  EXPECT_TRUE(kv.register_page(a, 1, 6, page_ids(4)));
  EXPECT_EQ(kv.find_cached_page(5, t), kv.block_table(a)[0]);
  EXPECT_EQ(kv.find_cached_page(6, page_ids(4)), kv.block_table(a)[1]);
  kv.check_invariants();
}

// When the free list is empty, reserve() evicts the least recently released cached page;
// its key is forgotten. free_sequence releases the tail page first.
TEST(KvCache, PrefixCacheEvictsLeastRecentlyReleased) {
  KvCache kv(small_config(6));
  KvCache::SeqId s[3];
  int32_t page[3];
  for (int i = 0; i < 3; ++i) {
    s[i] = kv.create_sequence();
    ASSERT_TRUE(kv.reserve(s[i], 4));
    write_rows(kv, s[i], 0, 4, 10 + i);
    kv.set_length(s[i], 4);
    ASSERT_TRUE(kv.register_page(s[i], 0, KvCache::PageKey(100 + i), page_ids(10 * i)));
    page[i] = kv.block_table(s[i])[0];
  }
  // A two-page chain: keys 200 (head) and 201 (tail).
  auto chain = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(chain, 8));
  write_rows(kv, chain, 0, 8, 20);
  kv.set_length(chain, 8);
  ASSERT_TRUE(kv.register_page(chain, 0, 200, page_ids(50)));
  ASSERT_TRUE(kv.register_page(chain, 1, 201, page_ids(54)));
  EXPECT_EQ(kv.free_pages(), 1);

  kv.free_sequence(s[1]);
  kv.free_sequence(chain);  // releases 201, then 200
  kv.free_sequence(s[0]);
  kv.free_sequence(s[2]);
  // Release order (oldest first): 101, 201, 200, 100, 102.
  EXPECT_EQ(kv.cached_pages(), 5);
  EXPECT_EQ(kv.free_pages(), 6);
  kv.check_invariants();

  // Adopting page 101 takes it out of the evictable list; releasing it again makes it
  // the most recently released. Order now: 201, 200, 100, 102, 101.
  auto t = kv.create_sequence();
  const int32_t p101[] = {kv.find_cached_page(101, page_ids(10))};
  ASSERT_EQ(p101[0], page[1]);
  kv.adopt_pages(t, p101);
  EXPECT_EQ(kv.cached_pages(), 4);
  EXPECT_EQ(kv.free_pages(), 5);
  kv.free_sequence(t);
  EXPECT_EQ(kv.cached_pages(), 5);

  auto big = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(big, 4));  // the one free page: no eviction
  EXPECT_EQ(kv.cached_pages(), 5);
  const std::pair<KvCache::PageKey, int> order[] = {{201, 54}, {200, 50}, {100, 0}, {102, 20}, {101, 10}};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(kv.reserve(big, 8 + 4 * i));
    kv.check_invariants();
    EXPECT_EQ(kv.cached_pages(), 4 - i);
    EXPECT_EQ(kv.find_cached_page(order[i].first, page_ids(order[i].second)), -1) << "key " << order[i].first;
    for (int j = i + 1; j < 5; ++j)
      EXPECT_NE(kv.find_cached_page(order[j].first, page_ids(order[j].second)), -1) << "key " << order[j].first;
  }
  EXPECT_EQ(kv.free_pages(), 0);
  EXPECT_FALSE(kv.reserve(big, 28));
  for (int32_t p = 0; p < kv.total_pages(); ++p) EXPECT_EQ(kv.page_key(p), 0u);

  // A reserve that does not fit changes nothing, cached pages included.
  kv.free_sequence(big);
  auto u = kv.create_sequence();
  auto w = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(u, 4));
  ASSERT_TRUE(kv.reserve(w, 4));
  kv.set_length(u, 4);
  ASSERT_TRUE(kv.register_page(u, 0, 7, page_ids(0)));
  kv.free_sequence(u);
  auto v = kv.create_sequence();
  EXPECT_EQ(kv.free_pages(), 5);  // 4 free + 1 cached
  EXPECT_FALSE(kv.reserve(v, 21));
  EXPECT_TRUE(kv.block_table(v).empty());
  EXPECT_EQ(kv.cached_pages(), 1);
  EXPECT_NE(kv.find_cached_page(7, page_ids(0)), -1);
  EXPECT_TRUE(kv.reserve(v, 20));  // now the cached page goes too
  EXPECT_EQ(kv.cached_pages(), 0);
  EXPECT_EQ(kv.find_cached_page(7, page_ids(0)), -1);
  kv.check_invariants();
}

// A keyed page its only owner may write again (after a truncate into it) loses its key
// in reserve(): in place, no copy.
TEST(KvCache, PrefixCacheKeyDroppedWhenPageBecomesWritable) {
  KvCache kv(small_config());
  auto a = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 12));
  write_rows(kv, a, 0, 12, 1);
  kv.set_length(a, 12);
  ASSERT_TRUE(kv.register_page(a, 0, 1, page_ids(0)));
  ASSERT_TRUE(kv.register_page(a, 1, 2, page_ids(4)));
  ASSERT_TRUE(kv.register_page(a, 2, 3, page_ids(8)));
  const auto ta = kv.block_table(a);

  kv.truncate(a, 6);  // page 2 is released (cached), page 1 is kept, keyed
  kv.check_invariants();
  EXPECT_EQ(kv.cached_pages(), 1);
  EXPECT_EQ(kv.page_key(ta[2]), 3u);
  EXPECT_EQ(kv.page_key(ta[1]), 2u);
  EXPECT_EQ(kv.find_cached_page(2, page_ids(4)), ta[1]);
  EXPECT_THROW(kv.k_row(0, a, 6), tessera::Error);  // must reserve before writing

  const int free_before = kv.free_pages();
  ASSERT_TRUE(kv.reserve(a, 8));
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(a)[1], ta[1]);  // in place
  EXPECT_EQ(kv.page_key(ta[1]), 0u);
  EXPECT_EQ(kv.find_cached_page(2, page_ids(4)), -1);
  EXPECT_EQ(kv.page_key(ta[0]), 1u);  // the page below length keeps its key
  EXPECT_EQ(kv.free_pages(), free_before);
  write_rows(kv, a, 6, 8, 2);
  kv.set_length(a, 8);
  check_rows(kv, a, 0, 6, 1);
  check_rows(kv, a, 6, 8, 2);
  // The rewritten page can be registered again under its new content's key.
  EXPECT_TRUE(kv.register_page(a, 1, 22, page_ids(40)));
  // A reserve within what is written drops nothing.
  ASSERT_TRUE(kv.reserve(a, 8));
  EXPECT_EQ(kv.page_key(ta[1]), 22u);
  kv.check_invariants();
}

// A keyed page shared by several sequences is copied before a write; the copy has no key
// and the original keeps its key and content.
TEST(KvCache, PrefixCacheCopyOnWriteOfSharedKeyedPage) {
  KvCache kv(small_config());
  auto a = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 8));
  write_rows(kv, a, 0, 8, 1);
  kv.set_length(a, 8);
  ASSERT_TRUE(kv.register_page(a, 0, 1, page_ids(0)));
  ASSERT_TRUE(kv.register_page(a, 1, 2, page_ids(4)));
  const auto ta = kv.block_table(a);

  auto b = kv.fork_sequence(a, 6);  // shares both pages
  EXPECT_EQ(kv.page_refcount(ta[1]), 2);
  ASSERT_TRUE(kv.reserve(b, 8));
  kv.check_invariants();
  const auto tb = kv.block_table(b);
  EXPECT_EQ(tb[0], ta[0]);
  EXPECT_NE(tb[1], ta[1]);
  EXPECT_EQ(kv.page_key(tb[1]), 0u);
  EXPECT_EQ(kv.page_key(ta[1]), 2u);
  EXPECT_EQ(kv.page_refcount(ta[1]), 1);
  write_rows(kv, b, 6, 8, 9);
  kv.set_length(b, 8);
  check_rows(kv, b, 0, 6, 1);
  check_rows(kv, a, 0, 8, 1);

  // Same through adoption: c adopts both pages, truncates into the second, writes.
  auto c = kv.create_sequence();
  kv.adopt_pages(c, ta);
  kv.truncate(c, 5);
  ASSERT_TRUE(kv.reserve(c, 8));
  EXPECT_NE(kv.block_table(c)[1], ta[1]);
  EXPECT_EQ(kv.page_key(kv.block_table(c)[1]), 0u);
  EXPECT_EQ(kv.page_key(ta[1]), 2u);
  write_rows(kv, c, 5, 8, 7);
  kv.set_length(c, 8);
  check_rows(kv, c, 0, 5, 1);
  check_rows(kv, c, 5, 8, 7);
  check_rows(kv, a, 0, 8, 1);
  EXPECT_EQ(kv.find_cached_page(2, page_ids(4)), ta[1]);
  kv.check_invariants();
}

TEST(KvCache, PrefixCacheClear) {
  KvCache kv(small_config());
  auto a = kv.create_sequence();
  auto b = kv.create_sequence();
  ASSERT_TRUE(kv.reserve(a, 8));
  ASSERT_TRUE(kv.reserve(b, 4));
  kv.set_length(a, 8);
  kv.set_length(b, 4);
  ASSERT_TRUE(kv.register_page(a, 0, 1, page_ids(0)));
  ASSERT_TRUE(kv.register_page(a, 1, 2, page_ids(4)));
  ASSERT_TRUE(kv.register_page(b, 0, 3, page_ids(8)));
  kv.free_sequence(a);
  EXPECT_EQ(kv.cached_pages(), 2);
  EXPECT_EQ(kv.free_pages(), 7);

  kv.clear_prefix_cache();
  kv.check_invariants();
  EXPECT_EQ(kv.cached_pages(), 0);
  EXPECT_EQ(kv.free_pages(), 7);
  for (int32_t p = 0; p < kv.total_pages(); ++p) EXPECT_EQ(kv.page_key(p), 0u);
  EXPECT_EQ(kv.find_cached_page(1, page_ids(0)), -1);
  EXPECT_EQ(kv.find_cached_page(3, page_ids(8)), -1);
  EXPECT_TRUE(kv.register_page(b, 0, 1, page_ids(0)));  // keys are free again
  ASSERT_TRUE(kv.reserve(b, 4 * 8));  // every page, no eviction needed
  kv.check_invariants();
}

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The key of a page: its tokens chained with the previous page's key (0 before the first).
KvCache::PageKey chain_key(KvCache::PageKey prev, std::span<const int32_t> tokens) {
  uint64_t h = mix64(prev ^ 0x5851f42d4c957f2dull);
  for (int32_t t : tokens) h = mix64(h + uint32_t(t));
  return h ? h : 1;
}

// A random walk over the cache API with a model of what every live sequence must read:
// position p holds values derived from the hash of tokens [0, p], as a model's K and V
// depend on the whole prefix. The model also tracks the eviction order.
class PrefixCacheWalk {
 public:
  enum Op { kCreate, kFork, kGrow, kRegister, kAdopt, kFree, kTruncate, kPressure, kClear, kOps };
  static constexpr const char* kOpNames[kOps] = {"create", "fork",     "grow",     "register", "adopt",
                                                 "free",   "truncate", "pressure", "clear"};

  explicit PrefixCacheWalk(const KvCacheConfig& c) : kv(c), pt(c.page_tokens) {}

  KvCache kv;
  const int pt;
  std::mt19937 rng{20240611};
  std::string err;  // the first mismatch with the model

  // Counters.
  int ops[kOps] = {};
  int adopts_with_pages = 0, adopted_pages = 0, adopted_cached_pages = 0, adopted_live_pages = 0;
  int registered = 0, register_refused = 0, evictions = 0, reserve_failures = 0, prefix_forks = 0;

  void step() {
    Op op = pick();
    ++ops[op];
    switch (op) {
      case kCreate: live[kv.create_sequence()] = {}; break;
      case kFork: fork(); break;
      case kGrow: grow(any_live(), random_tokens(rnd(1, 2 * pt + 1))); break;
      case kRegister: register_all(any_live()); break;
      case kAdopt: adopt(); break;
      case kFree: free(any_live()); break;
      case kTruncate: truncate(); break;
      case kPressure: grow(rnd(0, 2) == 0 || live.size() < 4 ? new_seq() : any_live(), random_tokens(rnd(8, 64))); break;
      case kClear:
        kv.clear_prefix_cache();
        lru.clear();
        break;
      case kOps: break;
    }
  }

  // Everything the cache and the model must agree on; returns the first mismatch.
  std::string check() {
    if (!err.empty()) return err;
    try {
      kv.check_invariants();
    } catch (const tessera::Error& e) {
      return e.what();
    }
    const int n = kv.total_pages();
    std::vector<int> entries(size_t(n), 0);
    for (auto& [id, st] : live)
      for (int32_t p : kv.block_table(id)) ++entries[size_t(p)];
    int in_use = 0, cached = 0;
    for (int32_t p = 0; p < n; ++p) {
      if (kv.page_refcount(p) != entries[size_t(p)])
        return "page " + std::to_string(p) + ": refcount " + std::to_string(kv.page_refcount(p)) + " vs " +
               std::to_string(entries[size_t(p)]) + " table entries";
      in_use += kv.page_refcount(p) > 0;
      cached += kv.page_refcount(p) == 0 && kv.page_key(p) != 0;
    }
    if (kv.free_pages() + in_use != n)
      return "free_pages " + std::to_string(kv.free_pages()) + " + in use " + std::to_string(in_use) + " != total";
    if (cached != kv.cached_pages() || size_t(cached) != lru.size())
      return "cached pages: " + std::to_string(cached) + " counted, " + std::to_string(kv.cached_pages()) +
             " reported, " + std::to_string(lru.size()) + " modelled";
    for (auto [p, key] : lru)
      if (kv.page_refcount(p) != 0 || kv.page_key(p) != key) return "modelled cached page " + std::to_string(p);

    for (auto& [id, st] : live) {
      const std::string seq = "sequence " + std::to_string(id);
      if (kv.length(id) != int64_t(st.tokens.size())) return seq + ": length differs";
      const auto& table = kv.block_table(id);
      if (table.size() * size_t(pt) < st.tokens.size()) return seq + ": block table too short";
      for (size_t p = 0; p < st.tokens.size(); ++p)
        for (int l = 0; l < kv.config().n_layers; ++l) {
          const uint16_t* k = kv.k_row(l, id, int64_t(p));
          const uint16_t* v = kv.v_row(l, id, int64_t(p));
          for (size_t e = 0; e < kv.row_elems(); ++e)
            if (k[e] != stream_value(st.ph[p], l, 0, e) || v[e] != stream_value(st.ph[p], l, 1, e))
              return seq + ": wrong value at position " + std::to_string(p) + " (page " +
                     std::to_string(table[p / size_t(pt)]) + ")";
        }
      // A keyed full page carries the key of this sequence's own prefix.
      KvCache::PageKey key = 0;
      for (size_t i = 0; (i + 1) * size_t(pt) <= st.tokens.size(); ++i) {
        key = chain_key(key, page_tokens(st.tokens, i));
        const KvCache::PageKey has = kv.page_key(table[i]);
        if (has != 0 && has != key) return seq + ": page " + std::to_string(i) + " has another prefix's key";
      }
    }
    return "";
  }

 private:
  struct Stream {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> ph;  // ph[p]: hash of tokens [0, p]
  };
  std::map<KvCache::SeqId, Stream> live;
  std::vector<std::vector<int32_t>> history;                 // token streams of freed sequences
  std::vector<std::pair<int32_t, KvCache::PageKey>> lru;  // cached pages, least recently released first

  static uint16_t stream_value(uint64_t ph, int layer, int kv, size_t e) {
    return uint16_t(mix64(ph + uint64_t(layer * 4 + kv * 2) + e) >> 17);
  }
  std::span<const int32_t> page_tokens(const std::vector<int32_t>& t, size_t i) const {
    return std::span<const int32_t>(t).subspan(i * size_t(pt), size_t(pt));
  }
  int rnd(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  std::vector<int32_t> random_tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = rnd(0, 2);  // a small vocabulary: prompts often share prefixes
    return t;
  }
  KvCache::SeqId any_live() {
    auto it = live.begin();
    std::advance(it, rnd(0, int(live.size()) - 1));
    return it->first;
  }
  KvCache::SeqId new_seq() {
    auto s = kv.create_sequence();
    live[s] = {};
    return s;
  }
  int in_use() const {
    int n = 0;
    for (int32_t p = 0; p < kv.total_pages(); ++p) n += kv.page_refcount(p) > 0;
    return n;
  }
  void fail(const std::string& what) {
    if (err.empty()) err = what;
  }

  Op pick() {
    static const int weights[kOps] = {8, 10, 22, 14, 20, 12, 8, 5, 0};
    if (rnd(0, 399) == 0) return kClear;
    for (;;) {
      int r = rnd(0, 98), op = 0;
      while (r >= weights[op]) r -= weights[op++];
      const bool creates = op == kCreate || op == kFork || op == kAdopt;
      if (live.size() >= 20 && creates) continue;
      if (live.empty() && op != kCreate && op != kAdopt && op != kPressure) continue;
      if (op == kAdopt && live.empty() && history.empty()) continue;
      return Op(op);
    }
  }

  // reserve() checked against the model: pages come from the free list first, then
  // the least recently released cached pages are evicted, in that order.
  bool reserve(KvCache::SeqId s, int64_t n) {
    const int free_list = kv.free_pages() - kv.cached_pages(), used = in_use();
    // Pages it needs: new ones, plus a copy of each shared page overlapping [length, n).
    const auto& table = kv.block_table(s);
    const size_t need = size_t((n + pt - 1) / pt), first = size_t(kv.length(s) / pt);
    int needed = int(need > table.size() ? need - table.size() : 0);
    if (n > kv.length(s))
      for (size_t i = first; i < std::min(need, table.size()); ++i) needed += kv.page_refcount(table[i]) > 1;
    if (!kv.reserve(s, n)) {
      ++reserve_failures;
      if (needed <= kv.free_pages()) fail("reserve failed with enough available pages");
      if (in_use() != used) fail("a failed reserve took pages");
      for (auto [p, key] : lru)
        if (kv.page_key(p) != key) fail("a failed reserve evicted page " + std::to_string(p));
      return false;
    }
    if (in_use() - used != needed) fail("reserve took " + std::to_string(in_use() - used) + " pages, not " +
                                        std::to_string(needed));
    const size_t k = size_t(std::max(0, needed - free_list));
    for (size_t i = 0; i < lru.size(); ++i)
      if ((kv.page_key(lru[i].first) != lru[i].second) != (i < k))
        fail("eviction order: page " + std::to_string(lru[i].first) + " at LRU position " + std::to_string(i) +
             " with " + std::to_string(k) + " evictions");
    lru.erase(lru.begin(), lru.begin() + ptrdiff_t(std::min(k, lru.size())));
    evictions += int(k);
    return true;
  }

  bool grow(KvCache::SeqId s, const std::vector<int32_t>& tokens) {
    Stream& st = live[s];
    const int64_t from = int64_t(st.tokens.size()), to = from + int64_t(tokens.size());
    if (!reserve(s, to)) return false;
    for (int32_t t : tokens) {
      st.ph.push_back(mix64((st.ph.empty() ? 0x1234 : st.ph.back()) * 31 + uint32_t(t)));
      st.tokens.push_back(t);
    }
    for (int64_t p = from; p < to; ++p)
      for (int l = 0; l < kv.config().n_layers; ++l) {
        uint16_t* k = kv.k_row(l, s, p);
        uint16_t* v = kv.v_row(l, s, p);
        for (size_t e = 0; e < kv.row_elems(); ++e) {
          k[e] = stream_value(st.ph[size_t(p)], l, 0, e);
          v[e] = stream_value(st.ph[size_t(p)], l, 1, e);
        }
      }
    kv.set_length(s, to);
    return true;
  }

  // Pages released by an operation, in release order: those now cached join the model's
  // LRU list at the most recently released end.
  void released(const std::vector<int32_t>& pages) {
    for (int32_t p : pages)
      if (kv.page_refcount(p) == 0 && kv.page_key(p) != 0) lru.emplace_back(p, kv.page_key(p));
  }

  void fork() {
    auto parent = any_live();
    const Stream st = live[parent];
    int64_t n = int64_t(st.tokens.size());
    if (rnd(0, 2)) {  // mostly a shorter prefix
      n = rnd(0, int(n));
      prefix_forks += n < int64_t(st.tokens.size());
    }
    auto child = kv.fork_sequence(parent, n);
    live[child] = {std::vector<int32_t>(st.tokens.begin(), st.tokens.begin() + n),
                   std::vector<uint64_t>(st.ph.begin(), st.ph.begin() + n)};
  }

  void register_all(KvCache::SeqId s) {
    const Stream& st = live[s];
    KvCache::PageKey key = 0;
    for (size_t i = 0; (i + 1) * size_t(pt) <= st.tokens.size(); ++i) {
      const auto toks = page_tokens(st.tokens, i);
      key = chain_key(key, toks);
      if (kv.page_key(kv.block_table(s)[i]) != 0) continue;
      if (kv.register_page(s, i, key, toks)) {
        ++registered;
        if (kv.find_cached_page(key, toks) != kv.block_table(s)[i]) fail("a registered page is not found");
      } else {
        ++register_refused;  // the same prefix is registered on another page
        const int32_t other = kv.find_cached_page(key, toks);
        if (other < 0 || other == kv.block_table(s)[i]) fail("register refused without a registered duplicate");
      }
    }
  }

  // A new sequence adopts the longest registered chain of some token prefix, then
  // (sometimes) computes the rest of that prefix.
  void adopt() {
    std::vector<int32_t> src;
    if (!history.empty() && (live.empty() || rnd(0, 2)))  // mostly a recently finished prompt
      src = history[history.size() - 1 - size_t(rnd(0, std::min(7, int(history.size()) - 1)))];
    else
      src = live[any_live()].tokens;
    src.resize(size_t(rnd(0, 2) ? int(src.size()) : rnd(0, int(src.size()))));  // mostly all of it
    std::vector<int32_t> pages;
    KvCache::PageKey key = 0;
    for (size_t i = 0; (i + 1) * size_t(pt) <= src.size(); ++i) {
      key = chain_key(key, page_tokens(src, i));
      const int32_t p = kv.find_cached_page(key, page_tokens(src, i));
      if (p < 0) break;
      pages.push_back(p);
    }
    auto s = new_seq();
    for (int32_t p : pages) {
      const bool was_cached = kv.page_refcount(p) == 0;
      adopted_cached_pages += was_cached;
      adopted_live_pages += !was_cached;
      if (was_cached) {
        auto it = std::find_if(lru.begin(), lru.end(), [&](auto& e) { return e.first == p; });
        if (it == lru.end()) fail("adopted a cached page the model does not have");
        else lru.erase(it);
      }
    }
    kv.adopt_pages(s, pages);
    adopts_with_pages += !pages.empty();
    adopted_pages += int(pages.size());
    const size_t have = pages.size() * size_t(pt);
    Stream& st = live[s];
    for (size_t p = 0; p < have; ++p) {
      st.ph.push_back(mix64((p ? st.ph.back() : 0x1234) * 31 + uint32_t(src[p])));
      st.tokens.push_back(src[p]);
    }
    if (have < src.size() && rnd(0, 1)) grow(s, std::vector<int32_t>(src.begin() + ptrdiff_t(have), src.end()));
  }

  void free(KvCache::SeqId s) {
    if (rnd(0, 3)) register_all(s);  // a finished request usually registered its full pages
    std::vector<int32_t> table = kv.block_table(s);
    std::reverse(table.begin(), table.end());  // free_sequence releases the tail first
    kv.free_sequence(s);
    released(table);
    history.push_back(std::move(live[s].tokens));
    if (history.size() > 32) history.erase(history.begin());
    live.erase(s);
  }

  void truncate() {
    auto s = any_live();
    Stream& st = live[s];
    const int n = rnd(0, int(st.tokens.size()));
    const auto table = kv.block_table(s);
    kv.truncate(s, n);
    const size_t keep = (size_t(n) + size_t(pt) - 1) / size_t(pt);
    std::vector<int32_t> dropped;
    for (size_t i = table.size(); i > keep; --i) dropped.push_back(table[i - 1]);  // last page first
    released(dropped);
    st.tokens.resize(size_t(n));
    st.ph.resize(size_t(n));
  }
};

}  // namespace

// The random walks' pool: 64 pages of 4 tokens, 2 layers of one 2-wide KV head.
static KvCacheConfig walk_config() {
  KvCacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 1;
  c.head_dim = 2;
  c.page_tokens = 4;
  c.n_pages = 64;
  return c;
}

// 10,000 random operations on a small pool (64 pages of 4 tokens): every sequence must
// keep reading what was written for its tokens, through forks, adoption, copy on write,
// truncation and eviction; check_invariants and an independent count agree after each.
TEST(KvCache, PrefixCacheRandomWalk) {
  const KvCacheConfig c = walk_config();
  PrefixCacheWalk w(c);
  for (int i = 0; i < 10000; ++i) {
    w.step();
    const std::string err = w.check();
    ASSERT_EQ(err, "") << "after operation " << i;
  }
  std::string summary;
  for (int op = 0; op < PrefixCacheWalk::kOps; ++op)
    summary += std::string(PrefixCacheWalk::kOpNames[op]) + "=" + std::to_string(w.ops[op]) + " ";
  summary += "| adopts with pages=" + std::to_string(w.adopts_with_pages) +
             " adopted pages=" + std::to_string(w.adopted_pages) + " (cached " +
             std::to_string(w.adopted_cached_pages) + ", live " + std::to_string(w.adopted_live_pages) +
             ") registered=" + std::to_string(w.registered) + " refused=" + std::to_string(w.register_refused) +
             " evictions=" + std::to_string(w.evictions) + " reserve failures=" + std::to_string(w.reserve_failures) +
             " prefix forks=" + std::to_string(w.prefix_forks);
  std::printf("%s\n", summary.c_str());
  for (int op = 0; op < PrefixCacheWalk::kOps - 1; ++op)
    EXPECT_GT(w.ops[op], 200) << PrefixCacheWalk::kOpNames[op] << "\n" << summary;
  EXPECT_GT(w.ops[PrefixCacheWalk::kClear], 5) << summary;
  EXPECT_GT(w.adopts_with_pages, 200) << summary;
  EXPECT_GT(w.adopted_cached_pages, 200) << summary;
  EXPECT_GT(w.adopted_live_pages, 200) << summary;
  EXPECT_GT(w.evictions, 100) << summary;
  EXPECT_GT(w.registered, 500) << summary;
  EXPECT_GT(w.register_refused, 20) << summary;
  EXPECT_GT(w.reserve_failures, 50) << summary;
  EXPECT_GT(w.prefix_forks, 100) << summary;
}

// A distributed run's other ranks replay rank 0's bookkeeping calls: after any mix of
// the walk's calls (forks, copy on write, prefix-cache adoption and eviction, failed
// reservations), the replica's sequences, block tables, page refcounts and keys are
// the original's.
TEST(KvCache, ReplayedCallsGiveTheSameBookkeeping) {
  const KvCacheConfig c = walk_config();
  PrefixCacheWalk w(c);
  KvCache replica(c);
  std::vector<KvCache::Call> journal;
  w.kv.record_calls(&journal);
  size_t replayed = 0;
  for (int round = 0; round < 40; ++round) {
    for (int i = 0; i < 100; ++i) w.step();
    for (const KvCache::Call& call : journal) replica.replay(call);
    replayed += journal.size();
    journal.clear();
    ASSERT_EQ(replica.free_pages(), w.kv.free_pages()) << "round " << round;
    ASSERT_EQ(replica.cached_pages(), w.kv.cached_pages()) << "round " << round;
    for (int32_t p = 0; p < c.n_pages; ++p) {
      ASSERT_EQ(replica.page_refcount(p), w.kv.page_refcount(p)) << "page " << p << ", round " << round;
      ASSERT_EQ(replica.page_key(p), w.kv.page_key(p)) << "page " << p << ", round " << round;
    }
    for (KvCache::SeqId s = 0; s < 256; ++s) {
      ASSERT_EQ(replica.has_sequence(s), w.kv.has_sequence(s)) << "sequence " << s << ", round " << round;
      if (!w.kv.has_sequence(s)) continue;
      ASSERT_EQ(replica.length(s), w.kv.length(s));
      ASSERT_EQ(replica.reserved(s), w.kv.reserved(s));
      ASSERT_EQ(replica.block_table(s), w.kv.block_table(s));
    }
    replica.check_invariants();
  }
  EXPECT_GT(replayed, 3000u);
  // A replica that has drifted (a sequence of its own) says so instead of going on.
  KvCache::Call create;
  create.kind = KvCache::Call::Kind::Create;
  create.result = w.kv.create_sequence();
  replica.create_sequence();
  try {
    replica.replay(create);
    FAIL() << "a diverged replay went on";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
}
