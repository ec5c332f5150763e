// How --split layers cuts a step into pipelined micro-batches: whole sequences, in
// order, none empty, at most one per rank, balanced by tokens; each micro-batch a step
// of its own with its rows renumbered.
#include <gtest/gtest.h>

#include <vector>

#include "distributed/micro_batches.h"

namespace tessera::detail {
namespace {

std::vector<SeqSlice> slices_of(const std::vector<int32_t>& counts) {
  std::vector<SeqSlice> out;
  int32_t first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out.push_back({KvCache::SeqId(10 + i), first, counts[i], int64_t(5 * i)});
    first += counts[i];
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> cuts(const std::vector<int32_t>& counts, int parts) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const MicroBatch& mb : split_micro_batches(slices_of(counts), parts)) out.emplace_back(mb.begin, mb.end);
  return out;
}

using Cuts = std::vector<std::pair<size_t, size_t>>;

TEST(MicroBatches, OnePerRankAtMostBalancedByTokens) {
  EXPECT_EQ(cuts({7}, 2), (Cuts{{0, 1}}));                          // one sequence: the whole step
  EXPECT_EQ(cuts({1, 1, 1, 1}, 1), (Cuts{{0, 4}}));                 // one part
  EXPECT_EQ(cuts({1, 1, 1, 1}, 2), (Cuts{{0, 2}, {2, 4}}));         // decode of four sequences
  EXPECT_EQ(cuts({1, 1, 1, 1}, 3), (Cuts{{0, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(cuts({10, 1, 1}, 2), (Cuts{{0, 1}, {1, 3}}));           // a prefill beside decodes
  EXPECT_EQ(cuts({1, 1, 10}, 2), (Cuts{{0, 2}, {2, 3}}));
  EXPECT_EQ(cuts({1, 1}, 3), (Cuts{{0, 1}, {1, 2}}));               // fewer sequences than ranks
  EXPECT_EQ(cuts({1, 1, 1}, 3), (Cuts{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(cuts({20, 1, 1}, 3), (Cuts{{0, 1}, {1, 2}, {2, 3}}));  // the last parts still get one each
  EXPECT_TRUE(split_micro_batches({}, 2).empty());
}

TEST(MicroBatches, ASmallStepIsNotCut) {
  // Decode of four sequences: 4 tokens, under one micro-batch's minimum.
  EXPECT_EQ(split_micro_batches(slices_of({1, 1, 1, 1}), 2, 32).size(), 1u);
  EXPECT_EQ(split_micro_batches(slices_of({16, 16, 16}), 2, 32).size(), 1u);  // 48 tokens: one of 32 at most
  EXPECT_EQ(split_micro_batches(slices_of({32, 32}), 2, 32).size(), 2u);
  EXPECT_EQ(split_micro_batches(slices_of({64, 64, 64}), 3, 32).size(), 3u);
  EXPECT_EQ(split_micro_batches(slices_of({64, 1, 1}), 3, 32).size(), 2u);  // 66 tokens: two
}

TEST(MicroBatches, EveryCutCoversTheSlicesInOrderWithNoneEmpty) {
  for (int parts = 1; parts <= 5; ++parts)
    for (const std::vector<int32_t>& counts :
         {std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6}, {1, 1, 1, 1, 1}, {100, 1, 1, 1}, {1, 1, 1, 100}, {2, 2}}) {
      const std::vector<MicroBatch> mbs = split_micro_batches(slices_of(counts), parts);
      ASSERT_EQ(mbs.size(), std::min(counts.size(), size_t(parts)));
      size_t at = 0;
      for (const MicroBatch& mb : mbs) {
        EXPECT_EQ(mb.begin, at);
        EXPECT_LT(mb.begin, mb.end);
        at = mb.end;
      }
      EXPECT_EQ(at, counts.size());
    }
}

TEST(MicroBatches, AMicroBatchIsAStepOfItsOwn) {
  const std::vector<SeqSlice> slices = slices_of({2, 3, 1});
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6}, positions = {0, 1, 5, 6, 7, 10};
  const std::vector<int32_t> out_rows = {1, 2, 3, 4, 5};
  const MicroBatchStep st = micro_batch_step(tokens, positions, slices, out_rows, {1, 3});
  EXPECT_EQ(st.tokens, (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(st.positions, (std::vector<int32_t>{5, 6, 7, 10}));
  ASSERT_EQ(st.slices.size(), 2u);
  EXPECT_EQ(st.slices[0].first, 0);
  EXPECT_EQ(st.slices[0].count, 3);
  EXPECT_EQ(st.slices[0].seq, slices[1].seq);
  EXPECT_EQ(st.slices[1].first, 3);
  EXPECT_EQ(st.slices[1].pos0, slices[2].pos0);
  EXPECT_EQ(st.out_rows, (std::vector<int32_t>{0, 1, 2, 3}));
  // No output row in it: empty (the model then ends at its last row).
  EXPECT_TRUE(micro_batch_step(tokens, positions, slices, std::vector<int32_t>{5}, {0, 1}).out_rows.empty());
}

}  // namespace
}  // namespace tessera::detail
