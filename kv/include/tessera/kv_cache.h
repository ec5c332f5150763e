// Paged KV cache: a pool of fixed-size pages shared by all sequences. A page holds
// `page_tokens` positions of K and V for every layer (F16 rows of n_kv_heads *
// head_dim). Each sequence has a block table (page ids in position order); pages are
// reference-counted so a forked sequence shares its parent's prefix, and a shared page
// is copied before it is written (copy on write).
//
// Bookkeeping and storage are apart: this class keeps page ids, refcounts, block
// tables and the prefix cache on the host; the K/V planes live in Buffers allocated
// by the backend that runs attention (one per layer and K/V), and reach the kernels as
// one storage tensor per layer and K/V (k_storage / v_storage). A forward step hands kernels page ids (the
// slots KvWrite fills, the block tables Attention reads), never rows.
//
// Prefix cache: a full page can be registered under a content key (the engine's hash
// of the page's tokens chained with the previous page's key). A registered page whose
// refcount drops to 0 is kept as a cached page, in least-recently-released order, so a
// later sequence with the same prompt prefix adopts it instead of recomputing it; when
// the free list is empty, the least recently released cached page is evicted (its key
// forgotten) and reused. A registered page is never written: a page about to be
// written loses its key, or is copied if shared.
//
// Sliding-window layers: a layer whose attention sees only the last `window` positions
// keeps its K/V in a second pool (PagePool), with a second block table per sequence.
// reserve() releases that table's pages lying wholly before what any later step can
// read, so those layers hold about window positions per sequence, not the context.
// Full-attention layers keep the first pool and table. Both tables have one entry per
// page of positions; a released window entry is -1.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include <functional>

#include "tessera/backend.h"
#include "tessera/dtype.h"
#include "tessera/kv_access.h"
#include "tessera/page_pool.h"
#include "tessera/tensor.h"
#include "tessera/recurrent_state.h"

namespace tessera {

struct KvCacheConfig {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_tokens = 16;
  int n_pages = 0;  // pool size; capacity = n_pages * page_tokens positions in total
  RecurrentStateConfig recurrent;  // recurrent layers' per-sequence state (none by default)
  // > 0: there are no V planes; a position's V row is the first v_in_k values of its K
  // row (multi-head latent attention caches one latent per token, read as K and as V).
  // Needs n_kv_heads == 1 and v_in_k <= head_dim.
  int v_in_k = 0;
  // > 0: the layers flagged in window_layers (one flag per layer) attend to the last
  // `window` positions only (a query at p sees p - window + 1 .. p) and keep K/V in a
  // pool of n_window_pages. window_slack more positions are kept for rollbacks below
  // the length at the last reserve() (a drafter's rejected tokens).
  int window = 0;
  std::vector<uint8_t> window_layers = {};
  int n_window_pages = 0;
  int window_slack = 0;
  bool windowed() const { return window > 0; }
  bool windowed(int layer) const { return window > 0 && window_layers[size_t(layer)] != 0; }
  int window_layer_count() const {
    return window > 0 ? int(std::count_if(window_layers.begin(), window_layers.end(), [](uint8_t f) { return f != 0; })) : 0;
  }
  // Window pool pages one sequence needs to run steps of up to step_tokens positions.
  int window_pages_per_sequence(int64_t step_tokens) const {
    return int((int64_t(window) - 1 + window_slack + step_tokens + page_tokens - 1) / page_tokens) + 1;
  }
};

// A KvCache is the KvAccess a node names (Node::kv): plugins reach it through the C
// plugin ABI's function table, host code through the members below.
class KvCache : public KvAccess {
 public:
  using SeqId = int32_t;

  // Allocates each layer's K or V storage (`bytes`, 64-byte aligned): by default host
  // memory; the engine passes the attention backend's alloc_buffer.
  using StorageAlloc = std::function<std::unique_ptr<Buffer>(size_t bytes)>;
  explicit KvCache(const KvCacheConfig& cfg, const StorageAlloc& alloc = {});
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The KvCache behind a node's kv (host code only: on the host every KvAccess is one).
  static KvCache& of(KvAccess& kv) { return static_cast<KvCache&>(kv); }

  const KvCacheConfig& config() const { return cfg_; }
  DType type() const { return DType::F16; }
  size_t row_elems() const { return size_t(cfg_.n_kv_heads) * size_t(cfg_.head_dim); }  // of a K row
  size_t v_row_elems() const { return cfg_.v_in_k > 0 ? size_t(cfg_.v_in_k) : row_elems(); }
  // Bytes of KV storage per cached position, all layers.
  size_t bytes_per_token() const;
  // Layer's K/V is in the window pool (a sliding-window layer of a windowed cache).
  bool windowed(int layer) const { return cfg_.windowed(layer); }

  SeqId create_sequence();
  // A new sequence sharing the first `n_tokens` positions of `parent` (all if < 0).
  // With recurrent layers only a fork at the parent's end is possible (their state
  // exists only there); it copies that state.
  SeqId fork_sequence(SeqId parent, int64_t n_tokens = -1);
  void free_sequence(SeqId seq);
  bool has_sequence(SeqId seq) const;

