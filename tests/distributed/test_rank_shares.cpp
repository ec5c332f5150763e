// How a distributed run shares a model out (rank_group.h): experts in byte-balanced
// blocks with their owners, layers in contiguous ranges, equal or sized by memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tessera/rank_group.h"

namespace tessera {
namespace {

std::vector<std::pair<int64_t, int64_t>> ranges_by_memory(int64_t layers, const std::vector<uint64_t>& memory,
                                                          uint64_t fixed) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int r = 0; r < int(memory.size()); ++r) {
    const LayerRange l = layer_range_by_memory(layers, r, memory, fixed);
    out.emplace_back(l.first, l.end);
  }
  return out;
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;
constexpr uint64_t G = uint64_t(1) << 30;

TEST(RankShares, ExpertBlocksCoverEveryExpertOnceWithTheirOwners) {
  for (int64_t n_expert : {8, 60, 128, 256})
    for (int ranks = 1; ranks <= 7; ++ranks) {
      int64_t at = 0;
      for (int r = 0; r < ranks; ++r) {
        const ExpertRange e = expert_range(n_expert, r, ranks);
        EXPECT_EQ(e.first, at);
        EXPECT_LE(e.end - e.first, n_expert / ranks + 1);
        EXPECT_GE(e.end - e.first, n_expert / ranks);
        for (int64_t x = e.first; x < e.end; ++x) EXPECT_EQ(expert_owner(x, n_expert, ranks), r);
        at = e.end;
      }
      EXPECT_EQ(at, n_expert);
    }
}

TEST(RankShares, EqualLayerRangesGiveRankZeroLayers) {
  EXPECT_EQ(layer_range(48, 0, 2).end, 24);
  EXPECT_EQ(layer_range(2, 0, 3).end, 1);  // more ranks than layers: the last has none
  EXPECT_EQ(layer_range(2, 2, 3).first, layer_range(2, 2, 3).end);
}

TEST(RankShares, LayerRangesFollowEachRanksMemory) {
  // Equal memory and a small head: equal ranges.
  EXPECT_EQ(ranges_by_memory(22, {16 * G, 16 * G}, G / 10), (Ranges{{0, 11}, {11, 22}}));
  // Twice the memory, twice the layers.
  EXPECT_EQ(ranges_by_memory(48, {16 * G, 32 * G}, 0), (Ranges{{0, 16}, {16, 48}}));
  EXPECT_EQ(ranges_by_memory(60, {64 * G, 32 * G, 32 * G, 64 * G}, 0),
            (Ranges{{0, 20}, {20, 30}, {30, 40}, {40, 60}}));
  // Rank 0's embeddings and head come off its room first.
  EXPECT_EQ(ranges_by_memory(40, {24 * G, 16 * G}, 8 * G), (Ranges{{0, 20}, {20, 40}}));
  // Rank 0 keeps a layer even when the head fills its memory; later ranks may get none.
  EXPECT_EQ(ranges_by_memory(10, {4 * G, 64 * G}, 8 * G), (Ranges{{0, 1}, {1, 10}}));
  EXPECT_EQ(ranges_by_memory(2, {16 * G, 16 * G, 16 * G}, 0), (Ranges{{0, 1}, {1, 1}, {1, 2}}));
  // No budget with room: equal ranges.
  EXPECT_EQ(ranges_by_memory(8, {0, 0}, 0), (Ranges{{0, 4}, {4, 8}}));
}

}  // namespace
}  // namespace tessera
