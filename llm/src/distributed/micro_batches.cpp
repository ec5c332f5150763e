#include "distributed/micro_batches.h"

#include <algorithm>

namespace tessera::detail {

std::vector<MicroBatch> split_micro_batches(std::span<const SeqSlice> slices, int parts, int64_t min_tokens) {
  std::vector<MicroBatch> out;
  if (slices.empty()) return out;
  int64_t total = 0;
  for (const SeqSlice& s : slices) total += s.count;
  const int64_t by_tokens = std::max<int64_t>(1, total / std::max<int64_t>(min_tokens, 1));
  const size_t n = size_t(std::min<int64_t>({int64_t(slices.size()), std::max(parts, 1), by_tokens}));
  size_t begin = 0;
  int64_t done = 0;  // tokens up to and with slice i
  for (size_t i = 0; i + 1 < slices.size() && out.size() + 1 < n; ++i) {
    done += slices[i].count;
    const size_t k = out.size() + 1;               // cutting after slice i ends micro-batch k
    const size_t left = slices.size() - (i + 1);  // slices after it
    const size_t still = n - k;                   // micro-batches still to fill
    // Cut once k n-ths of the tokens are in, or when every later slice must start a
    // micro-batch of its own.
    if (left >= still && (done * int64_t(n) >= total * int64_t(k) || left == still)) {
      out.push_back({begin, i + 1});
      begin = i + 1;
    }
  }
  out.push_back({begin, slices.size()});
  return out;
}

MicroBatchStep micro_batch_step(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                std::span<const SeqSlice> slices, std::span<const int32_t> out_rows, MicroBatch mb) {
  MicroBatchStep st;
  const int32_t row0 = slices[mb.begin].first;
  const int32_t row_end = slices[mb.end - 1].first + slices[mb.end - 1].count;
  st.tokens.assign(tokens.begin() + row0, tokens.begin() + row_end);
  st.positions.assign(positions.begin() + row0, positions.begin() + row_end);
  for (size_t i = mb.begin; i < mb.end; ++i) {
    SeqSlice s = slices[i];
    s.first -= row0;
    st.slices.push_back(s);
  }
  for (int32_t r : out_rows)
    if (r >= row0 && r < row_end) st.out_rows.push_back(r - row0);
  return st;
}

}  // namespace tessera::detail
