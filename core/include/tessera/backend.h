// The Backend interface every compute plugin implements. A backend owns its buffers,
// says which nodes it runs natively, may repack weights once at load, and executes runs
// of consecutive graph nodes (never one op at a time, so a GPU backend can record a
// whole step into one submission). What a valid node is (each op's dtypes, shapes,
// strides and parameters) is the core's op schema (op_schema.h), not the backend's.
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "tessera/graph.h"

namespace tessera {

class FastPool;

// What a buffer holds: a backend may place each kind differently (a GPU keeps KV pages
// and scratch in device memory, weights where its kernels read them best).
enum class BufferUsage { Weights, Kv, ExpertCache, Scratch };

// Memory owned by a backend: a Tensor whose `buffer` is set lives in it. Host buffers
// have a CPU-visible data() pointer; device buffers return null there and are reached
// only through set/get/copy, and by their backend's kernels.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;  // null for device-only memory
  virtual size_t size() const = 0;
  virtual BufferUsage usage() const = 0;
  // Bytes [offset, offset + bytes) from / to host memory, and a copy inside the buffer
  // (ranges may not overlap). Throw tessera::Error for a range outside the buffer.
  virtual void set(size_t offset, const void* src, size_t bytes) = 0;
  virtual void get(size_t offset, void* dst, size_t bytes) const = 0;
  virtual void copy(size_t dst_offset, size_t src_offset, size_t bytes) = 0;
};

// 64-byte aligned host memory: the buffer type of every CPU backend.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes, BufferUsage usage = BufferUsage::Scratch);
  ~HostBuffer() override;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }
  BufferUsage usage() const override { return usage_; }
  void set(size_t offset, const void* src, size_t bytes) override;
  void get(size_t offset, void* dst, size_t bytes) const override;
  void copy(size_t dst_offset, size_t src_offset, size_t bytes) override;

 private:
  void check(size_t offset, size_t bytes, const char* what) const;
  void* ptr_ = nullptr;
  size_t size_ = 0;
  BufferUsage usage_;
};

// Bytes a backend copied between host memory and its own since it was made.
struct TransferStats {
  uint64_t upload_bytes = 0, download_bytes = 0;
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
  // The most consecutive nodes this backend computes as one (a group of products over
  // one input, a product and the SwiGlu that reads it): reading a later node's sources
  // after an earlier node's output is written. A host backend's graph plans scratch so
  // that no node's output overlaps what a node up to fusion_window() - 1 before it
  // read (Graph::set_memory_reuse). 1: node by node.
  virtual int32_t fusion_window() const { return 1; }
  // A buffer of this backend's memory for `usage` (host memory unless the backend says
  // otherwise): the KV pages are allocated here by the backend that runs attention.
  virtual std::unique_ptr<Buffer> alloc_buffer(size_t bytes, BufferUsage usage = BufferUsage::Scratch) {
    return std::make_unique<HostBuffer>(bytes, usage);
  }

  // Does this backend run `node` of `graph` natively? The scheduler asks only about
  // nodes that op_schema::check() accepted, so an answer may take the op's contract for
  // granted and says only what this backend adds (a dtype without a kernel, a stride
  // its kernels do not take, ...), with the reason when it declines: a declined node
  // goes to the next backend by rank. The answer must depend only on what
  // Scheduler::signature() covers: it is cached per signature.
  virtual OpSupport supports(const Graph& graph, const Node& node) const = 0;

  // Called once per weight tensor at model load; a backend may repack the data into
  // its own layout (the returned tensor then refers to the backend's buffer).
  virtual void prepare_weight(Tensor& weight) {}

  // Execute graph.nodes()[first, first+count) in order. Throws tessera::Error.
  // Validates every node first (op_schema::validate_for_execute: the op's contract, the
  // run-time state and this backend's supports()): callers need not have asked
  // supports().
  virtual void execute(Graph& graph, size_t first, size_t count) = 0;

  // execute() for nodes the Scheduler has validated, which is what Scheduler::run()
  // calls, once per run of consecutive nodes on this backend, each step: every node of
  // the range passed op_schema::check() and this backend's supports() for this graph or
  // one with the same Scheduler::signature(), and op_schema::check_run_state() just
  // before this call (sequences exist, KV positions are reserved, data pointers are
  // set). A backend checks nothing of that again; it keeps only what the schema cannot
  // know in advance: ids read from tensors that earlier nodes of the run compute
  // (GetRows, MatMulId, GatherCols), and whatever its supports() read that the
  // signature leaves out (for instance, that an input comes from outside the graph).
  // A node that violates the contract may be run unchecked (undefined behaviour), so
  // outside callers use execute(). The default validates anyway.
  virtual void execute_validated(Graph& graph, size_t first, size_t count) { execute(graph, first, count); }

  // Host <-> device traffic so far (none for a backend that computes on host memory).
  virtual TransferStats transfers() const { return {}; }

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
