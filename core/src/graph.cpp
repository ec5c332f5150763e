#include "tessera/graph.h"

#include <atomic>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "tessera/error.h"

namespace tessera {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::GetRows: return "get_rows";
    case Op::RmsNorm: return "rms_norm";
    case Op::MatMul: return "mat_mul";
    case Op::Rope: return "rope";
    case Op::KvWrite: return "kv_write";
    case Op::Attention: return "attention";
    case Op::Softmax: return "softmax";
    case Op::Silu: return "silu";
    case Op::SwiGlu: return "swiglu";
    case Op::Add: return "add";
    case Op::Mul: return "mul";
    case Op::Argmax: return "argmax";
    case Op::TopK: return "top_k";
    case Op::GatherCols: return "gather_cols";
    case Op::MatMulId: return "mat_mul_id";
    case Op::MoeCombine: return "moe_combine";
    case Op::Sigmoid: return "sigmoid";
    case Op::Softplus: return "softplus";
    case Op::Cont: return "cont";
    case Op::SsmConv: return "ssm_conv";
    case Op::GatedDeltaNet: return "gated_delta_net";
    case Op::GeGlu: return "geglu";
    case Op::NormalizeRows: return "normalize_rows";
    case Op::SwiGluOai: return "swiglu_oai";
    case Op::Concat: return "concat";
    case Op::GroupLimit: return "group_limit";
    case Op::Count: break;
  }
  return "unknown";
}

// Scratch memory reused across steps: grows, never shrinks, 64-byte aligned.
struct Graph::Arena {
  void* ptr = nullptr;
  size_t capacity = 0;
  ~Arena() { std::free(ptr); }
  void ensure(size_t bytes) {
    if (bytes <= capacity) return;
    std::free(ptr);
    size_t cap = (bytes + 63) / 64 * 64;
    ptr = std::aligned_alloc(64, cap);
    if (!ptr) throw std::bad_alloc();
    capacity = cap;
  }
};

Graph::Graph() : arena_(std::make_unique<Arena>()) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1, std::memory_order_relaxed);
}
Graph::~Graph() = default;

void Graph::reset() {
  ++generation_;
  tensors_.clear();
  scratch_offsets_.clear();
  view_offsets_.clear();
  roots_.clear();
  outputs_.clear();
  nodes_.clear();
  hooks_.clear();
  linear_bytes_ = 0;
}

