// The vulkan backend object: node validation, the per-run plan (what lives where on
// the device, what is uploaded and downloaded), recording and submission.
#include "vulkan_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_access.h"
#include "tessera/rope_table.h"
#include "tessera/op_schema.h"
#include "tessera/range_backend.h"
#include "tessera/quant_blocks.h"
#include "vk_context.h"

namespace tessera::vk {
namespace {

constexpr VkDeviceSize kAlign = 256;  // >= every device's minStorageBufferOffsetAlignment

VkDeviceSize align_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

const char* type_suffix(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    case DType::Q4_K: return "q4_k";
    case DType::Q5_K: return "q5_k";
    case DType::Q6_K: return "q6_k";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::IQ4_NL: return "iq4_nl";
    case DType::IQ4_XS: return "iq4_xs";
    case DType::MXFP4: return "mxfp4";
    default: return nullptr;
  }
}

bool is_quantized(DType t) { return type_suffix(t) && t != DType::F32 && t != DType::F16 && t != DType::BF16; }
// Activation quantization of a quantized weight's products (the reference's vec_dot
// type): Q8_0 or Q8_1 in blocks of 32, Q8_K in blocks of 256.
uint32_t act_block(DType w) { return quant::vec_dot_type(w) == DType::Q8_K ? 256u : 32u; }
bool act_has_sums(DType w) { return quant::vec_dot_type(w) == DType::Q8_1; }
// Bytes of one quantized activation row (quant_act.comp's layout): K int8 quants, a
// float scale per block, and for Q8_1 a float s (the block's F16 d * sum) per block.
uint64_t act_row_bytes(DType w, uint64_t K) { return K + 4 * (K / act_block(w)) * (act_has_sums(w) ? 2 : 1); }
const char* act_shader(DType w) { return act_has_sums(w) ? "quant_q8_1" : act_block(w) == 32 ? "quant_q8_0" : "quant_q8_k"; }

// Host bytes spanned by a tensor view: [data, data + span).
size_t span_bytes(const Tensor& t) {
  size_t s = row_bytes(t.type, t.ne[0]);
  for (int d = 1; d < Tensor::kMaxDims; ++d) s += size_t(t.ne[d] - 1) * t.nb[d];
  return s;
}

struct Range {
  uintptr_t lo = 0, hi = 0;
  bool overlaps(const Range& o) const { return lo < o.hi && o.lo < hi; }
  bool contains(const Range& o) const { return lo <= o.lo && o.hi <= hi; }
};
Range range_of(const Tensor& t) {
  const auto lo = reinterpret_cast<uintptr_t>(t.data);
  return {lo, lo + span_bytes(t)};
}

// Plain F32/I32 tensor laid out densely.
bool dense(const Tensor& t) {
  return t.nb[0] == dtype_traits(t.type).block_bytes && t.is_contiguous();
}

// A cheap fingerprint of a weight's bytes (shape, strides and 64 bytes at its start,
// middle and end): a cached device copy is used only while the host bytes still match.
uint64_t fingerprint(const Tensor& w) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&w.type, sizeof w.type);
  mix(w.ne, sizeof w.ne);
  mix(w.nb, sizeof w.nb);
  const size_t span = span_bytes(w), n = std::min<size_t>(64, span);
  const auto* base = static_cast<const char*>(w.data);
  for (size_t off : {size_t(0), (span - n) / 2, span - n}) mix(base + off, n);
  return h;
}

// Push constants: up to 32 words.
struct Push {
  uint32_t u[32] = {};
  uint32_t n = 0;
  Push& add(uint64_t v) {
    if (v > UINT32_MAX) throw Error("vulkan: a size or offset exceeds 32 bits");
    u[n++] = uint32_t(v);
    return *this;
  }
  Push& addf(float f) {
    std::memcpy(&u[n++], &f, 4);
    return *this;
  }
};

class DeviceKvBuffer;

// A tensor in device memory: a buffer of its backend, no host address.
bool on_device(const Tensor& t) { return !t.data && t.buffer; }

class VulkanBackend final : public RangeBackend {
 public:
  explicit VulkanBackend(bool allow_cpu) : ctx_(allow_cpu) {
    spdlog::debug("vulkan: using {}", ctx_.device_summary());
  }

  ~VulkanBackend() override {
    ctx_.fn().vkDeviceWaitIdle(ctx_.device());
    for (auto& [p, w] : weights_) ctx_.destroy(w.buf);
    ctx_.destroy(arena_);
    ctx_.destroy(staging_);
    if (pool_) ctx_.fn().vkDestroyDescriptorPool(ctx_.device(), pool_, nullptr);
  }

  std::string name() const override { return "vulkan"; }
  bool uses_host_memory() const override { return false; }
  TransferStats transfers() const override { return transfers_; }
  // The KV pages (BufferUsage::Kv) in device memory, where attention reads them; other
  // usages are host memory.
  std::unique_ptr<::tessera::Buffer> alloc_buffer(size_t bytes, BufferUsage usage) override;

  // What the shaders take, for nodes the op schema accepted (the scheduler checks the
  // schema first; execute() does too).
  OpSupport supports(const Graph& g, const Node& n) const override {
    // TESSERA_VULKAN_DISABLE=op,op,...: refuse these ops (bisecting a mismatch).
    static const std::string disabled = [] {
      const char* e = std::getenv("TESSERA_VULKAN_DISABLE");
      return e ? "," + std::string(e) + "," : std::string();
    }();
    if (!disabled.empty()) {
      std::string needle(1, ',');  // appended, not "," + name: GCC 12 warns (-Wrestrict) on that
      needle.append(op_name(n.op)).push_back(',');
      if (disabled.find(needle) != std::string::npos) return OpSupport::no("disabled by TESSERA_VULKAN_DISABLE");
    }
    std::string why = check(g, n);
    if (!why.empty()) return OpSupport::no(why);
    return OpSupport::yes();
  }

  void prepare_weight(Tensor& w) override {
    if (!w.data || !type_suffix(w.type) || w.ne[0] % dtype_traits(w.type).block_elems != 0) return;
    try {
      ensure_weight(w);
    } catch (const std::exception& e) {
      spdlog::warn("vulkan: could not upload weight '{}' at load ({}); it is uploaded on first use", w.name, e.what());
    }
  }

  // The one check() rule that reads data addresses (a Rope's positions must not be
  // computed in the graph), which the plan signature does not cover, runs again for
  // every Rope of a validated range, over sorted ranges (rope_positions_computed).
  void check_unsigned(const Graph& g, size_t first, size_t count) const override {
    const size_t k = rope_positions_computed(g, first, count);
    if (k != SIZE_MAX) throw Error("vulkan: " + describe_node(g, k) + ": Rope: positions computed inside the graph");
  }

 private:
  void run_range(Graph& g, size_t first, size_t count) override;

