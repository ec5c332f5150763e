// The compute graph of one forward step: tensors plus a sequence of nodes executed
// in order. The model builds it, the Scheduler places each node on a backend, and a
// backend executes runs of consecutive nodes (a GPU backend records them into one
// submission). Intermediate tensors live in the graph's host scratch arena.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

namespace tessera {

struct KvAccess;

// Every op the forward passes need. Shapes are in ggml order ([ne0, ne1, ...]).
enum class Op : uint16_t {
  GetRows,    // src0 table [K, V] any dtype, src1 ids I32 [n] -> F32 [K, n]
  RmsNorm,    // src0 x F32 [K, n], optional src1 weight F32 [K]; f[0] = eps -> F32 [K, n]
  MatMul,     // src0 weight [K, N] any dtype, src1 x F32 [K, M] -> F32 [N, M]
  Rope,       // src0 x F32 [hd, heads, n], src1 pos I32 [n], optional src2 frequency factors
              // F32 [n_dims/2] (Llama 3.1: pair i's angle is divided by factor i); i[0] = n_dims,
              // i[1] = mode (RopeMode), f[0] = freq_base, f[1] = freq_scale; YaRN when f[2]
              // (ext_factor) != 0: f[3] = attn_factor, i[6], i[7] = the correction dimensions
              // (rope_table.h) -> F32 same shape
  KvWrite,    // src0 x F32 [hd, n_kv, n], src1 slots I32 [n] -> dst: one layer's K or V
              // storage F16 [n_kv*hd, page_tokens, n_pages] (KvCache::k_storage), written in
              // place: token t's row, rounded to F16, goes to slot slots[t] (= page *
              // page_tokens + offset in the page)
  Attention,  // src0 q F32 [hd, n_head, n], src1 K storage and src2 V storage of one layer (as
              // KvWrite's dst), src3 sequence table I32 [kSeqTableHeader + P, S]: column s is
              // sequence s's first token row, token count and position of its first token,
              // then its block table (page ids; unused columns have count 0). Token row
              // first+j attends causally to positions [0, pos0 + j] through the block table;
              // f[0] = scale; i[0] = sliding window w (0: none): row first+j then sees only
              // positions [pos0 + j - w + 1, pos0 + j], and block-table entries of pages wholly
              // before the first position any row sees may be -1 (released); optional src4
              // sinks F32 [n_head]: head h's logit joins the softmax's maximum and denominator
              // (unscaled, no value) -> F32 [dv, n_head, n]. V's rows hold the same KV heads
              // as K's with dv values each (dv = hd except in multi-head latent attention, whose
              // V storage is a view of the first dv values of each K row: same pages, strides)
  Softmax,    // src0 F32 rows -> F32 rows
  Silu,       // src0 F32 -> F32
  SwiGlu,     // src0 gate F32, src1 up F32 (same shape) -> silu(gate) * up
  Add,        // src0 + src1, same shape
  Mul,        // src0 * src1, same shape or src1 one row broadcast over rows
  Argmax,     // src0 F32 [V, n] -> I32 [n]
  // Mixture of experts (router, expert products, weighted sum):
  TopK,       // src0 F32 [E, n] -> I32 [k, n]: ids of the k largest values of each row,
              // largest first, lowest id on ties (k = dst.ne[0])
  GatherCols, // src0 F32 [E, n], src1 ids I32 [k, n] -> F32 [k, n]: dst[j, t] = src0[ids[j, t], t]
  MatMulId,   // src0 weights [K, N, E], src1 x F32 [K, b, n] (b = 1: one row shared by
              // every chosen expert, or b = k), src2 ids I32 [k, n] -> F32 [N, k, n]:
              // dst[:, j, t] = W[ids[j, t]] . x[:, j % b, t] (activations as in MatMul).
              // i[1] > 0: only experts [i[0], i[1]) are computed; a slot whose id lies
              // outside that range gets a zero row (the experts another rank holds)
  MoeCombine, // src0 experts F32 [N, k, n], src1 weights F32 [k, n] -> F32 [N, n]:
              // sum over j in order of weights[j, t] * experts[:, j, t]
  // Gates and layout:
  Sigmoid,    // src0 F32 -> F32: 1 / (1 + exp(-x))
  Softplus,   // src0 F32 -> F32: log(1 + exp(x)); x > 20 passes through (the reference's cutoff)
  Cont,       // src0 F32 with any strides (a Graph::view) -> the same values, contiguous
  // Gated delta-net (linear attention with a recurrent state per sequence, kept in
  // the KV cache's RecurrentState; i[0] = recurrent layer, i[1] = sequence):
  SsmConv,    // src0 x F32 [C, n], src1 kernel F32 [d_conv, C] -> F32 [C, n]: causal depthwise
              // convolution over the sequence's conv state (its last d_conv-1 inputs) followed by
              // x; afterwards the state holds the last d_conv-1 inputs
  GatedDeltaNet,  // src0 qkv F32 [2*Hk*S + Hv*S, n] (q heads, k heads, v heads), src1 g F32
              // [Hv, n] (log decay), src2 beta F32 [Hv, n] -> F32 [S, Hv, n]; i[2] = Hk, i[3] = S,
              // f[0] = L2-norm eps. q and k are L2-normalized per head, value head h reads key
              // head h % Hk; per token: state *= exp(g); d = beta (v - state k); state += k d^T;
              // out = state q / sqrt(S)
  // Appended with the gemma3 and glm4moe families:
  GeGlu,      // src0 gate F32, src1 up F32 (same shape) -> gelu(gate) * up, GELU's tanh form
  NormalizeRows,  // src0 F32 [k, n] -> F32 [k, n]: each row divided by max(its sum, f[1]), then
              // times f[0] (a router's chosen weights normalised and scaled)
  SwiGluOai,  // src0 gate F32, src1 up F32 (same shape) -> gpt-oss's clamped SwiGLU: with
              // g = min(gate, f[1]), u = clamp(up, -f[1], f[1]): g / (1 + exp(-f[0] g)) * (u + 1)
  // Appended with the deepseek2 family:
  Concat,     // src0 F32 [a, r1, r2], src1 F32 [b, r1, r2] -> F32 [a + b, r1, r2]: each row of
              // src0 followed by the same row of src1
  GroupLimit, // src0 F32 [E, n] -> F32 [E, n]: the E values of a row form i[0] groups of E / i[0];
              // a group's score is the sum of its two largest values (one value: that value);
              // the i[1] groups of highest score are kept (lower group first on ties), every
              // value of the other groups becomes -infinity (routing by expert groups)
  Count
};
std::string_view op_name(Op op);

// Rope modes (ggml's values). kRopeImrope is Qwen3.5's interleaved multi-section RoPE:
// pairs take the position of their section (i[2..5] = sections t, h, w, e); for text
// the t, h and w positions are the token position and e is 0. Pairs rotate NeoX-style.
enum RopeMode : int32_t { kRopeNormal = 0, kRopeNeox = 2, kRopeImrope = 40 };

// Attention's sequence table: the rows of each column before its block table.
enum SeqTableRow : int32_t { kSeqFirst = 0, kSeqCount = 1, kSeqPos0 = 2, kSeqTableHeader = 3 };

struct Node {
  Op op = Op::Count;
  int32_t dst = -1;                           // tensor index, -1 for none
  std::array<int32_t, 5> src{-1, -1, -1, -1, -1};  // tensor indices, -1 for unused
  std::array<int32_t, 8> i{};                 // integer parameters (see Op)
  std::array<float, 4> f{};                   // float parameters (see Op)
  KvAccess* kv = nullptr;                     // SsmConv, GatedDeltaNet (a KvCache)
};

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Forget all nodes and tensors but keep the scratch arena's memory for reuse.
  void reset();

