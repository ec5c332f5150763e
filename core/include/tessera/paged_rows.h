// Host addresses inside a KV storage tensor (Op::KvWrite's dst, Op::Attention's src1 and
// src2: F16 [row_elems, page_tokens, n_pages]) for backends that read it in place.
// Header-only, so a plugin compiles it in.
#pragma once
#include <cstdint>

#include "tessera/graph.h"

namespace tessera {

// The row of slot `slot` (page * page_tokens + offset).
inline uint16_t* storage_row(const Tensor& storage, int64_t slot) {
  const int64_t pt = storage.ne[1];
  return storage.row<uint16_t>(slot % pt, slot / pt);
}

// Row pointers of positions [0, n) of the sequence whose sequence-table column is `col`
// (its block table starts at col[kSeqTableHeader]), into out[0 .. n). Positions before
// `first` (outside a sliding window: their pages may be released) are left null.
inline void sequence_rows(const Tensor& storage, const int32_t* col, int64_t n, const uint16_t** out,
                          int64_t first = 0) {
  const int64_t pt = storage.ne[1];
  for (int64_t pos = 0; pos < first && pos < n; ++pos) *out++ = nullptr;
  for (int64_t pos = first; pos < n;) {
    const int64_t page = col[kSeqTableHeader + pos / pt], end = pos / pt * pt + pt < n ? pos / pt * pt + pt : n;
    for (; pos < end; ++pos) *out++ = storage.row<uint16_t>(pos % pt, page);
  }
}

}  // namespace tessera