  // --- validation ------------------------------------------------------------
  // The first Rope node of [first, first + count) whose positions tensor overlaps a
  // node's destination anywhere in the graph (check()'s Rope rule for all of them at
  // once: the destinations sorted by start with the running maximum of their ends,
  // one binary search per Rope), or SIZE_MAX.
  static size_t rope_positions_computed(const Graph& g, size_t first, size_t count) {
    const auto& nodes = g.nodes();
    size_t k = first;
    while (k < first + count && nodes[k].op != Op::Rope) ++k;
    if (k == first + count) return SIZE_MAX;
    std::vector<Range> writes;
    writes.reserve(nodes.size());
    for (const Node& o : nodes)
      if (o.dst >= 0 && !on_device(g.tensor(o.dst))) writes.push_back(range_of(g.tensor(o.dst)));
    std::sort(writes.begin(), writes.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    std::vector<uintptr_t> max_hi(writes.size());
    for (size_t i = 0; i < writes.size(); ++i) max_hi[i] = std::max(writes[i].hi, i ? max_hi[i - 1] : 0);
    for (; k < first + count; ++k) {
      if (nodes[k].op != Op::Rope) continue;
      const Range pr = range_of(g.tensor(nodes[k].src[1]));
      const size_t n = size_t(std::lower_bound(writes.begin(), writes.end(), pr.hi,
                                               [](const Range& a, uintptr_t v) { return a.lo < v; }) -
                              writes.begin());
      if (n > 0 && max_hi[n - 1] > pr.lo) return k;
    }
    return SIZE_MAX;
  }

  std::string check(const Graph& g, const Node& n) const {
    auto T = [&](int32_t i) -> const Tensor& { return g.tensor(i); };
    auto all_dense = [&](std::initializer_list<int32_t> ids) -> std::string {
      for (int32_t i : ids)
        if (i >= 0 && !dense(T(i))) return "non-contiguous tensor '" + T(i).name + "' (the vulkan shaders need dense rows)";
      return {};
    };
    const uint64_t max_range = ctx_.max_storage_range();
    auto fits = [&](const Tensor& t) { return span_bytes(t) <= max_range; };
    switch (n.op) {
      case Op::Silu:
      case Op::Sigmoid:
      case Op::Softplus:
      case Op::SwiGlu:
      case Op::GeGlu:
      case Op::NormalizeRows:
      case Op::SwiGluOai:
      case Op::Add:
      case Op::Mul:
      case Op::Softmax:
      case Op::Argmax:
      case Op::TopK:
      case Op::GatherCols:
      case Op::MoeCombine:
        return all_dense({n.src[0], n.src[1], n.dst});
      case Op::RmsNorm:
        return all_dense({n.src[0], n.src[1], n.dst});
      case Op::Concat:
        return all_dense({n.src[0], n.src[1], n.dst});
      case Op::GroupLimit:
        if (n.i[0] > 64) return "GroupLimit: more than 64 expert groups";
        return all_dense({n.src[0], n.dst});
      case Op::Cont: {
        const Tensor& x = T(n.src[0]);
        if (x.nb[0] != 4 || x.nb[1] % 4 || x.nb[2] % 4 || x.nb[3] % 4) return "Cont: source strides must be multiples of 4 bytes";
        return all_dense({n.dst});
      }
      case Op::GetRows: {
        if (!type_suffix(T(n.src[0]).type)) return "GetRows: no vulkan shader for this table dtype";
        if (!fits(T(n.src[0]))) return "GetRows: table larger than the device's maxStorageBufferRange";
        return all_dense({n.src[1], n.dst});
      }
      case Op::MatMul:
      case Op::MatMulId: {
        const Tensor& w = T(n.src[0]);
        if (!type_suffix(w.type)) return std::string(op_name(n.op)) + ": no vulkan shader for weight dtype " + std::string(dtype_name(w.type));
        if (is_quantized(w.type) && w.ne[0] % act_block(w.type) != 0) return "row length is not a multiple of the activation block";
        if (!fits(w)) return std::string(op_name(n.op)) + ": weight larger than the device's maxStorageBufferRange";
        if (n.op == Op::MatMulId && n.i[1] > 0) return "MatMulId: no expert-range shader yet";
        return all_dense({n.src[1], n.src[2], n.dst});
      }
      case Op::Rope: {
        if (n.i[1] != kRopeNormal && n.i[1] != kRopeNeox && n.i[1] != kRopeImrope)
          return "Rope: mode " + std::to_string(n.i[1]) + " is not implemented by the vulkan backend";
        // cos/sin are tabulated on the host from the positions and the frequency
        // factors, which must be graph inputs or weights (not computed by a node).
        const Range pr = range_of(T(n.src[1]));
        const Range fr = n.src[2] >= 0 ? range_of(T(n.src[2])) : Range{};
        for (const Node& o : g.nodes()) {
          if (o.dst < 0 || on_device(T(o.dst))) continue;
          if (range_of(T(o.dst)).overlaps(pr)) return "Rope: positions computed inside the graph";
          if (n.src[2] >= 0 && range_of(T(o.dst)).overlaps(fr)) return "Rope: frequency factors computed inside the graph";
        }
        return all_dense({n.src[0], n.src[1], n.dst});
      }
      case Op::KvWrite:
        if (!kv_buffer(T(n.dst))) return "KvWrite: the KV storage is not in this backend's device memory";
        if (T(n.dst).ne[0] % 2 != 0) return "KvWrite: odd row size";
        return all_dense({n.src[0], n.src[1]});
      case Op::Attention:
        if (!kv_buffer(T(n.src[1])) || !kv_buffer(T(n.src[2])))
          return "Attention: the KV storage is not in this backend's device memory";
        if (T(n.src[0]).ne[0] > 1024 || T(n.src[0]).ne[0] % 2 != 0)
          return "Attention: key heads must have an even size <= 1024";
        if (T(n.dst).ne[0] > 512) return "Attention: value heads above 512 values";
        return all_dense({n.src[0], n.src[3], n.src[4], n.dst});
      case Op::SsmConv:
        return all_dense({n.src[0], n.src[1], n.dst});
      case Op::GatedDeltaNet:
        if (n.i[3] > 128) return "GatedDeltaNet: head size above 128";
        return all_dense({n.src[0], n.src[1], n.src[2], n.dst});
      default:
        return std::string("op ") + std::string(op_name(n.op)) + " is not implemented by the vulkan backend";
    }
  }

  // --- weights ---------------------------------------------------------------
  struct Weight {
    Buffer buf;
    uint64_t fp = 0;
  };

  Weight& ensure_weight(const Tensor& w) {
    const uint64_t fp = fingerprint(w);
    auto it = weights_.find(weight_key(w));
    if (it != weights_.end()) {
      if (it->second.fp == fp) return it->second;
      ctx_.destroy(it->second.buf);  // stale: the address now holds another tensor
      weights_.erase(it);
    }
    const size_t bytes = span_bytes(w);
    Weight nw;
    nw.fp = fp;
    nw.buf = ctx_.create_device_buffer(align_up(bytes, 4));
    try {
      device_set(nw.buf, 0, w.data, bytes);
    } catch (...) {
      ctx_.destroy(nw.buf);
      throw;
    }
    return weights_.emplace(weight_key(w), nw).first->second;
  }

  void ensure_staging(VkDeviceSize bytes) {
    if (staging_.buffer && staging_.size >= bytes) return;
    ctx_.destroy(staging_);
    staging_ = ctx_.create_host_buffer(std::max<VkDeviceSize>(align_up(bytes + bytes / 2, 1 << 16), 1 << 20));
  }
  void ensure_arena(VkDeviceSize bytes) {
    if (bytes > UINT32_MAX) throw Error("vulkan: a run needs more than 4 GiB of device scratch");
    if (arena_.buffer && arena_.size >= bytes) return;
    ctx_.destroy(arena_);
    VkDeviceSize want = std::max<VkDeviceSize>(align_up(bytes + bytes / 2, 1 << 16), 1 << 20);
    want = std::min<VkDeviceSize>(want, std::max<VkDeviceSize>(bytes, std::min<VkDeviceSize>(UINT32_MAX, ctx_.max_storage_range())));
    if (bytes > ctx_.max_storage_range()) throw Error("vulkan: a run needs more device scratch than maxStorageBufferRange");
    arena_ = ctx_.create_device_buffer(want);
  }

  // --- KV storage in device memory --------------------------------------------
 public:
  // The KV buffer of this backend a tensor lies in, or null.
  DeviceKvBuffer* kv_buffer(const Tensor& t) const {
    if (t.data || !t.buffer) return nullptr;
    const auto it = kv_buffers_.find(t.buffer);
    return it == kv_buffers_.end() ? nullptr : it->second;
  }
  void forget_kv(const ::tessera::Buffer* b) { kv_buffers_.erase(b); }
  // Synchronous copies between host memory and a device buffer (through the staging
  // buffer, in chunks), and inside one.
  void device_set(Buffer& dst, size_t offset, const void* src, size_t bytes) {
    const size_t chunk = size_t(64) << 20;
    ensure_staging(std::min(bytes, chunk));
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      std::memcpy(staging_.mapped, static_cast<const uint8_t*>(src) + off, n);
      VkCommandBuffer cb = ctx_.begin();
      VkBufferCopy c{0, offset + off, n};
      ctx_.fn().vkCmdCopyBuffer(cb, staging_.buffer, dst.buffer, 1, &c);
      ctx_.submit_and_wait();
    }
    transfers_.upload_bytes += bytes;
  }
  void device_get(const Buffer& src, size_t offset, void* dst, size_t bytes) {
    const size_t chunk = size_t(64) << 20;
    ensure_staging(std::min(bytes, chunk));
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      VkCommandBuffer cb = ctx_.begin();
      VkBufferCopy c{offset + off, 0, n};
      ctx_.fn().vkCmdCopyBuffer(cb, src.buffer, staging_.buffer, 1, &c);
      VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      hb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
      ctx_.fn().vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0,
                                     nullptr, 0, nullptr);
      ctx_.submit_and_wait();
      std::memcpy(static_cast<uint8_t*>(dst) + off, staging_.mapped, n);
    }
    transfers_.download_bytes += bytes;
  }
  void device_copy(Buffer& b, size_t dst_offset, size_t src_offset, size_t bytes) {
    VkCommandBuffer cb = ctx_.begin();
    VkBufferCopy c{src_offset, dst_offset, bytes};
    ctx_.fn().vkCmdCopyBuffer(cb, b.buffer, b.buffer, 1, &c);
    ctx_.submit_and_wait();
  }
  Context& context() { return ctx_; }

 private:
  std::unordered_map<const ::tessera::Buffer*, DeviceKvBuffer*> kv_buffers_;
  uint64_t next_kv_id_ = 0;

  Context ctx_;
  // By host address and span: a view of a weight's first rows (same address, shorter
  // span) is a separate entry, never the full weight's buffer.
  using WeightKey = std::pair<const void*, size_t>;
  static WeightKey weight_key(const Tensor& w) { return {w.data, span_bytes(w)}; }
  std::map<WeightKey, Weight> weights_;
  TransferStats transfers_;
  Buffer arena_, staging_;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  uint32_t pool_sets_ = 0;

  friend class Run;
};