  // A tensor whose storage already exists (weights, caller-owned inputs).
  int32_t add_tensor(const Tensor& t);
  // A new contiguous tensor in the graph's scratch arena (64-byte aligned).
  int32_t new_tensor(DType type, std::initializer_list<int64_t> shape, std::string_view name = {});
  // A contiguous reshape of tensor `src` sharing its storage (same element count).
  int32_t reshape(int32_t src, std::initializer_list<int64_t> shape);
  // Rows [first, first+count) of a contiguous 2-D tensor, sharing its storage.
  int32_t view_rows(int32_t src, int64_t first, int64_t count);
  // A strided view of tensor `src` sharing its storage: shape `ne`, byte strides
  // nb[1..3] (nb[0] is the element size), starting `offset` bytes into src. Throws if
  // the view reaches outside src. Ops that need contiguous rows read it through Cont.
  int32_t view(int32_t src, std::array<int64_t, 4> ne, std::array<size_t, 3> nb, size_t offset);
  int32_t add_node(const Node& n);

  // Identity while this graph lives (never reused within a process), and a count that
  // changes whenever tensors or nodes are added, the graph is reset or allocated: what
  // a plugin may key a cache of the graph's structure on (plugin_abi.h).
  uint64_t id() const { return id_; }
  uint64_t generation() const { return generation_; }

