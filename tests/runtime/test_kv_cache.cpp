#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
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
  // Distinct planes never overlap: K and V of one layer, consecutive layers.
  const ptrdiff_t plane_elems = (ptrdiff_t(pt * kv.row_elems() * 2) + 63) / 64 * 64 / 2;
  EXPECT_EQ(kv.v_row(0, s, 0) - kv.k_row(0, s, 0), plane_elems);
  EXPECT_EQ(kv.k_row(1, s, 0) - kv.v_row(0, s, 0), plane_elems);
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