// One layer's K or V pages in device memory (the KvCache's storage when vulkan runs
// attention): kernels read and write it in place; the host reaches it only through
// set / get / copy, each a synchronous copy.
class DeviceKvBuffer final : public ::tessera::Buffer {
 public:
  DeviceKvBuffer(VulkanBackend& be, vk::Buffer buf, size_t size, uint64_t id) : be_(be), buf_(buf), size_(size), id_(id) {}
  ~DeviceKvBuffer() override {
    be_.forget_kv(this);
    be_.context().destroy(buf_);
  }
  void* data() override { return nullptr; }
  size_t size() const override { return size_; }
  BufferUsage usage() const override { return BufferUsage::Kv; }
  void set(size_t offset, const void* src, size_t bytes) override {
    check(offset, bytes, "set");
    if (bytes) be_.device_set(buf_, offset, src, bytes);
  }
  void get(size_t offset, void* dst, size_t bytes) const override {
    check(offset, bytes, "get");
    if (bytes) be_.device_get(buf_, offset, dst, bytes);
  }
  void copy(size_t dst_offset, size_t src_offset, size_t bytes) override {
    check(dst_offset, bytes, "copy");
    check(src_offset, bytes, "copy");
    if (bytes) be_.device_copy(buf_, dst_offset, src_offset, bytes);
  }
  VkBuffer buffer() const { return buf_.buffer; }
  // Its accesses, for the run's hazard tracking: a range of its own far above any
  // arena offset.
  Range range() const { return {uintptr_t((id_ + 1) << 44), uintptr_t(((id_ + 1) << 44) + size_)}; }

 private:
  void check(size_t offset, size_t bytes, const char* what) const {
    if (offset > size_ || bytes > size_ - offset)
      throw Error("vulkan: KV buffer " + std::string(what) + ": bytes [" + std::to_string(offset) + ", +" +
                  std::to_string(bytes) + ") outside its " + std::to_string(size_));
  }
  VulkanBackend& be_;
  vk::Buffer buf_;
  size_t size_;
  uint64_t id_;
};

