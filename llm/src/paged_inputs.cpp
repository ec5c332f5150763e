// The step's paged-KV inputs (model.h, PagedInputs): slots and the sequence table,
// read from the KV cache's block tables.
#include <algorithm>
#include <bit>
#include <string>

#include "tessera/error.h"
#include "tessera/model.h"

namespace tessera {

namespace {

// One pool's slots and sequence table, over the block tables `table_of` gives.
template <class TableOf>
void fill(std::span<const SeqSlice> slices, int64_t pt, int64_t tokens, int64_t rows, int64_t seqs,
          const TableOf& table_of, std::vector<int32_t>& slots, std::vector<int32_t>& table) {
  slots.assign(size_t(tokens), 0);
  table.assign(size_t(rows * seqs), -1);
  for (size_t i = 0; i < slices.size(); ++i) {
    const SeqSlice& s = slices[i];
    int32_t* col = table.data() + i * size_t(rows);
    col[kSeqFirst] = s.first;
    col[kSeqCount] = s.count;
    col[kSeqPos0] = int32_t(s.pos0);
    const std::vector<int32_t>& bt = table_of(s.seq);
    const size_t need = size_t((s.pos0 + s.count + pt - 1) / pt);
    std::copy(bt.begin(), bt.begin() + ptrdiff_t(need), col + kSeqTableHeader);
    for (int32_t t = 0; t < s.count; ++t) {
      const int64_t pos = s.pos0 + t;
      const int32_t page = bt[size_t(pos / pt)];
      if (page < 0)
        throw Error("internal: position " + std::to_string(pos) + " of sequence " + std::to_string(s.seq) +
                    " is written to a released window page");
      slots[size_t(s.first + t)] = int32_t(int64_t(page) * pt + pos % pt);
    }
  }
  for (size_t i = slices.size(); i < size_t(seqs); ++i) {  // unused columns: no tokens
    int32_t* col = table.data() + i * size_t(rows);
    col[kSeqFirst] = 0;
    col[kSeqCount] = 0;
    col[kSeqPos0] = 0;
  }
}

}  // namespace

PagedInputs make_paged_inputs(const KvCache& kv, std::span<const SeqSlice> slices, PagedBuffers& b,
                              int64_t min_seqs) {
  const int64_t pt = kv.config().page_tokens;
  int64_t tokens = 0, max_pages = 1;
  for (const SeqSlice& s : slices) {
    tokens = std::max<int64_t>(tokens, int64_t(s.first) + s.count);
    max_pages = std::max(max_pages, (s.pos0 + s.count + pt - 1) / pt);
    const size_t need = size_t((s.pos0 + s.count + pt - 1) / pt);
    if (kv.block_table(s.seq).size() < need || kv.reserved(s.seq) < s.pos0 + s.count)
      throw Error("internal: positions of sequence " + std::to_string(s.seq) + " are not reserved");
  }
  // Powers of two: a handful of shapes serve every mix of sequences and lengths.
  const int64_t seqs = int64_t(std::bit_ceil(uint64_t(std::max<int64_t>({int64_t(slices.size()), min_seqs, 1}))));
  const int64_t pages = int64_t(std::bit_ceil(uint64_t(max_pages)));
  const int64_t rows = kSeqTableHeader + pages;
  fill(slices, pt, tokens, rows, seqs, [&](KvCache::SeqId s) -> const auto& { return kv.block_table(s); }, b.slots,
       b.table);
  PagedInputs in{b.slots, b.table, pages, seqs, {}, {}};
  if (kv.config().windowed()) {
    fill(slices, pt, tokens, rows, seqs, [&](KvCache::SeqId s) -> const auto& { return kv.window_block_table(s); },
         b.window_slots, b.window_table);
    in.window_slots = b.window_slots;
    in.window_seq_table = b.window_table;
  }
  return in;
}

}  // namespace tessera
