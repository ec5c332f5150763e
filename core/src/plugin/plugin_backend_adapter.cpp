// Host side of a backend plugin (plugin_backend_adapter.h). The graph crosses as C
// arrays rebuilt per call: tensors and nodes are copied (names by pointer), which for
// a decode step of a 1B model is about a thousand small structs, next to milliseconds
// of compute. supports() is asked node by node on a plan miss, so the arrays are
// reused while the graph's generation is unchanged (supports() reads no data
// pointers).
#include "plugin/plugin_backend_adapter.h"

#include <cstring>
#include <unordered_map>
#include <vector>

#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_access.h"
#include "tessera/op_schema.h"

namespace tessera::detail {

namespace {

constexpr size_t kMessageSize = 1024;

static_assert(uint32_t(Op::GetRows) == TESSERA_OP_GET_ROWS && uint32_t(Op::MatMul) == TESSERA_OP_MAT_MUL &&
              uint32_t(Op::MatMulId) == TESSERA_OP_MAT_MUL_ID && uint32_t(Op::Cont) == TESSERA_OP_CONT &&
              uint32_t(Op::GatedDeltaNet) == TESSERA_OP_GATED_DELTA_NET && uint32_t(Op::Count) == TESSERA_OP_COUNT,
              "TesseraOp must number the ops as tessera::Op does");
static_assert(uint32_t(DType::Q4_0) == TESSERA_DTYPE_Q4_0 && uint32_t(DType::IQ4_XS) == TESSERA_DTYPE_IQ4_XS &&
              uint32_t(DType::BF16) == TESSERA_DTYPE_BF16 && uint32_t(DType::MXFP4) == TESSERA_DTYPE_MXFP4 &&
              uint32_t(DType::I32) == TESSERA_DTYPE_I32,
              "TesseraDType must number the dtypes as tessera::DType does");

TesseraTensor to_c(const Tensor& t) {
  TesseraTensor c{};
  c.type = uint32_t(t.type);
  for (int d = 0; d < 4; ++d) {
    c.ne[d] = t.ne[d];
    c.nb[d] = t.nb[d];
  }
  c.data = t.data;
  c.buffer = t.buffer;
  c.name = t.name.c_str();
  return c;
}

TesseraNode to_c(const Node& n) {
  TesseraNode c{};
  c.op = uint32_t(n.op);
  c.dst = n.dst;
  for (int k = 0; k < 4; ++k) c.src[k] = n.src[k];
  for (int k = 0; k < 8; ++k) c.i[k] = n.i[k];
  for (int k = 0; k < 4; ++k) c.f[k] = n.f[k];
  c.kv = n.kv;  // a KvAccess is a TesseraKv
  c.src4 = n.src[4];
  return c;
}

// TesseraNode as ABI 3 and 4 laid it out (no src4): what a plugin built for them indexes.
struct TesseraNodeV4 {
  uint32_t op;
  int32_t dst;
  int32_t src[4];
  int32_t i[8];
  float f[4];
  TesseraKv* kv;
};
TesseraNodeV4 to_v4(const TesseraNode& c) {
  TesseraNodeV4 o{};
  o.op = c.op;
  o.dst = c.dst;
  std::memcpy(o.src, c.src, sizeof o.src);
  std::memcpy(o.i, c.i, sizeof o.i);
  std::memcpy(o.f, c.f, sizeof o.f);
  o.kv = c.kv;
  return o;
}

// Calls into the plugin: the ABI forbids exceptions across it; one that escapes anyway
// (a plugin built with the same C++ runtime) becomes a tessera::Error here.
template <typename F>
auto guarded(const std::string& plugin, const char* what, F&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const std::exception& e) {
    throw Error(plugin + ": " + what + " threw an exception across the plugin ABI: " + e.what());
  } catch (...) {
    throw Error(plugin + ": " + what + " threw an exception across the plugin ABI");
  }
}

std::string message(const char* buf, const char* fallback) {
  std::string s(buf, strnlen(buf, kMessageSize));
  return s.empty() ? std::string(fallback) : s;
}

class PluginBackend;

// Memory a plugin allocated (its buffer_* functions): the host holds the plugin's
// handle, and the backend stays alive while the buffer does.
class PluginBuffer final : public Buffer {
 public:
  PluginBuffer(std::shared_ptr<PluginBackend> owner, void* handle, void* host, size_t size, BufferUsage usage)
      : owner_(std::move(owner)), handle_(handle), host_(host), size_(size), usage_(usage) {}
  ~PluginBuffer() override;
  void* data() override { return host_; }
  size_t size() const override { return size_; }
  BufferUsage usage() const override { return usage_; }
  void set(size_t offset, const void* src, size_t bytes) override;
  void get(size_t offset, void* dst, size_t bytes) const override;
  void copy(size_t dst_offset, size_t src_offset, size_t bytes) override;
  void* handle() const { return handle_; }