std::unique_ptr<::tessera::Buffer> VulkanBackend::alloc_buffer(size_t bytes, BufferUsage usage) {
  if (usage != BufferUsage::Kv) return Backend::alloc_buffer(bytes, usage);
  if (bytes > ctx_.max_storage_range())
    throw Error("vulkan: a KV buffer of " + std::to_string(bytes) + " bytes exceeds maxStorageBufferRange (" +
                std::to_string(ctx_.max_storage_range()) + "): lower --ctx or --parallel");
  auto b = std::make_unique<DeviceKvBuffer>(*this, ctx_.create_device_buffer(align_up(std::max<size_t>(bytes, 4), 4)),
                                            bytes, next_kv_id_++);
  kv_buffers_[b.get()] = b.get();
  return b;
}

// ---------------------------------------------------------------------------
// One execute() call: plan, record, submit, copy back.

class Run {
 public:
  Run(VulkanBackend& be, Graph& g, size_t first, size_t count) : be_(be), ctx_(be.ctx_), g_(g), first_(first), count_(count) {}

  void go();

 private:
  struct Region {
    Range r;
    VkDeviceSize dev = 0;
  };
  struct StateMirror {  // device copy of one recurrent layer's conv or delta-net state
    float* host = nullptr;
    size_t bytes = 0;
    VkDeviceSize dev = 0;
  };
  struct Upload {
    const void* src;  // host bytes (or staged content below)
    size_t bytes;
    VkDeviceSize dev;
    VkDeviceSize stage = 0;
    std::vector<uint8_t> owned;  // host-computed content (rope tables)
  };
  struct Download {
    void* dst;
    size_t bytes;
    VkDeviceSize dev;
    VkDeviceSize stage = 0;
  };
  struct Access {
    std::vector<Range> reads, writes;  // device offsets in the arena
  };

  const Tensor& T(int32_t i) const { return g_.tensor(i); }
  bool weight_role(const Node& n, int slot) const {
    switch (n.op) {
      case Op::MatMul:
      case Op::MatMulId:
      case Op::GetRows: return slot == 0;
      case Op::RmsNorm:
      case Op::SsmConv: return slot == 1;
      default: return false;
    }
  }
  static constexpr size_t kMaxSrc = std::tuple_size_v<decltype(Node::src)>;
  bool is_weight(const Node& n, int slot) const {
    if (!weight_role(n, slot)) return false;
    const size_t k = size_t(&n - g_.nodes().data());
    if (weight_flags_.empty()) weight_flags_.assign(g_.nodes().size() * kMaxSrc, -1);
    int8_t& flag = weight_flags_[k * kMaxSrc + size_t(slot)];
    if (flag < 0) {
      flag = 1;
      const Range r = range_of(T(n.src[slot]));
      for (const Range& w : graph_writes_)
        if (w.overlaps(r)) flag = 0;  // computed by the graph: an activation
    }
    return flag == 1;
  }
  VkDeviceSize dev(const Tensor& t) const {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data);
    for (const Region& rg : regions_)
      if (rg.r.lo <= lo && lo < rg.r.hi) return rg.dev + (lo - rg.r.lo);
    throw Error("vulkan: internal error: tensor '" + t.name + "' has no device placement");
  }
  Range devr(const Tensor& t) const {
    const VkDeviceSize d = dev(t);
    return {uintptr_t(d), uintptr_t(d + span_bytes(t))};
  }
  VkDeviceSize scratch(VkDeviceSize bytes) {
    const VkDeviceSize d = align_up(cursor_, kAlign);
    cursor_ = d + bytes;
    return d;
  }
  // The recurrent state a SsmConv (conv state) or GatedDeltaNet (delta-net state) node
  // reads and updates: uploaded whole at the start of the run, downloaded at the end.
  StateMirror& state_mirror(const Node& n) {
    const bool conv = n.op == Op::SsmConv;
    float* host = conv ? n.kv->conv_state(n.i[0], n.i[1]) : n.kv->recurrent_state(n.i[0], n.i[1]);
    for (StateMirror& m : states_)
      if (m.host == host) return m;
    const auto& rc = n.kv->recurrent_config();
    StateMirror m{host, size_t(conv ? rc.conv_elems : rc.state_elems) * 4, 0};
    m.dev = scratch(std::max<size_t>(m.bytes, 4));
    Upload u{host, m.bytes, m.dev};
    uploads_.push_back(std::move(u));
    downloads_.push_back({host, m.bytes, m.dev});
    states_.push_back(m);
    return states_.back();
  }
  void plan();
  void record_node(VkCommandBuffer cb, size_t k);
  // b1: binding 1 (a weight, or the arena); b2, b3: bindings 2 and 3 (KV storage, or
  // VK_NULL_HANDLE for the arena).
  void dispatch(VkCommandBuffer cb, const std::string& pipe, VkBuffer b1, const Push& pc, uint64_t groups, Access acc,
                VkBuffer b2 = VK_NULL_HANDLE, VkBuffer b3 = VK_NULL_HANDLE);
  using SetKey = std::array<VkBuffer, 3>;  // bindings 1, 2, 3

  VulkanBackend& be_;
  Context& ctx_;
  Graph& g_;
  size_t first_, count_;
  std::vector<Range> graph_writes_;
  mutable std::vector<int8_t> weight_flags_;  // per (node, slot): -1 unknown, 0/1
  std::vector<Region> regions_;
  std::vector<StateMirror> states_;
  std::vector<Upload> uploads_;
  std::vector<Download> downloads_;
  std::map<size_t, VkDeviceSize> node_scratch_;  // node index -> scratch offset (quantized acts, rope table)
  VkDeviceSize cursor_ = 0;
  // Hazard tracking since the last barrier.
  std::vector<Range> pend_reads_, pend_writes_;
  std::map<SetKey, VkDescriptorSet> sets_;
};