int32_t Graph::add_tensor(const Tensor& t) {
  ++generation_;
  tensors_.push_back(t);
  scratch_offsets_.push_back(SIZE_MAX);
  view_offsets_.push_back(0);
  roots_.push_back(-1);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::new_tensor(DType type, std::initializer_list<int64_t> shape, std::string_view name) {
  ++generation_;
  Tensor t = Tensor::contiguous(type, shape);
  t.name = std::string(name);
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(linear_bytes_);
  view_offsets_.push_back(0);
  roots_.push_back(int32_t(tensors_.size() - 1));
  linear_bytes_ += (tensors_.back().nbytes() + 63) / 64 * 64;
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::reshape(int32_t src, std::initializer_list<int64_t> shape) {
  ++generation_;
  const Tensor& s = tensors_.at(size_t(src));
  if (!s.is_contiguous()) throw Error("reshape of a non-contiguous tensor");
  Tensor t = Tensor::contiguous(s.type, shape);
  if (t.nelements() != s.nelements()) throw Error("reshape changes the element count");
  t.data = s.data;
  t.name = s.name;
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(scratch_offsets_[size_t(src)]);
  view_offsets_.push_back(view_offsets_[size_t(src)]);
  roots_.push_back(roots_[size_t(src)]);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::view_rows(int32_t src, int64_t first, int64_t count) {
  ++generation_;
  const Tensor& s = tensors_.at(size_t(src));
  if (s.ne[2] != 1 || s.ne[3] != 1 || first < 0 || count <= 0 || first + count > s.ne[1])
    throw Error("row view out of range");
  Tensor t = s;
  t.ne[1] = count;
  for (int i = 2; i < Tensor::kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * size_t(t.ne[i - 1]);
  size_t off = view_offsets_[size_t(src)] + size_t(first) * s.nb[1];
  if (s.data) t.data = static_cast<char*>(s.data) + size_t(first) * s.nb[1];
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(scratch_offsets_[size_t(src)]);
  view_offsets_.push_back(off);
  roots_.push_back(roots_[size_t(src)]);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::view(int32_t src, std::array<int64_t, 4> ne, std::array<size_t, 3> nb, size_t offset) {
  ++generation_;
  const Tensor& s = tensors_.at(size_t(src));
  if (dtype_traits(s.type).block_elems != 1) throw Error("view of a block-quantized tensor");
  const size_t esize = dtype_traits(s.type).block_bytes;
  size_t last = offset + esize;  // one past the last byte the view touches
  for (int d = 0; d < Tensor::kMaxDims; ++d) {
    if (ne[size_t(d)] <= 0) throw Error("view with an empty dimension");
    last += size_t(ne[size_t(d)] - 1) * (d == 0 ? esize : nb[size_t(d) - 1]);
  }
  if (last > s.nbytes()) throw Error("view reaches outside its source tensor");
  Tensor t = s;
  for (int d = 0; d < Tensor::kMaxDims; ++d) t.ne[d] = ne[size_t(d)];
  t.nb[0] = esize;
  for (int d = 1; d < Tensor::kMaxDims; ++d) t.nb[d] = nb[size_t(d) - 1];
  if (s.data) t.data = static_cast<char*>(s.data) + offset;
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(scratch_offsets_[size_t(src)]);
  view_offsets_.push_back(view_offsets_[size_t(src)] + offset);
  roots_.push_back(roots_[size_t(src)]);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::add_node(const Node& n) {
  ++generation_;
  auto valid = [&](int32_t i) { return i >= -1 && i < int32_t(tensors_.size()); };
  if (!valid(n.dst)) throw Error("graph node refers to an unknown destination tensor");
  for (int32_t s : n.src)
    if (!valid(s)) throw Error("graph node refers to an unknown source tensor");
  nodes_.push_back(n);
  return int32_t(nodes_.size() - 1);
}

void Graph::set_memory_reuse(bool on, int32_t window) {
  if (window < 1) throw Error("internal: a memory-reuse window of " + std::to_string(window) + " nodes (at least 1)");
  reuse_ = on;
  reuse_window_ = window;
}

void Graph::mark_output(int32_t tensor) {
  if (tensor < 0 || size_t(tensor) >= tensors_.size()) throw Error("mark_output of an unknown tensor");
  outputs_.push_back(tensor);
}

void Graph::allocate() {
  ++generation_;
  if (reuse_)
    plan_reuse();
  else
    scratch_bytes_ = linear_bytes_;
  arena_->ensure(scratch_bytes_);
  auto* base = static_cast<char*>(arena_->ptr);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const int32_t r = roots_[i];
    if (r < 0) continue;
    const size_t off = reuse_ ? plan_offsets_[size_t(r)] : scratch_offsets_[i];
    tensors_[i].data = base + off + view_offsets_[i];
  }
}

// Liveness plan (see graph.h). One pass over the nodes finds each root's first and
// last node; roots are bucketed (intrusive lists) by the node where they are placed
// and the node where their range is released, so the walk is O(nodes + tensors) apart
// from the free-list search.
void Graph::plan_reuse() {
  constexpr int32_t kForever = INT32_MAX;
  const size_t T = tensors_.size(), N = nodes_.size();
  first_.assign(T, -1);
  last_.assign(T, -1);
  auto touch = [&](int32_t t, int32_t k, bool write) {
    if (t < 0) return;
    const int32_t r = roots_[size_t(t)];
    if (r < 0) return;
    if (first_[size_t(r)] < 0) first_[size_t(r)] = write ? k : 0;  // read before written: from node 0
    if (last_[size_t(r)] != kForever) last_[size_t(r)] = k;
  };
  for (size_t k = 0; k < N; ++k) {
    const Node& n = nodes_[k];
    for (int32_t s : n.src) touch(s, int32_t(k), false);  // sources first: an in-place node reads
    touch(n.dst, int32_t(k), true);
  }
  for (int32_t o : outputs_) {
    const int32_t r = roots_[size_t(o)];
    if (r < 0) continue;
    if (first_[size_t(r)] < 0) first_[size_t(r)] = 0;
    last_[size_t(r)] = kForever;
  }

  const size_t steps = std::max<size_t>(N, 1);
  alloc_head_.assign(steps, -1);
  free_head_.assign(steps, -1);
  alloc_next_.assign(T, -1);
  free_next_.assign(T, -1);
  plan_offsets_.assign(T, SIZE_MAX);
  for (size_t i = T; i-- > 0;) {  // backwards so every list is in tensor order
    if (roots_[i] != int32_t(i)) continue;
    if (first_[i] < 0) {  // no node names it: keep it for the whole graph
      first_[i] = 0;
      last_[i] = kForever;
    }
    alloc_next_[i] = alloc_head_[size_t(first_[i])];
    alloc_head_[size_t(first_[i])] = int32_t(i);
    if (last_[i] != kForever) {
      const size_t release = size_t(last_[i]) + size_t(reuse_window_);
      if (release < steps) {
        free_next_[i] = free_head_[release];
        free_head_[release] = int32_t(i);
      }
    }
  }

  free_blocks_.clear();
  size_t end = 0, peak = 0;
  auto block_size = [&](size_t r) { return std::max<size_t>((tensors_[r].nbytes() + 63) / 64 * 64, 64); };
  auto take = [&](size_t size) {
    size_t best = SIZE_MAX;
    for (size_t b = 0; b < free_blocks_.size(); ++b) {
      const size_t s = free_blocks_[b].size;
      if (s >= size && (best == SIZE_MAX || s < free_blocks_[best].size)) {
        best = b;
        if (s == size) break;
      }
    }
    if (best == SIZE_MAX) {  // nothing fits: grow the end
      const size_t off = end;
      end += size;
      peak = std::max(peak, end);
      return off;
    }
    FreeBlock& fb = free_blocks_[best];
    const size_t off = fb.offset;
    if (fb.size == size) {
      free_blocks_.erase(free_blocks_.begin() + std::ptrdiff_t(best));
    } else {
      fb.offset += size;
      fb.size -= size;
    }
    return off;
  };
  auto give = [&](size_t off, size_t size) {
    auto it = std::lower_bound(free_blocks_.begin(), free_blocks_.end(), off,
                               [](const FreeBlock& b, size_t o) { return b.offset < o; });
    if (it != free_blocks_.begin() && std::prev(it)->offset + std::prev(it)->size == off) {
      --it;  // merge into the block below
      it->size += size;
    } else {
      it = free_blocks_.insert(it, FreeBlock{off, size});
    }
    auto next = std::next(it);
    if (next != free_blocks_.end() && it->offset + it->size == next->offset) {
      it->size += next->size;
      free_blocks_.erase(next);
    }
    if (it->offset + it->size == end) {  // the top of the arena: lower the end instead
      end = it->offset;
      free_blocks_.erase(it);
    }
  };

  for (size_t k = 0; k < steps; ++k) {
    for (int32_t r = free_head_[k]; r >= 0; r = free_next_[size_t(r)])
      give(plan_offsets_[size_t(r)], block_size(size_t(r)));
    for (int32_t r = alloc_head_[k]; r >= 0; r = alloc_next_[size_t(r)])
      plan_offsets_[size_t(r)] = take(block_size(size_t(r)));
  }
  scratch_bytes_ = peak;
}

std::string describe_node(const Graph& g, size_t k) {
  const Node& n = g.nodes().at(k);
  std::string s = "node " + std::to_string(k) + " (" + std::string(op_name(n.op));
  if (n.dst >= 0 && size_t(n.dst) < g.tensor_count() && !g.tensor(n.dst).name.empty())
    s += " -> '" + g.tensor(n.dst).name + "'";
  return s + ")";
}

}  // namespace tessera