 private:
  void check(size_t offset, size_t bytes, const char* what) const {
    if (offset > size_ || bytes > size_ - offset)
      throw Error(std::string("buffer ") + what + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                  ") outside the buffer's " + std::to_string(size_));
  }
  std::shared_ptr<PluginBackend> owner_;
  void* handle_;
  void* host_;
  size_t size_;
  BufferUsage usage_;
};

class PluginBackend final : public Backend, public std::enable_shared_from_this<PluginBackend> {
 public:
  PluginBackend(std::string name, const TesseraPluginDescriptor* desc, void* self, std::shared_ptr<void> keep)
      : name_(std::move(name)), desc_(desc), api_(desc->backend), self_(self), keep_(std::move(keep)) {
    has_prepare_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, prepare_weight) && api_->prepare_weight;
    has_weight_bytes_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, weight_bytes) && api_->weight_bytes;
    has_transfers_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, transfers) && api_->transfers;
    has_buffers_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, buffer_copy) && api_->buffer_alloc && api_->buffer_free &&
                   api_->buffer_set && api_->buffer_get && api_->buffer_copy;
  }
  // What the plugin says of itself; may throw, after construction so that the
  // destructor hands the instance back.
  void read_properties() {
    host_memory_ = guarded(name_, "uses_host_memory", [&] { return api_->uses_host_memory(self_); }) != 0;
    if (TESSERA_HAS_FIELD(api_, TesseraBackendApi, fusion_window) && api_->fusion_window) {
      fusion_window_ = guarded(name_, "fusion_window", [&] { return api_->fusion_window(self_); });
      if (fusion_window_ < 1 || fusion_window_ > kMaxFusionWindow)
        throw Error(name_ + ": fusion_window returned " + std::to_string(fusion_window_) + " (it must be 1 to " +
                    std::to_string(kMaxFusionWindow) + ")");
    }
  }
  ~PluginBackend() override {
    try {
      desc_->destroy(self_);
    } catch (...) {  // never out of a destructor
    }
  }

  std::string name() const override { return name_; }
  bool uses_host_memory() const override { return host_memory_; }
  int32_t fusion_window() const override { return fusion_window_; }

  OpSupport supports(const Graph& graph, const Node& node) const override {
    // ABI 3's KvWrite and Attention named one sequence per node: a plugin built for it
    // would misread today's batched nodes, so it is never given them.
    if (desc_->abi_version < 4 && (node.op == Op::KvWrite || node.op == Op::Attention))
      return OpSupport::no(std::string(op_name(node.op)) +
                           ": the plugin is built for ABI 3, whose KvWrite and Attention took one sequence per node");
    // Before ABI 5 Attention had no sliding window or sinks and Rope no YaRN: a plugin
    // built for it would ignore those parameters.
    if (desc_->abi_version < 5 && node.op == Op::Attention && (node.i[0] != 0 || node.src[4] >= 0))
      return OpSupport::no("attention: the plugin is built for ABI " + std::to_string(desc_->abi_version) +
                           ", whose Attention has no sliding window or sinks");
    if (desc_->abi_version < 5 && node.op == Op::Rope && node.f[2] != 0.0f)
      return OpSupport::no("rope: the plugin is built for ABI " + std::to_string(desc_->abi_version) +
                           ", whose Rope has no YaRN");
    // Before ABI 6 an Attention's value heads had the key heads' size, and Concat and
    // GroupLimit did not exist.
    if (desc_->abi_version < 6 && (node.op == Op::Concat || node.op == Op::GroupLimit))
      return OpSupport::no(std::string(op_name(node.op)) + ": the plugin is built for ABI " +
                           std::to_string(desc_->abi_version) + ", which has no such op");
    if (desc_->abi_version < 6 && node.op == Op::Attention && node.dst >= 0 && node.src[0] >= 0 &&
        graph.tensor(node.dst).ne[0] != graph.tensor(node.src[0]).ne[0])
      return OpSupport::no("attention: the plugin is built for ABI " + std::to_string(desc_->abi_version) +
                           ", whose Attention has value heads of the key heads' size");
    // Before ABI 7 MatMulId computed every slot's expert.
    if (desc_->abi_version < 7 && node.op == Op::MatMulId && node.i[1] > 0)
      return OpSupport::no("mat_mul_id: the plugin is built for ABI " + std::to_string(desc_->abi_version) +
                           ", whose MatMulId has no expert range");
    const TesseraGraph& g = view(graph, false);
    const auto& nodes = graph.nodes();
    const bool inside = !nodes.empty() && &node >= nodes.data() && &node < nodes.data() + nodes.size();
    char reason[kMessageSize] = {};
    int32_t yes = 0;
    if (inside) {
      yes = guarded(name_, "supports", [&] { return api_->supports(self_, &g, size_t(&node - nodes.data()), reason, sizeof reason); });
    } else {
      // A node not (yet) in the graph, over the graph's tensors: asked as one more node.
      std::vector<TesseraNode> more(nodes_);
      more.push_back(to_c(node));
      std::vector<TesseraNodeV4> more_v4;
      TesseraGraph extra = g;
      extra.nodes = laid_out(more, more_v4);
      extra.node_count = more.size();
      yes = guarded(name_, "supports", [&] { return api_->supports(self_, &extra, more.size() - 1, reason, sizeof reason); });
    }
    reason[kMessageSize - 1] = '\0';
    if (yes) return OpSupport::yes();
    return OpSupport::no(message(reason, "declined (no reason given)"));
  }

  void prepare_weight(Tensor& weight) override {
    if (!has_prepare_) return;
    TesseraTensor c = to_c(weight);
    char error[kMessageSize] = {};
    if (guarded(name_, "prepare_weight", [&] { return api_->prepare_weight(self_, &c, error, sizeof error); }) != 0) {
      error[kMessageSize - 1] = '\0';
      throw Error(message(error, (name_ + ": preparing weight '" + weight.name + "' failed").c_str()));
    }
    weight.type = DType(c.type);
    for (int d = 0; d < 4; ++d) {
      weight.ne[d] = c.ne[d];
      weight.nb[d] = c.nb[d];
    }
    weight.data = c.data;
    weight.buffer = static_cast<Buffer*>(c.buffer);  // the plugin's handle, never dereferenced here
  }

  void execute(Graph& graph, size_t first, size_t count) override {
    op_schema::validate_for_execute(*this, graph, first, count);
    execute_validated(graph, first, count);
  }

  void execute_validated(Graph& graph, size_t first, size_t count) override {
    op_schema::check_range(name_.c_str(), graph, first, count);
    TesseraGraph& g = view(graph, true);
    char error[kMessageSize] = {};
    if (guarded(name_, "execute", [&] { return api_->execute(self_, &g, first, count, 0, error, sizeof error); }) != 0) {
      error[kMessageSize - 1] = '\0';
      throw Error(message(error, (name_ + ": execute failed (no reason given)").c_str()));
    }
  }

  std::unique_ptr<Buffer> alloc_buffer(size_t bytes, BufferUsage usage) override {
    if (!has_buffers_) return Backend::alloc_buffer(bytes, usage);
    char error[kMessageSize] = {};
    void* host = nullptr;
    void* h = guarded(name_, "buffer_alloc",
                      [&] { return api_->buffer_alloc(self_, uint32_t(usage), bytes, &host, error, sizeof error); });
    if (!h) {
      error[kMessageSize - 1] = '\0';
      throw Error(message(error, (name_ + ": buffer_alloc of " + std::to_string(bytes) + " bytes failed").c_str()));
    }
    auto b = std::make_unique<PluginBuffer>(shared_from_this(), h, host, bytes, usage);
    handles_[b.get()] = h;
    return b;
  }
  void free_buffer(const PluginBuffer& b) {
    handles_.erase(&b);
    try {
      api_->buffer_free(self_, b.handle());
    } catch (...) {  // never out of a destructor
    }
  }
  // set (dir 0), get (1) or copy (2) of a buffer's bytes.
  void buffer_io(const PluginBuffer& b, int dir, size_t offset, const void* src, void* dst, size_t src_offset,
                 size_t bytes) const {
    char error[kMessageSize] = {};
    const char* what = dir == 0 ? "buffer_set" : dir == 1 ? "buffer_get" : "buffer_copy";
    const int32_t rc = guarded(name_, what, [&] {
      return dir == 0   ? api_->buffer_set(self_, b.handle(), offset, src, bytes, error, sizeof error)
             : dir == 1 ? api_->buffer_get(self_, b.handle(), offset, dst, bytes, error, sizeof error)
                        : api_->buffer_copy(self_, b.handle(), offset, src_offset, bytes, error, sizeof error);
    });
    if (rc != 0) {
      error[kMessageSize - 1] = '\0';
      throw Error(message(error, (name_ + ": " + what + " failed").c_str()));
    }
  }

  TransferStats transfers() const override {
    TransferStats t;
    if (has_transfers_ &&
        guarded(name_, "transfers", [&] { return api_->transfers(self_, &t.upload_bytes, &t.download_bytes); }) != 0)
      return {};
    return t;
  }

  std::span<const std::byte> weight_bytes(const Tensor& weight) override {
    if (!has_weight_bytes_) return Backend::weight_bytes(weight);
    TesseraTensor c = to_c(weight);
    const void* data = nullptr;
    size_t bytes = 0;
    if (guarded(name_, "weight_bytes", [&] { return api_->weight_bytes(self_, &c, &data, &bytes); }) != 0 || !data) return {};
    return {static_cast<const std::byte*>(data), bytes};
  }

 private:
  // The C view of `graph`: rebuilt when the graph or its generation changed; with
  // `refresh`, every tensor's fields are copied again (data pointers may have moved).
  TesseraGraph& view(const Graph& graph, bool refresh) const {
    const bool same = view_.id == graph.id() && view_.generation == graph.generation() &&
                      tensors_.size() == graph.tensor_count() && nodes_.size() == graph.nodes().size();
    if (!same || refresh) {
      tensors_.resize(graph.tensor_count());
      for (size_t i = 0; i < tensors_.size(); ++i) {
        tensors_[i] = to_c(graph.tensor(int32_t(i)));
        if (auto h = handles_.find(graph.tensor(int32_t(i)).buffer); h != handles_.end()) tensors_[i].buffer = h->second;
      }
    }
    if (!same) {
      nodes_.resize(graph.nodes().size());
      for (size_t i = 0; i < nodes_.size(); ++i) nodes_[i] = to_c(graph.nodes()[i]);
    }
    view_.struct_size = sizeof(TesseraGraph);
    view_.id = graph.id();
    view_.generation = graph.generation();
    view_.tensors = tensors_.data();
    view_.tensor_count = tensors_.size();
    view_.nodes = laid_out(nodes_, nodes_v4_);
    view_.node_count = nodes_.size();
    return view_;
  }

  // The nodes in the layout of the plugin's ABI: as they are, or copied into the ABI 3/4
  // layout (v4), whose address then crosses (the plugin indexes it with its own struct).
  const TesseraNode* laid_out(const std::vector<TesseraNode>& nodes, std::vector<TesseraNodeV4>& v4) const {
    if (desc_->abi_version >= 5) return nodes.data();
    v4.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) v4[i] = to_v4(nodes[i]);
    return reinterpret_cast<const TesseraNode*>(v4.data());
  }

  std::string name_;
  const TesseraPluginDescriptor* desc_;
  const TesseraBackendApi* api_;
  void* self_;
  std::shared_ptr<void> keep_;
  bool host_memory_ = true, has_prepare_ = false, has_weight_bytes_ = false, has_transfers_ = false;
  bool has_buffers_ = false;
  int32_t fusion_window_ = 1;
  static constexpr int32_t kMaxFusionWindow = 64;
  // The plugin's handle of each buffer it allocated for the host (what crosses as
  // TesseraTensor::buffer for a tensor in it).
  mutable std::unordered_map<const Buffer*, void*> handles_;
  mutable TesseraGraph view_{};
  mutable std::vector<TesseraTensor> tensors_;
  mutable std::vector<TesseraNode> nodes_;
  mutable std::vector<TesseraNodeV4> nodes_v4_;  // nodes_ for a plugin built for ABI 3 or 4
};