  // Make room for positions [0, n_tokens) of seq: allocates pages, and un-shares the
  // page holding positions >= length (copy on write). Returns false if a pool has too
  // few free pages, changing nothing but the release of window pages no later step
  // reads (which a successful call releases too).
  bool reserve(SeqId seq, int64_t n_tokens);
  // Positions written so far (set by the engine after each forward step; kernels
  // write rows but do not change it).
  int64_t length(SeqId seq) const;
  void set_length(SeqId seq, int64_t n_tokens);
  // Positions [0, reserved) are addressable (k_row / v_row / rows): what the
  // scheduler's run-time check compares a KvWrite's or an Attention's positions with.
  int64_t reserved(SeqId seq) const;
  // Drop positions >= n_tokens (frees whole pages no longer used). With recurrent
  // layers only truncating to 0 (which resets their state) or to the current length
  // is possible; with window layers only to 0 or to where the window's pages are kept
  // (can_truncate).
  void truncate(SeqId seq, int64_t n_tokens);
  // Whether truncate(seq, n_tokens) keeps every position the window layers would read
  // next (always true without window layers; recurrent layers are not considered).
  bool can_truncate(SeqId seq, int64_t n_tokens) const;

  // The recurrent layers' state of a sequence (see recurrent_state.h).
  bool has_recurrent() const { return !recurrent_.empty(); }
  const RecurrentStateConfig& recurrent_config() const { return recurrent_.config(); }
  float* conv_state(int layer, SeqId seq) { return recurrent_.conv(layer, checked(seq)); }
  float* recurrent_state(int layer, SeqId seq) { return recurrent_.state(layer, checked(seq)); }

  // Layer `layer`'s K (V) planes as one tensor F16 [row_elems, page_tokens, n_pages]
  // (page p's position o is row (o, p)), in the storage buffer: what KvWrite writes and
  // Attention reads. data is null when the storage is device memory. With v_in_k the V
  // tensor is a view of the K planes: [v_in_k, page_tokens, n_pages] with K's strides.
  const Tensor& k_storage(int layer) const { return storage_tensors_.at(size_t(layer) * 2); }
  const Tensor& v_storage(int layer) const { return storage_tensors_.at(size_t(layer) * 2 + 1); }
  // The slot (page * page_tokens + offset) of a reserved position of seq.
  int32_t slot(SeqId seq, int64_t pos) const;
  // The K (kv = 0) or V (kv = 1) row of a reserved position copied out of / into the
  // storage, whatever memory it is in (row_elems() / v_row_elems() F16 values).
  void read_row(int layer, SeqId seq, int64_t pos, int kv, uint16_t* out) const;
  void write_row(int layer, SeqId seq, int64_t pos, int kv, const uint16_t* in);

  // F16 row (n_kv_heads * head_dim) of K or V for a reserved position (host storage
  // only: throws when the storage is device memory).
  uint16_t* k_row(int layer, SeqId seq, int64_t pos);
  uint16_t* v_row(int layer, SeqId seq, int64_t pos);
  const uint16_t* k_row(int layer, SeqId seq, int64_t pos) const;
  const uint16_t* v_row(int layer, SeqId seq, int64_t pos) const;

  // The rows of positions [first, first + count) of K (kv = 0) or V (kv = 1), one
  // pointer per position into out: what an attention kernel walks, for one
  // block-table lookup per page instead of a checked call per position.
  void rows(int layer, SeqId seq, int kv, int64_t first, int64_t count, const uint16_t** out) const;

  // The full-attention layers' block table, and the window layers' (same length; -1
  // where a page was released; empty without window layers).
  const std::vector<int32_t>& block_table(SeqId seq) const;
  const std::vector<int32_t>& window_block_table(SeqId seq) const;
  int page_refcount(int32_t page) const;
  int window_page_refcount(int32_t page) const;
  // Pages reserve() can take: the free list plus the cached (evictable) pages.
  int free_pages() const { return pool_.available(); }
  int window_free_pages() const { return window_pool_.available(); }
  // Pages for new positions reserve() can take now: each new position takes a page of
  // every pool.
  int new_position_pages() const {
    return cfg_.windowed() ? std::min(free_pages(), window_free_pages()) : free_pages();
  }
  int total_pages() const { return cfg_.n_pages; }

