// A step cut into micro-batches for --split layers: while one rank runs its layers on a
// micro-batch, the rank before it runs its own on the next one, so the ranks work at
// the same time instead of one after the other (docs/distributed.md). Micro-batches
// are whole sequences: a sequence's tokens attend to each other within a step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/model.h"

namespace tessera::detail {

// Slices [begin, end) of a step.
struct MicroBatch {
  size_t begin = 0, end = 0;
};

// Each micro-batch reads every weight of a rank's layers again, so a step is cut only
// where its products are bound by arithmetic rather than by reading the weights: at
// least this many tokens a micro-batch (decision 147).
inline constexpr int64_t kMinMicroBatchTokens = 32;

// At most `parts` micro-batches, and no more than one per `min_tokens` tokens of the
// step or one per slice: contiguous and in order, none empty, each with about the same
// number of tokens.
std::vector<MicroBatch> split_micro_batches(std::span<const SeqSlice> slices, int parts, int64_t min_tokens = 1);

// One micro-batch as a step of its own: its tokens, positions and slices (rows from 0),
// and the step's output rows that fall in it, renumbered (empty when none does).
struct MicroBatchStep {
  std::vector<int32_t> tokens, positions, out_rows;
  std::vector<SeqSlice> slices;
};
MicroBatchStep micro_batch_step(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                std::span<const SeqSlice> slices, std::span<const int32_t> out_rows, MicroBatch mb);

}  // namespace tessera::detail