void Run::plan() {
  const auto& nodes = g_.nodes();

  // 1. Tensors that live in the arena: every non-weight source and every destination
  // (not the KV storage, which stays in its own device buffers).
  std::vector<Range> rs;
  for (size_t k = first_; k < first_ + count_; ++k) {
    const Node& n = nodes[k];
    for (int s = 0; s < int(n.src.size()); ++s)
      if (n.src[s] >= 0 && !is_weight(n, s) && !on_device(T(n.src[s]))) rs.push_back(range_of(T(n.src[s])));
    if (n.dst >= 0 && !on_device(T(n.dst))) rs.push_back(range_of(T(n.dst)));
  }
  std::sort(rs.begin(), rs.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  for (const Range& r : rs) {
    // Touching ranges join too: uploads below merge the same way, and one upload
    // must land in one region.
    if (!regions_.empty() && r.lo <= regions_.back().r.hi)
      regions_.back().r.hi = std::max(regions_.back().r.hi, r.hi);
    else
      regions_.push_back({r, 0});
  }
  for (Region& rg : regions_) {
    // Same address modulo kAlign as on the host: every element keeps its alignment.
    rg.dev = align_up(cursor_, kAlign) + rg.r.lo % kAlign;
    cursor_ = rg.dev + (rg.r.hi - rg.r.lo);
  }

  // 2. Per-node scratch and host checks, in node order.
  std::vector<Range> written;  // host ranges written so far in this run
  auto covered = [&](const Range& r) {
    for (const Range& w : written)
      if (w.contains(r)) return true;
    return false;
  };
  std::vector<Range> up;  // host ranges to upload
  for (size_t k = first_; k < first_ + count_; ++k) {
    const Node& n = nodes[k];
    for (int s = 0; s < int(n.src.size()); ++s) {
      if (n.src[s] < 0 || is_weight(n, s) || on_device(T(n.src[s]))) continue;
      const Range r = range_of(T(n.src[s]));
      if (!covered(r)) up.push_back(r);
    }
    auto host_input = [&](int32_t t) { return !covered(range_of(T(t))); };
    switch (n.op) {
      case Op::MatMul:
      case Op::MatMulId: {
        const Tensor& w = T(n.src[0]);
        const Tensor& x = T(n.src[1]);
        if (is_quantized(w.type)) {
          const uint64_t K = uint64_t(w.ne[0]);
          node_scratch_[k] = scratch(uint64_t(x.nrows()) * act_row_bytes(w.type, K));
        }
        if (n.op == Op::MatMulId && host_input(n.src[2])) {
          const Tensor& ids = T(n.src[2]);
          const int32_t* id = static_cast<const int32_t*>(ids.data);
          for (int64_t i = 0; i < ids.nelements(); ++i)
            if (id[i] < 0 || id[i] >= w.ne[2])
              throw Error("vulkan: " + describe_node(g_, k) + ": expert id " + std::to_string(id[i]) + " out of range [0, " + std::to_string(w.ne[2]) + ")");
        }
        break;
      }
      case Op::GetRows:
        if (host_input(n.src[1])) {
          const Tensor& ids = T(n.src[1]);
          const int32_t* id = static_cast<const int32_t*>(ids.data);
          for (int64_t i = 0; i < ids.ne[0]; ++i)
            if (id[i] < 0 || id[i] >= T(n.src[0]).ne[1])
              throw Error("vulkan: " + describe_node(g_, k) + ": row id " + std::to_string(id[i]) + " (ids[" + std::to_string(i) +
                          "]) out of range [0, " + std::to_string(T(n.src[0]).ne[1]) + ")");
        }
        break;
      case Op::SsmConv:
      case Op::GatedDeltaNet:  // the sequence exists (op_schema::check_run_state)
        state_mirror(n);
        break;
      case Op::Rope: {
        // The reference's cos/sin table (rope_table.h), uploaded for the shader.
        const Tensor& x = T(n.src[0]);
        const int32_t* p = static_cast<const int32_t*>(T(n.src[1]).data);
        const float* ff = n.src[2] >= 0 ? static_cast<const float*>(T(n.src[2]).data) : nullptr;
        const int32_t nd = n.i[0];
        const RopeTable table(n);
        Upload u{nullptr, size_t(x.ne[2]) * size_t(nd) * 4, 0};
        u.owned.resize(u.bytes);
        float* cs = reinterpret_cast<float*>(u.owned.data());
        for (int64_t t = 0; t < x.ne[2]; ++t) table.cos_sin(p[t], ff, cs + t * nd);
        u.dev = node_scratch_[k] = scratch(u.bytes);
        uploads_.push_back(std::move(u));
        break;
      }
      default: break;
    }
    if (n.dst >= 0 && !on_device(T(n.dst))) written.push_back(range_of(T(n.dst)));
  }
  std::sort(up.begin(), up.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<Range> merged;
  for (const Range& r : up) {
    if (!merged.empty() && r.lo <= merged.back().hi)
      merged.back().hi = std::max(merged.back().hi, r.hi);
    else
      merged.push_back(r);
  }
  for (const Range& r : merged) {
    Upload u{reinterpret_cast<const void*>(r.lo), size_t(r.hi - r.lo), 0};
    bool placed = false;
    for (const Region& rg : regions_)
      if (rg.r.contains(r)) {
        u.dev = rg.dev + (r.lo - rg.r.lo);
        placed = true;
      }
    if (!placed) throw Error("vulkan: internal error: an upload spans two device regions");
    uploads_.push_back(std::move(u));
  }

  // 4. Downloads: a destination is copied back when a node after the run reads it, or
  // when no node reads it at all (a graph output); intermediates consumed only inside
  // the run stay on the device.
  // Sources of the nodes after the run, sorted by start, with the running maximum of
  // their ends: "does any of them overlap r" is one binary search (exact).
  std::vector<Range> after;
  for (size_t j = first_ + count_; j < nodes.size(); ++j)
    for (int s = 0; s < int(kMaxSrc); ++s)
      if (nodes[j].src[s] >= 0 && T(nodes[j].src[s]).data) after.push_back(range_of(T(nodes[j].src[s])));
  std::sort(after.begin(), after.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<uintptr_t> max_hi(after.size());
  for (size_t i = 0; i < after.size(); ++i) max_hi[i] = std::max(after[i].hi, i ? max_hi[i - 1] : 0);
  auto read_after = [&](const Range& r) {
    const size_t n = size_t(std::lower_bound(after.begin(), after.end(), r.hi, [](const Range& a, uintptr_t v) { return a.lo < v; }) -
                            after.begin());
    return n > 0 && max_hi[n - 1] > r.lo;
  };
  // The last node of the run reading each address (by a tensor's start: a reader through
  // a view at another start is missed, which only costs a download).
  std::unordered_map<uintptr_t, size_t> last_reader;
  for (size_t j = first_; j < first_ + count_; ++j)
    for (int s = 0; s < int(kMaxSrc); ++s)
      if (nodes[j].src[s] >= 0) last_reader[reinterpret_cast<uintptr_t>(T(nodes[j].src[s]).data)] = j;
  for (size_t k = first_; k < first_ + count_; ++k) {
    const Node& n = nodes[k];
    if (n.dst < 0 || on_device(T(n.dst))) continue;
    const Range r = range_of(T(n.dst));
    const bool later = read_after(r);
    const auto it = last_reader.find(r.lo);
    const bool inside = it != last_reader.end() && it->second > k;
    static const bool all = std::getenv("TESSERA_VULKAN_DEBUG_ALL") != nullptr;
    if (all || later || !inside) downloads_.push_back({T(n.dst).data, size_t(r.hi - r.lo), dev(T(n.dst))});
  }
}

void Run::dispatch(VkCommandBuffer cb, const std::string& pipe, VkBuffer b1, const Push& pc, uint64_t groups, Access acc,
                   VkBuffer b2, VkBuffer b3) {
  const Functions& f = ctx_.fn();
  if (groups == 0) return;
  bool hazard = false;
  for (const Range& r : acc.reads)
    for (const Range& w : pend_writes_) hazard |= r.overlaps(w);
  for (const Range& r : acc.writes) {
    for (const Range& w : pend_writes_) hazard |= r.overlaps(w);
    for (const Range& w : pend_reads_) hazard |= r.overlaps(w);
  }
  if (hazard) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    f.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                           nullptr, 0, nullptr);
    pend_reads_.clear();
    pend_writes_.clear();
  }
  pend_reads_.insert(pend_reads_.end(), acc.reads.begin(), acc.reads.end());
  pend_writes_.insert(pend_writes_.end(), acc.writes.begin(), acc.writes.end());

  const VkBuffer arena = be_.arena_.buffer;
  auto it = sets_.find(SetKey{b1, b2 ? b2 : arena, b3 ? b3 : arena});
  if (it == sets_.end()) throw Error("vulkan: internal error: no descriptor set");
  f.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, ctx_.pipeline(pipe));
  f.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, ctx_.pipeline_layout(), 0, 1, &it->second, 0, nullptr);
  f.vkCmdPushConstants(cb, ctx_.pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes, pc.u);
  const uint64_t gx = std::min<uint64_t>(groups, 65535);
  const uint64_t gy = (groups + gx - 1) / gx;
  if (gy > 65535) throw Error("vulkan: dispatch of " + std::to_string(groups) + " work groups is too large");
  f.vkCmdDispatch(cb, uint32_t(gx), uint32_t(gy), 1);
}