PluginBuffer::~PluginBuffer() { owner_->free_buffer(*this); }
void PluginBuffer::set(size_t offset, const void* src, size_t bytes) {
  check(offset, bytes, "set");
  owner_->buffer_io(*this, 0, offset, src, nullptr, 0, bytes);
}
void PluginBuffer::get(size_t offset, void* dst, size_t bytes) const {
  check(offset, bytes, "get");
  owner_->buffer_io(*this, 1, offset, nullptr, dst, 0, bytes);
}
void PluginBuffer::copy(size_t dst_offset, size_t src_offset, size_t bytes) {
  check(dst_offset, bytes, "copy");
  check(src_offset, bytes, "copy");
  owner_->buffer_io(*this, 2, dst_offset, nullptr, nullptr, src_offset, bytes);
}

}  // namespace

std::string check_backend_table(const TesseraBackendApi* api) {
  if (!api) return "backend plugin without a backend function table";
  if (!TESSERA_HAS_FIELD(api, TesseraBackendApi, uses_host_memory) || !api->uses_host_memory)
    return "backend function table lacks 'uses_host_memory'";
  if (!TESSERA_HAS_FIELD(api, TesseraBackendApi, supports) || !api->supports)
    return "backend function table lacks 'supports'";
  if (!TESSERA_HAS_FIELD(api, TesseraBackendApi, execute) || !api->execute)
    return "backend function table lacks 'execute'";
  return {};
}

std::shared_ptr<Backend> adapt_backend(const std::string& plugin_name, const TesseraPluginDescriptor* desc,
                                       void* self, std::shared_ptr<void> keep) {
  auto backend = std::make_shared<PluginBackend>(plugin_name, desc, self, std::move(keep));
  backend->read_properties();
  return backend;
}

}  // namespace tessera::detail
