// Paged KV cache: a pool of fixed-size pages shared by all sequences. A page holds
// `page_tokens` positions of K and V for every layer (F16, 64-byte aligned rows of
// n_kv_heads * head_dim). Each sequence has a block table (page ids in position
// order); pages are reference-counted so a forked sequence shares its parent's
// prefix, and a shared page is copied before it is written (copy on write).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/recurrent_state.h"

namespace tessera {

struct KvCacheConfig {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_tokens = 16;
  int n_pages = 0;  // pool size; capacity = n_pages * page_tokens positions in total
  RecurrentStateConfig recurrent;  // recurrent layers' per-sequence state (none by default)
};

class KvCache {
 public:
  using SeqId = int32_t;

  explicit KvCache(const KvCacheConfig& cfg);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return cfg_; }
  DType type() const { return DType::F16; }
  size_t row_elems() const { return size_t(cfg_.n_kv_heads) * size_t(cfg_.head_dim); }

  SeqId create_sequence();
  // A new sequence sharing the first `n_tokens` positions of `parent` (all if < 0).
  // With recurrent layers only a fork at the parent's end is possible (their state
  // exists only there); it copies that state.
  SeqId fork_sequence(SeqId parent, int64_t n_tokens = -1);
  void free_sequence(SeqId seq);
  bool has_sequence(SeqId seq) const;

  // Make room for positions [0, n_tokens) of seq: allocates pages, and un-shares the
  // page holding positions >= length (copy on write). Returns false (changing
  // nothing) if the pool has too few free pages.
  bool reserve(SeqId seq, int64_t n_tokens);
  // Positions written so far (set by the writer after a KvWrite).
  int64_t length(SeqId seq) const;
  void set_length(SeqId seq, int64_t n_tokens);
  // Drop positions >= n_tokens (frees whole pages no longer used). With recurrent
  // layers only truncating to 0 (which resets their state) or to the current length
  // is possible.
  void truncate(SeqId seq, int64_t n_tokens);

  // The recurrent layers' state of a sequence (see recurrent_state.h).
  bool has_recurrent() const { return !recurrent_.empty(); }
  const RecurrentStateConfig& recurrent_config() const { return recurrent_.config(); }
  float* conv_state(int layer, SeqId seq) { return recurrent_.conv(layer, checked(seq)); }
  float* recurrent_state(int layer, SeqId seq) { return recurrent_.state(layer, checked(seq)); }

  // F16 row (n_kv_heads * head_dim) of K or V for a reserved position.
  uint16_t* k_row(int layer, SeqId seq, int64_t pos);
  uint16_t* v_row(int layer, SeqId seq, int64_t pos);
  const uint16_t* k_row(int layer, SeqId seq, int64_t pos) const;
  const uint16_t* v_row(int layer, SeqId seq, int64_t pos) const;

  // The rows of positions [first, first + count) of K (kv = 0) or V (kv = 1), one
  // pointer per position into out: what an attention kernel walks, for one
  // block-table lookup per page instead of a checked call per position.
  void rows(int layer, SeqId seq, int kv, int64_t first, int64_t count, const uint16_t** out) const;

  const std::vector<int32_t>& block_table(SeqId seq) const;
  int page_refcount(int32_t page) const;
  int free_pages() const;
  int total_pages() const { return cfg_.n_pages; }

 private:
  struct Sequence;
  uint16_t* plane(int32_t page, int layer, int kv) const;  // kv: 0 = K, 1 = V
  int32_t take_page();
  void release_page(int32_t page);
  Sequence& seq_ref(SeqId seq);
  const Sequence& seq_ref(SeqId seq) const;
  SeqId checked(SeqId seq) const { return (void)seq_ref(seq), seq; }

  KvCacheConfig cfg_;
  size_t page_bytes_ = 0;   // one page: all layers, K and V
  size_t plane_bytes_ = 0;  // one layer's K (or V) plane in a page
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> storage_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_list_;
  std::vector<std::unique_ptr<Sequence>> seqs_;  // indexed by SeqId, null when freed
  RecurrentState recurrent_;
};

}  // namespace tessera