void Run::record_node(VkCommandBuffer cb, size_t k) {
  const Node& n = g_.nodes()[k];
  const VkBuffer arena = be_.arena_.buffer;
  auto cdiv = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
  // Binding 1 and the byte offset of a weight-role source.
  auto wsrc = [&](int slot, VkBuffer& b1, uint64_t& off, std::vector<Range>& reads) {
    if (is_weight(n, slot)) {
      b1 = be_.weights_.at(VulkanBackend::weight_key(T(n.src[slot]))).buf.buffer;
      off = 0;
    } else {
      b1 = arena;
      off = dev(T(n.src[slot]));
      reads.push_back(devr(T(n.src[slot])));
    }
  };
  switch (n.op) {
    case Op::Silu:
    case Op::Sigmoid:
    case Op::Softplus:
    case Op::SwiGlu:
    case Op::GeGlu:
    case Op::SwiGluOai:
    case Op::Add:
    case Op::Mul: {
      const Tensor &a = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(a.nelements()).add(dev(a)).add(n.src[1] >= 0 ? dev(T(n.src[1])) : 0).add(dev(d));
      for (int i = 0; i < 4; ++i) pc.add(a.ne[i]);
      for (int i = 0; i < 4; ++i) pc.add(n.src[1] >= 0 ? T(n.src[1]).ne[i] : 1);
      pc.addf(n.f[0]).addf(n.f[1]);  // SwiGluOai's alpha and limit
      Access acc{{devr(a)}, {devr(d)}};
      if (n.src[1] >= 0) acc.reads.push_back(devr(T(n.src[1])));
      const char* p = n.op == Op::Silu      ? "silu"
                      : n.op == Op::Sigmoid ? "sigmoid"
                      : n.op == Op::Softplus ? "softplus"
                      : n.op == Op::SwiGlu  ? "swiglu"
                      : n.op == Op::GeGlu   ? "geglu"
                      : n.op == Op::SwiGluOai ? "swiglu_oai"
                      : n.op == Op::Add     ? "add"
                                            : "mul";
      dispatch(cb, p, arena, pc, cdiv(a.nelements(), 256), acc);
      break;
    }
    case Op::RmsNorm: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Access acc{{devr(x)}, {devr(d)}};
      VkBuffer b1 = arena;
      uint64_t woff = 0xFFFFFFFFu;
      if (n.src[1] >= 0) wsrc(1, b1, woff, acc.reads);
      Push pc;
      pc.add(x.ne[0]).add(x.nrows()).add(dev(x)).add(woff).add(dev(d)).addf(n.f[0]);
      dispatch(cb, "rms_norm", b1, pc, x.nrows(), acc);
      break;
    }
    case Op::Cont: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(x.nelements()).add(dev(x)).add(dev(d));
      for (int i = 0; i < 4; ++i) pc.add(x.ne[i]);
      for (int i = 1; i < 4; ++i) pc.add(x.nb[i]);
      dispatch(cb, "cont", arena, pc, cdiv(x.nelements(), 256), {{devr(x)}, {devr(d)}});
      break;
    }
    case Op::Concat: {
      const Tensor &x = T(n.src[0]), &y = T(n.src[1]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(y.ne[0]).add(d.nrows()).add(dev(x)).add(dev(y)).add(dev(d));
      dispatch(cb, "concat", arena, pc, cdiv(d.nelements(), 256), {{devr(x), devr(y)}, {devr(d)}});
      break;
    }
    case Op::GroupLimit: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(n.i[0]).add(n.i[1]).add(x.nrows()).add(dev(x)).add(dev(d));
      dispatch(cb, "group_limit", arena, pc, cdiv(x.nrows(), 64), {{devr(x)}, {devr(d)}});
      break;
    }
    case Op::NormalizeRows: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(x.nrows()).add(dev(x)).add(dev(d)).addf(n.f[0]).addf(n.f[1]);
      dispatch(cb, "normalize_rows", arena, pc, cdiv(x.nrows(), 64), {{devr(x)}, {devr(d)}});
      break;
    }
    case Op::Softmax:
    case Op::Argmax: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(x.nrows()).add(dev(x)).add(dev(d));
      dispatch(cb, n.op == Op::Softmax ? "softmax" : "argmax", arena, pc, x.nrows(), {{devr(x)}, {devr(d)}});
      break;
    }
    case Op::GetRows: {
      const Tensor &tab = T(n.src[0]), &ids = T(n.src[1]), &d = T(n.dst);
      Access acc{{devr(ids)}, {devr(d)}};
      VkBuffer b1;
      uint64_t toff;
      wsrc(0, b1, toff, acc.reads);
      Push pc;
      pc.add(tab.ne[0]).add(ids.ne[0]).add(tab.ne[1]).add(toff).add(tab.nb[1]).add(dev(ids)).add(dev(d));
      dispatch(cb, std::string("get_rows_") + type_suffix(tab.type), b1, pc, cdiv(uint64_t(tab.ne[0]) * ids.ne[0], 256), acc);
      break;
    }
    case Op::MatMul:
    case Op::MatMulId: {
      const bool ids = n.op == Op::MatMulId;
      const Tensor &w = T(n.src[0]), &x = T(n.src[1]), &d = T(n.dst);
      const uint64_t K = w.ne[0], N = w.ne[1];
      const uint64_t rows = ids ? uint64_t(T(n.src[2]).ne[0] * T(n.src[2]).ne[1]) : uint64_t(x.nrows());
      uint64_t xoff = dev(x), xstride = K * 4;
      Range xr = devr(x);
      if (is_quantized(w.type)) {
        const uint64_t qk = act_block(w.type), qrow = act_row_bytes(w.type, K), q = node_scratch_.at(k);
        Push qp;
        qp.add(K).add(x.nrows()).add(dev(x)).add(K * 4).add(q).add(qrow);
        const Range qr{uintptr_t(q), uintptr_t(q + qrow * x.nrows())};
        dispatch(cb, act_shader(w.type), arena, qp, cdiv(uint64_t(x.nrows()) * (K / qk), 64), {{devr(x)}, {qr}});
        xoff = q;
        xstride = qrow;
        xr = qr;
      }
      Access acc{{xr}, {devr(d)}};
      VkBuffer b1;
      uint64_t woff;
      wsrc(0, b1, woff, acc.reads);
      Push pc;
      pc.add(K).add(N).add(rows).add(woff).add(w.nb[1]).add(ids ? w.nb[2] : 0).add(xoff).add(xstride).add(dev(d));
      if (ids) {
        acc.reads.push_back(devr(T(n.src[2])));
        pc.add(dev(T(n.src[2]))).add(T(n.src[2]).ne[0]).add(x.ne[1]).add(w.ne[2]);
      }
      dispatch(cb, std::string(ids ? "matmul_id_" : "matmul_") + type_suffix(w.type), b1, pc, cdiv(N * rows, 8), acc);
      break;
    }
    case Op::Rope: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      const VkDeviceSize cs = node_scratch_.at(k);
      Push pc;
      pc.add(x.ne[0]).add(x.ne[1]).add(x.ne[2]).add(n.i[0]).add(n.i[1] == kRopeNeox || n.i[1] == kRopeImrope ? 1 : 0).add(dev(x)).add(dev(d)).add(cs);
      const Range csr{uintptr_t(cs), uintptr_t(cs + 4 * x.ne[2] * n.i[0])};
      dispatch(cb, "rope", arena, pc, cdiv(x.nelements(), 256), {{devr(x), csr}, {devr(d)}});
      break;
    }
    case Op::KvWrite: {
      const Tensor &x = T(n.src[0]), &slots = T(n.src[1]), &c = T(n.dst);
      const DeviceKvBuffer& kb = *be_.kv_buffer(c);
      Push pc;
      pc.add(c.ne[0]).add(x.ne[2]).add(dev(x)).add(dev(slots)).add(c.nb[1]).add(c.nb[2]).add(c.ne[1]);
      dispatch(cb, "kv_write", arena, pc, cdiv(uint64_t(c.ne[0]) * x.ne[2] / 2, 256), {{devr(x), devr(slots)}, {kb.range()}},
               kb.buffer());
      break;
    }
    case Op::Attention: {
      const Tensor &q = T(n.src[0]), &kc = T(n.src[1]), &vc = T(n.src[2]), &table = T(n.src[3]), &d = T(n.dst);
      const DeviceKvBuffer &kb = *be_.kv_buffer(kc), &vb = *be_.kv_buffer(vc);
      Push pc;
      pc.add(q.ne[0]).add(q.ne[1]).add(q.ne[2]).add(q.ne[1] / (kc.ne[0] / q.ne[0])).add(dev(q)).add(dev(d))
          .add(dev(table)).add(table.ne[0]).add(table.ne[1]).add(kc.nb[1]).add(kc.nb[2]).add(kc.ne[1]).addf(n.f[0])
          .add(n.i[0]).add(n.src[4] >= 0 ? dev(T(n.src[4])) : 0xFFFFFFFFu).add(d.ne[0]);
      Access acc{{devr(q), devr(table), kb.range(), vb.range()}, {devr(d)}};
      if (n.src[4] >= 0) acc.reads.push_back(devr(T(n.src[4])));
      dispatch(cb, "attention", arena, pc, uint64_t(q.ne[1]) * q.ne[2], acc, kb.buffer(), vb.buffer());
      break;
    }
    case Op::SsmConv: {
      const Tensor &x = T(n.src[0]), &w = T(n.src[1]), &d = T(n.dst);
      StateMirror& m = state_mirror(n);
      Access acc{{devr(x), {uintptr_t(m.dev), uintptr_t(m.dev + m.bytes)}}, {devr(d), {uintptr_t(m.dev), uintptr_t(m.dev + m.bytes)}}};
      VkBuffer b1;
      uint64_t woff;
      wsrc(1, b1, woff, acc.reads);
      Push pc;
      pc.add(x.ne[0]).add(x.ne[1]).add(w.ne[0]).add(dev(x)).add(woff).add(dev(d)).add(m.dev);
      dispatch(cb, "ssm_conv", b1, pc, cdiv(x.ne[0], 64), acc);
      break;
    }
    case Op::GatedDeltaNet: {
      const Tensor &qkv = T(n.src[0]), &gt = T(n.src[1]), &beta = T(n.src[2]), &d = T(n.dst);
      StateMirror& m = state_mirror(n);
      const int64_t S = n.i[3];
      Push pc;
      pc.add(S).add(n.i[2]).add(d.ne[1]).add(qkv.ne[1]).add(dev(qkv)).add(dev(gt)).add(dev(beta)).add(dev(d)).add(m.dev)
          .addf(n.f[0]).addf(1.0f / std::sqrt(float(S)));
      const Range sr{uintptr_t(m.dev), uintptr_t(m.dev + m.bytes)};
      dispatch(cb, "gated_delta_net", arena, pc, d.ne[1], {{devr(qkv), devr(gt), devr(beta), sr}, {devr(d), sr}});
      break;
    }
    case Op::TopK: {
      const Tensor &x = T(n.src[0]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(x.ne[1]).add(d.ne[0]).add(dev(x)).add(dev(d));
      dispatch(cb, "top_k", arena, pc, cdiv(x.ne[1], 64), {{devr(x)}, {devr(d)}});
      break;
    }
    case Op::GatherCols: {
      const Tensor &x = T(n.src[0]), &ids = T(n.src[1]), &d = T(n.dst);
      Push pc;
      pc.add(x.ne[0]).add(ids.ne[0]).add(ids.ne[1]).add(dev(x)).add(dev(ids)).add(dev(d));
      dispatch(cb, "gather_cols", arena, pc, cdiv(ids.nelements(), 64), {{devr(x), devr(ids)}, {devr(d)}});
      break;
    }
    case Op::MoeCombine: {
      const Tensor &e = T(n.src[0]), &wt = T(n.src[1]), &d = T(n.dst);
      Push pc;
      pc.add(e.ne[0]).add(e.ne[1]).add(e.ne[2]).add(dev(e)).add(dev(wt)).add(dev(d));
      dispatch(cb, "moe_combine", arena, pc, cdiv(uint64_t(e.ne[0]) * e.ne[2], 256), {{devr(e), devr(wt)}, {devr(d)}});
      break;
    }
    default:
      throw Error("vulkan: " + describe_node(g_, k) + ": op not implemented");
  }
}

