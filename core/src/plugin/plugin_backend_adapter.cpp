// Host side of a backend plugin (plugin_backend_adapter.h). The graph crosses as C
// arrays rebuilt per call: tensors and nodes are copied (names by pointer), which for
// a decode step of a 1B model is about a thousand small structs, next to milliseconds
// of compute. supports() is asked node by node on a plan miss, so the arrays are
// reused while the graph's generation is unchanged (supports() reads no data
// pointers).
#include "plugin/plugin_backend_adapter.h"

#include <cstring>
#include <vector>

#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
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
  return c;
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

class PluginBackend final : public Backend {
 public:
  PluginBackend(std::string name, const TesseraPluginDescriptor* desc, void* self, std::shared_ptr<void> keep)
      : name_(std::move(name)), desc_(desc), api_(desc->backend), self_(self), keep_(std::move(keep)) {
    host_memory_ = guarded(name_, "uses_host_memory", [&] { return api_->uses_host_memory(self_); }) != 0;
    has_prepare_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, prepare_weight) && api_->prepare_weight;
    has_weight_bytes_ = TESSERA_HAS_FIELD(api_, TesseraBackendApi, weight_bytes) && api_->weight_bytes;
  }
  ~PluginBackend() override {
    try {
      desc_->destroy(self_);
    } catch (...) {  // never out of a destructor
    }
  }

  std::string name() const override { return name_; }
  bool uses_host_memory() const override { return host_memory_; }

  OpSupport supports(const Graph& graph, const Node& node) const override {
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
      TesseraGraph extra = g;
      extra.nodes = more.data();
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
      for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i] = to_c(graph.tensor(int32_t(i)));
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
    view_.nodes = nodes_.data();
    view_.node_count = nodes_.size();
    return view_;
  }

  std::string name_;
  const TesseraPluginDescriptor* desc_;
  const TesseraBackendApi* api_;
  void* self_;
  std::shared_ptr<void> keep_;
  bool host_memory_ = true, has_prepare_ = false, has_weight_bytes_ = false;
  mutable TesseraGraph view_{};
  mutable std::vector<TesseraTensor> tensors_;
  mutable std::vector<TesseraNode> nodes_;
};

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
  return std::make_shared<PluginBackend>(plugin_name, desc, self, std::move(keep));
}

}  // namespace tessera::detail