  Tensor& tensor(int32_t i) { return tensors_[size_t(i)]; }
  const Tensor& tensor(int32_t i) const { return tensors_[size_t(i)]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  // For passes over a built graph that change a node's parameters, before allocate()
  // (which is when backends and plan caches look at the nodes).
  Node& node(size_t i) { return nodes_.at(i); }
  size_t tensor_count() const { return tensors_.size(); }

  // Size the arena for everything new_tensor() returned since reset(); call once
  // after building and before executing (addresses are fixed from then on).
  void allocate();

  // Memory plan. Off (the default): allocate() gives every new_tensor() its own range
  // of the arena, so every intermediate can be read after execution (tests and
  // conformance rely on this). On: allocate() plans like ggml-alloc, so scratch
  // tensors whose lifetimes do not overlap share memory, and after execution only the
  // tensors passed to mark_output() (and whatever shares their storage) are still
  // valid. The flag persists across reset().
  //
  // Lifetimes are per storage root: new_tensor() creates a root; reshape(), view_rows()
  // and view() share their source's root. A root lives from the first node that names
  // any tensor of it (as dst or src) to the last such node; a root read before any node
  // writes it lives from node 0; outputs and roots no node names live to the end. A
  // root's range is reusable only from node last + window on, `window` being the most
  // consecutive nodes a backend of the step computes as one (Backend::fusion_window;
  // 1: node by node). So no node's dst overlaps what any node of its window read, nor
  // a src of another root, nor any root alive at that node. Blocks are 64-byte aligned
  // and placed best fit in a free list (neighbours merge on free), growing the end when
  // nothing fits.
  void set_memory_reuse(bool on, int32_t window = 1);
  bool memory_reuse() const { return reuse_; }
  int32_t reuse_window() const { return reuse_window_; }
  // The caller reads `tensor` after execution: with reuse on its storage lives to the
  // end of the graph. Cleared by reset().
  void mark_output(int32_t tensor);
  // Bytes of arena the last allocate() needed (0 before the first allocate(); reset()
  // leaves it).
  size_t scratch_bytes() const { return scratch_bytes_; }
  // The storage root of `tensor` (a tensor index), or -1 for a tensor that is not in
  // the scratch arena (add_tensor() and views of it).
  int32_t storage_root(int32_t tensor) const { return roots_.at(size_t(tensor)); }

  // Host work that must happen between two nodes, e.g. making the experts a MatMulId
  // will read resident once the router's choice is known (expert_stream.h): the
  // scheduler calls hook(graph) after every node before `node` has run and before
  // `node` runs (so a run of one backend's nodes is split there). Cleared by reset().
  using HostHook = std::function<void(Graph&)>;
  void add_host_hook(size_t node, HostHook hook) { hooks_.emplace_back(node, std::move(hook)); }
  const std::vector<std::pair<size_t, HostHook>>& host_hooks() const { return hooks_; }

 private:
  struct Arena;
  void plan_reuse();  // fills plan_offsets_ and scratch_bytes_ (reuse on)

  std::vector<Tensor> tensors_;
  std::vector<size_t> scratch_offsets_;  // per tensor: root's offset without reuse, or SIZE_MAX
  std::vector<size_t> view_offsets_;     // per tensor: byte offset into its storage
  std::vector<int32_t> roots_;           // per tensor: storage root, -1 outside the arena
  std::vector<int32_t> outputs_;         // mark_output() since reset()
  std::vector<Node> nodes_;
  std::vector<std::pair<size_t, HostHook>> hooks_;
  std::unique_ptr<Arena> arena_;
  size_t linear_bytes_ = 0;   // arena bytes without reuse (sum of every root's block)
  size_t scratch_bytes_ = 0;  // bytes the last allocate() needed
  bool reuse_ = false;
  int32_t reuse_window_ = 1;
  uint64_t id_ = 0;
  uint64_t generation_ = 0;
  // Work arrays of plan_reuse(), kept so a step allocates nothing once warm.
  struct FreeBlock {
    size_t offset, size;
  };
  std::vector<int32_t> first_, last_;      // per tensor (roots only): first/last node, -1 none
  std::vector<int32_t> alloc_head_, free_head_, alloc_next_, free_next_;
  std::vector<size_t> plan_offsets_;       // per tensor (roots only): offset with reuse
  std::vector<FreeBlock> free_blocks_;     // sorted by offset, never adjacent
};

// "node K (op -> 'dst name')": how backends name a node in their error messages.
std::string describe_node(const Graph& graph, size_t index);

}  // namespace tessera