void Run::go() {
  const Functions& f = ctx_.fn();
  const auto& nodes = g_.nodes();
  for (const Node& n : nodes)
    if (n.dst >= 0 && T(n.dst).data) graph_writes_.push_back(range_of(T(n.dst)));
  // Weights first (synchronous uploads, before the run's command buffer is recorded).
  for (size_t k = first_; k < first_ + count_; ++k)
    for (int s = 0; s < int(nodes[k].src.size()); ++s)
      if (nodes[k].src[s] >= 0 && is_weight(nodes[k], s)) be_.ensure_weight(T(nodes[k].src[s]));

  plan();
  be_.ensure_arena(std::max<VkDeviceSize>(cursor_, 16));

  // Staging: uploads, then downloads.
  VkDeviceSize st = 0;
  for (Upload& u : uploads_) {
    u.stage = st;
    st = align_up(st + u.bytes, 16);
  }
  for (Download& d : downloads_) {
    d.stage = st;
    st = align_up(st + d.bytes, 16);
  }
  be_.ensure_staging(std::max<VkDeviceSize>(st, 16));
  auto* stage = static_cast<uint8_t*>(be_.staging_.mapped);
  for (const Upload& u : uploads_) std::memcpy(stage + u.stage, u.owned.empty() ? u.src : u.owned.data(), u.bytes);
  for (const Upload& u : uploads_) be_.transfers_.upload_bytes += u.bytes;
  for (const Download& d : downloads_) be_.transfers_.download_bytes += d.bytes;

  // Descriptor sets: one per distinct (binding 1, 2, 3) buffers: the arena itself or a
  // weight at 1, a layer's K and V storage at 2 and 3 (else the arena).
  const VkBuffer arena = be_.arena_.buffer;
  std::vector<SetKey> keys{{arena, arena, arena}};
  auto want = [&](const SetKey& key) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  };
  for (size_t k = first_; k < first_ + count_; ++k) {
    const Node& n = nodes[k];
    for (int s = 0; s < int(kMaxSrc); ++s)
      if (n.src[s] >= 0 && is_weight(n, s))
        want({be_.weights_.at(VulkanBackend::weight_key(T(n.src[s]))).buf.buffer, arena, arena});
    if (n.op == Op::KvWrite) want({arena, be_.kv_buffer(T(n.dst))->buffer(), arena});
    if (n.op == Op::Attention)
      want({arena, be_.kv_buffer(T(n.src[1]))->buffer(), be_.kv_buffer(T(n.src[2]))->buffer()});
  }
  if (be_.pool_sets_ < keys.size()) {
    if (be_.pool_) f.vkDestroyDescriptorPool(ctx_.device(), be_.pool_, nullptr);
    be_.pool_ = VK_NULL_HANDLE;
    const uint32_t cap = uint32_t(std::max<size_t>(64, keys.size() * 2));
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, cap * kBindings};
    VkDescriptorPoolCreateInfo pci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pci.maxSets = cap;
    pci.poolSizeCount = 1;
    pci.pPoolSizes = &ps;
    check(f.vkCreateDescriptorPool(ctx_.device(), &pci, nullptr, &be_.pool_), "vkCreateDescriptorPool");
    be_.pool_sets_ = cap;
  } else {
    check(f.vkResetDescriptorPool(ctx_.device(), be_.pool_, 0), "vkResetDescriptorPool");
  }
  for (const SetKey& key : keys) {
    VkDescriptorSetLayout layout = ctx_.set_layout();
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = be_.pool_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set;
    check(f.vkAllocateDescriptorSets(ctx_.device(), &ai, &set), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo bi[kBindings] = {
        {arena, 0, VK_WHOLE_SIZE}, {key[0], 0, VK_WHOLE_SIZE}, {key[1], 0, VK_WHOLE_SIZE}, {key[2], 0, VK_WHOLE_SIZE}};
    VkWriteDescriptorSet wr[kBindings]{};
    for (uint32_t i = 0; i < kBindings; ++i) {
      wr[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      wr[i].dstSet = set;
      wr[i].dstBinding = i;
      wr[i].descriptorCount = 1;
      wr[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      wr[i].pBufferInfo = &bi[i];
    }
    f.vkUpdateDescriptorSets(ctx_.device(), kBindings, wr, 0, nullptr);
    sets_[key] = set;
  }

  // Record: uploads, the nodes (barriers only where a dispatch depends on an earlier
  // one), downloads; one submission.
  VkCommandBuffer cb = ctx_.begin();
  std::vector<VkBufferCopy> copies;
  for (const Upload& u : uploads_)
    if (u.bytes) copies.push_back({u.stage, u.dev, u.bytes});
  if (!copies.empty()) {
    f.vkCmdCopyBuffer(cb, be_.staging_.buffer, be_.arena_.buffer, uint32_t(copies.size()), copies.data());
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    f.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }
  for (size_t k = first_; k < first_ + count_; ++k) {
    try {
      record_node(cb, k);
    } catch (const Error& e) {
      f.vkEndCommandBuffer(cb);
      throw Error(std::string(e.what()) + " (" + describe_node(g_, k) + ")");
    }
  }
  copies.clear();
  for (const Download& d : downloads_)
    if (d.bytes) copies.push_back({d.dev, d.stage, d.bytes});
  if (!copies.empty()) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
    f.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    f.vkCmdCopyBuffer(cb, be_.arena_.buffer, be_.staging_.buffer, uint32_t(copies.size()), copies.data());
    VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    hb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    f.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
  }
  ctx_.submit_and_wait();
  for (const Download& d : downloads_) std::memcpy(d.dst, stage + d.stage, d.bytes);
}

// Nodes [first, first + count) are valid, supported and ready to run (execute() and
// execute_validated() made sure).
void VulkanBackend::run_range(Graph& g, size_t first, size_t count) {
  const auto& nodes = g.nodes();
  if (count == 0) return;
  static const bool debug_trace = std::getenv("TESSERA_VULKAN_DEBUG_TRACE") != nullptr;
  if (debug_trace) {
    std::string s = "vulkan run [" + std::to_string(first) + ", " + std::to_string(first + count) + "):";
    for (size_t k = first; k < first + count; ++k) {
      s += "\n  " + describe_node(g, k);
      for (int32_t t : {nodes[k].src[0], nodes[k].src[1], nodes[k].src[2], nodes[k].dst}) {
        if (t < 0) { s += " -"; continue; }
        const Range r = range_of(g.tensor(t));
        s += " [" + std::to_string(r.lo % 1000000) + "," + std::to_string(r.hi % 1000000) + ")";
      }
    }
    spdlog::warn("{}", s);
  }
  Run run(*this, g, first, count);
  run.go();
}

}  // namespace

std::unique_ptr<Backend> make_backend(bool allow_cpu) { return std::make_unique<VulkanBackend>(allow_cpu); }

}  // namespace tessera::vk
