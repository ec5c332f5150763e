#include "tessera/graph.h"

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

Graph::Graph() : arena_(std::make_unique<Arena>()) {}
Graph::~Graph() = default;

void Graph::reset() {
  tensors_.clear();
  scratch_offsets_.clear();
  view_offsets_.clear();
  nodes_.clear();
  scratch_bytes_ = 0;
}

int32_t Graph::add_tensor(const Tensor& t) {
  tensors_.push_back(t);
  scratch_offsets_.push_back(SIZE_MAX);
  view_offsets_.push_back(0);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::new_tensor(DType type, std::initializer_list<int64_t> shape, std::string_view name) {
  Tensor t = Tensor::contiguous(type, shape);
  t.name = std::string(name);
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(scratch_bytes_);
  view_offsets_.push_back(0);
  scratch_bytes_ += (tensors_.back().nbytes() + 63) / 64 * 64;
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::reshape(int32_t src, std::initializer_list<int64_t> shape) {
  const Tensor& s = tensors_.at(size_t(src));
  if (!s.is_contiguous()) throw Error("reshape of a non-contiguous tensor");
  Tensor t = Tensor::contiguous(s.type, shape);
  if (t.nelements() != s.nelements()) throw Error("reshape changes the element count");
  t.data = s.data;
  t.name = s.name;
  tensors_.push_back(std::move(t));
  scratch_offsets_.push_back(scratch_offsets_[size_t(src)]);
  view_offsets_.push_back(view_offsets_[size_t(src)]);
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::view_rows(int32_t src, int64_t first, int64_t count) {
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
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::view(int32_t src, std::array<int64_t, 4> ne, std::array<size_t, 3> nb, size_t offset) {
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
  return int32_t(tensors_.size() - 1);
}

int32_t Graph::add_node(const Node& n) {
  auto valid = [&](int32_t i) { return i >= -1 && i < int32_t(tensors_.size()); };
  if (!valid(n.dst)) throw Error("graph node refers to an unknown destination tensor");
  for (int32_t s : n.src)
    if (!valid(s)) throw Error("graph node refers to an unknown source tensor");
  nodes_.push_back(n);
  return int32_t(nodes_.size() - 1);
}

void Graph::allocate() {
  arena_->ensure(scratch_bytes_);
  auto* base = static_cast<char*>(arena_->ptr);
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (scratch_offsets_[i] != SIZE_MAX)
      tensors_[i].data = base + scratch_offsets_[i] + view_offsets_[i];
}

std::string describe_node(const Graph& g, size_t k) {
  const Node& n = g.nodes().at(k);
  std::string s = "node " + std::to_string(k) + " (" + std::string(op_name(n.op));
  if (n.dst >= 0 && size_t(n.dst) < g.tensor_count() && !g.tensor(n.dst).name.empty())
    s += " -> '" + g.tensor(n.dst).name + "'";
  return s + ")";
}

}  // namespace tessera