  // Prefix cache. A key is the engine's hash of a page's tokens chained with the key of
  // the page before it; 0 is never a valid key.
  using PageKey = uint64_t;
  // Registers page `page_index` of seq's block table under `key`, remembering `tokens`
  // (exactly page_tokens ids) to verify lookups. The page must be full:
  // (page_index + 1) * page_tokens <= length(seq). Returns false, changing nothing, if
  // the key is already registered or the page already has a key. Throws on a bad seq,
  // index, token count, key 0 or a page that is not full.
  bool register_page(SeqId seq, size_t page_index, PageKey key, std::span<const int32_t> tokens);
  // The page registered under key whose remembered tokens equal `tokens`, or -1.
  // Does not change the eviction order.
  int32_t find_cached_page(PageKey key, std::span<const int32_t> tokens) const;
  // Appends registered `pages` to seq's block table, taking a reference on each (a
  // cached page leaves the evictable list). seq must end on a page boundary
  // (length == block table size * page_tokens, e.g. a fresh sequence); its length and
  // reservation grow by pages.size() * page_tokens. With window layers the window
  // pool's pages registered under the same keys are adopted too, those the window of
  // the new length reads; throws if one of those is not cached (adoptable_pages).
  void adopt_pages(SeqId seq, std::span<const int32_t> pages);
  // How many of `pages` (registered, in order) seq can adopt: all of them without
  // window layers; with them the longest run whose window pages are all cached.
  size_t adoptable_pages(SeqId seq, std::span<const int32_t> pages) const;
  PageKey page_key(int32_t page) const;  // 0 if the page has none
  int cached_pages() const { return pool_.cached(); }  // registered pages with refcount 0
  int window_cached_pages() const { return window_pool_.cached(); }
  // Forgets every key; cached pages go back to the free list.
  void clear_prefix_cache();
  // Throws an Error naming the first broken invariant: refcounts match the block
  // tables, each page is exactly one of free / cached / in use, the key map matches
  // the pages' keys. For tests.
  void check_invariants() const;

  // Record and replay. A distributed run keeps one cache of the same pool size on every
  // rank; the others replay rank 0's bookkeeping calls in order, so sequence ids, page
  // ids, block tables, prefix-cache keys and recurrent-state copies agree everywhere.
  struct Call {
    enum class Kind : uint8_t { Create, Fork, Free, Reserve, SetLength, Truncate, RegisterPage, AdoptPages, ClearPrefix };
    Kind kind = Kind::Create;
    SeqId seq = -1;             // the sequence (Fork: the parent)
    int64_t n = 0;              // positions (Fork, Reserve, SetLength, Truncate) or page index (RegisterPage)
    PageKey key = 0;            // RegisterPage
    std::vector<int32_t> ids;   // RegisterPage: its tokens; AdoptPages: the pages
    int64_t result = 0;         // Create / Fork: the new sequence; Reserve / RegisterPage: 1 or 0
  };
  // From now on every successful call of create_sequence, fork_sequence, free_sequence,
  // reserve, set_length, truncate, register_page, adopt_pages and clear_prefix_cache is
  // appended to `journal` (null: no longer). The journal must outlive its use.
  void record_calls(std::vector<Call>* journal) { journal_ = journal; }
  // Makes a recorded call. Throws tessera::Error if it fails or returns something else
  // than it did where it was recorded (the caches have diverged).
  void replay(const Call& call);

 private:
  struct Sequence;
  uint16_t* plane(int32_t page, int layer, int kv) const;  // kv: 0 = K, 1 = V (host storage)
  // The page holding layer's rows of a reserved position (throws if released).
  int32_t page_at(const Sequence& s, int layer, int64_t pos, const char* what) const;
  // Copies a page's planes of the layers of one pool (window: the window layers').
  void copy_page(int32_t to, int32_t from, bool window);
  // Releases s's window pages before page index `end` (those not released yet).
  void release_window_pages(Sequence& s, size_t end);
  // The window pages (absolute page indices >= the result) a sequence of length
  // n_tokens must keep.
  size_t first_window_page(int64_t n_tokens) const;
  // Un-shares (copies) or drops the key of one pool's pages [first, end) of a table.
  void prepare_writes(std::vector<int32_t>& table, size_t first, size_t end, bool window);
  // The buffer holding layer's K (kv = 0) or V (kv = 1) planes (V's is K's with v_in_k).
  size_t buffer_index(int layer, int kv) const {
    return cfg_.v_in_k > 0 ? size_t(layer) : size_t(layer) * 2 + size_t(kv);
  }
  void check_page(const PagePool& pool, int32_t page, const char* what) const;
  Sequence& seq_ref(SeqId seq);
  const Sequence& seq_ref(SeqId seq) const;
  SeqId checked(SeqId seq) const { return (void)seq_ref(seq), seq; }

  KvCacheConfig cfg_;
  size_t plane_bytes_ = 0;  // one layer's K (or V) rows of a page
  std::vector<std::unique_ptr<Buffer>> storage_;  // per layer: K, V (K only with v_in_k)
  std::vector<uint8_t*> host_;                    // their data(), null for device memory
  std::vector<Tensor> storage_tensors_;           // per layer: K, V
  PagePool pool_;         // the full-attention layers' pages
  PagePool window_pool_;  // the window layers' pages (empty without them)
  std::vector<std::unique_ptr<Sequence>> seqs_;  // indexed by SeqId, null when freed
  RecurrentState recurrent_;
  std::vector<Call>* journal_ = nullptr;
  int call_depth_ = 0;  // public calls in progress: only the outermost is recorded
  class Recorder;
};

}  // namespace tessera
