// The Backend interface every compute plugin implements. A backend owns its buffers,
// says which nodes it supports, may repack weights once at load, and executes runs of
// consecutive graph nodes (never one op at a time, so a GPU backend can record a whole
// step into one submission).
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "tessera/graph.h"

namespace tessera {

class FastPool;

// Memory owned by a backend. Host buffers have a CPU-visible data() pointer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;  // null for device-only memory
  virtual size_t size() const = 0;
};

// 64-byte aligned host memory: the buffer type of every CPU backend.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes);
  ~HostBuffer() override;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

struct OpSupport {
  bool supported = false;
  std::string reason;  // why not, when unsupported
  static OpSupport yes() { return {true, {}}; }
  static OpSupport no(std::string why) { return {false, std::move(why)}; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // True when the backend computes on host memory (graph scratch and mapped weights
  // can be used directly); false for device backends, which need copies.
  virtual bool uses_host_memory() const { return true; }
  virtual std::unique_ptr<Buffer> alloc_buffer(size_t bytes) { return std::make_unique<HostBuffer>(bytes); }

  // Can this backend execute `node` of `graph` (op, dtypes, shapes)?
  virtual OpSupport supports(const Graph& graph, const Node& node) const = 0;

  // Called once per weight tensor at model load; a backend may repack the data into
  // its own layout (the returned tensor then refers to the backend's buffer).
  virtual void prepare_weight(Tensor& weight) {}

  // Execute graph.nodes()[first, first+count) in order. Throws tessera::Error.
  // Validates every node first (what supports() checks, plus its data pointers):
  // callers need not have asked supports().
  virtual void execute(Graph& graph, size_t first, size_t count) = 0;

  // execute() for nodes the caller has validated: this backend's supports() said yes
  // to each node of the range, for this graph or for one with the same
  // Scheduler::signature() (op, i[], f[], kv pointer, src/dst indices and those
  // tensors' dtypes, ne[], nb[] and null-ness; not i[1]/i[2] of KvWrite and
  // Attention nor i[1] of SsmConv and GatedDeltaNet). Scheduler::run() calls it, once
  // per run of consecutive nodes on this backend, each token.
  //
  // A backend may skip the per-node checks that supports() makes and that depend
  // only on what the signature covers (dtypes, shapes, strides, parameters). It must
  // keep every check of run-time state: that a sequence exists, that KV positions lie
  // in the sequence's reserved range, what supports() reads through node.kv (the
  // signature covers the pointer, not the cache behind it) or from i[1]/i[2], ids
  // inside tensors, data addresses. A node that violates the contract may be run
  // unchecked (undefined behaviour), so outside callers use execute().
  // The default validates anyway.
  virtual void execute_validated(Graph& graph, size_t first, size_t count) { execute(graph, first, count); }

  // The host bytes this backend streams when a product reads `weight`: its own
  // repacked copy where prepare_weight made one, else the tensor's bytes (empty for
  // device memory). `tessera bench` reads them to measure the bandwidth of the very
  // pages decode streams, which on a VM can differ from a fresh buffer's.
  virtual std::span<const std::byte> weight_bytes(const Tensor& weight) {
    if (!uses_host_memory() || !weight.data) return {};
    return {static_cast<const std::byte*>(weight.data), weight.nbytes()};
  }
};

}  // namespace tessera
