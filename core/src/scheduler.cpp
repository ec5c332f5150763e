// Scheduler: validates each node against the op schema once per plan, places it on
// the first backend (in rank order) that runs it natively, and executes maximal runs
// of consecutive nodes on the same backend as one call after checking their run-time
// state. Placements are cached by the graph's topology signature; an optional
// OpProfile times every node on its own.
#include "tessera/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "tessera/error.h"
#include "tessera/kv_access.h"
#include "tessera/op_schema.h"

namespace tessera {

namespace {

// 64x64 -> 128-bit multiply folded to 64 bits (wyhash's mixer).
inline uint64_t mum(uint64_t a, uint64_t b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return uint64_t(r) ^ uint64_t(r >> 64);
}

// Streams 64-bit words into two independent multiply chains (four words per round),
// so the signature of a ~500-node graph costs a few microseconds.
class Hasher {
 public:
  void add(uint64_t v) {
    buf_[n_++] = v;
    if (n_ == 4) round();
  }
  void add2(int32_t a, int32_t b) { add(uint64_t(uint32_t(a)) | (uint64_t(uint32_t(b)) << 32)); }
  uint64_t finish() {
    while (n_ != 0) add(0);  // the stream is self-delimiting (see signature), so zero padding is fine
    return mum(h0_ ^ 0xa0761d6478bd642fULL, h1_ ^ 0xe7037ed1a0b428dbULL);
  }

 private:
  void round() {
    h0_ = mum(buf_[0] ^ h0_, buf_[1] ^ 0x8ebc6af09c88c6e3ULL);
    h1_ = mum(buf_[2] ^ h1_, buf_[3] ^ 0x589965cc75374cc3ULL);
    n_ = 0;
  }
  uint64_t h0_ = 0x243f6a8885a308d3ULL, h1_ = 0x13198a2e03707344ULL;
  uint64_t buf_[4] = {};
  int n_ = 0;
};

void hash_tensor(Hasher& h, const Graph& graph, int32_t index) {
  h.add2(index, -7);  // a marker word keeps a missing tensor distinct from any field
  if (index < 0 || size_t(index) >= graph.tensor_count()) return;
  const Tensor& t = graph.tensor(index);
  h.add(uint64_t(t.type) | (t.data ? 0 : uint64_t(1) << 32));
  // Which backend's memory holds it (the KV storage): part of where its readers run.
  h.add(uint64_t(reinterpret_cast<uintptr_t>(t.buffer)));
  for (int d = 0; d < Tensor::kMaxDims; ++d) h.add(uint64_t(t.ne[d]));
  for (int d = 0; d < Tensor::kMaxDims; ++d) h.add(uint64_t(t.nb[d]));
}

// The name of a tensor node names that lives in device memory (a buffer, no host
// address), or "".
std::string device_memory_tensor(const Graph& graph, const Node& node) {
  auto device = [&](int32_t i) { return i >= 0 && !graph.tensor(i).data && graph.tensor(i).buffer; };
  if (device(node.dst)) return graph.tensor(node.dst).name;
  for (int32_t s : node.src)
    if (device(s)) return graph.tensor(s).name;
  return {};
}

}  // namespace

// ---- OpProfile ----

void OpProfile::add(std::string_view backend, Op op, uint64_t ns) {
  Stat& s = stats[{std::string(backend), op}];
  s.ns += ns;
  ++s.nodes;
}

uint64_t OpProfile::nodes(std::string_view backend, Op op) const {
  auto it = stats.find({std::string(backend), op});
  return it == stats.end() ? 0 : it->second.nodes;
}

uint64_t OpProfile::ns(std::string_view backend, Op op) const {
  auto it = stats.find({std::string(backend), op});
  return it == stats.end() ? 0 : it->second.ns;
}

uint64_t OpProfile::total_ns() const {
  uint64_t t = 0;
  for (const auto& [key, s] : stats) t += s.ns;
  return t;
}

std::string OpProfile::table() const {
  std::vector<const std::pair<const std::pair<std::string, Op>, Stat>*> rows;
  rows.reserve(stats.size());
  size_t wb = 7, wo = 2;  // "backend", "op"
  uint64_t total = 0, total_nodes = 0;
  for (const auto& e : stats) {
    rows.push_back(&e);
    wb = std::max(wb, e.first.first.size());
    wo = std::max(wo, op_name(e.first.second).size());
    total += e.second.ns;
    total_nodes += e.second.nodes;
  }
  // Time descending; the map's order (backend, op) breaks ties.
  std::stable_sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->second.ns > b->second.ns; });
  std::string out;
  char line[512];
  auto emit = [&](std::string_view backend, std::string_view op, uint64_t nodes, uint64_t ns) {
    const double pct = total ? 100.0 * double(ns) / double(total) : 0.0;
    std::snprintf(line, sizeof line, "%-*.*s  %-*.*s  %8llu  %12.3f  %6.1f%%\n", int(wb), int(backend.size()),
                  backend.data(), int(wo), int(op.size()), op.data(), static_cast<unsigned long long>(nodes),
                  double(ns) / 1e6, pct);
    out += line;
  };
  std::snprintf(line, sizeof line, "%-*s  %-*s  %8s  %12s  %7s\n", int(wb), "backend", int(wo), "op", "nodes",
                "total ms", "percent");
  out += line;
  for (const auto* r : rows) emit(r->first.first, op_name(r->first.second), r->second.nodes, r->second.ns);
  emit("total", "", total_nodes, total);
  return out;
}

// ---- Scheduler ----

namespace {

// op_schema::check_run_state() over nodes [first, first + count), right before they run
// (after the host hooks before them, which may change what the nodes read).
void check_run_state(const Graph& graph, size_t first, size_t count) {
  const auto& nodes = graph.nodes();
  for (size_t k = first; k < first + count; ++k) {
    const std::string why = op_schema::check_run_state(graph, nodes[k]);
    if (!why.empty()) throw Error(describe_node(graph, k) + ": " + why);
  }
}

}  // namespace

Scheduler::Scheduler(std::vector<std::shared_ptr<Backend>> backends) : backends_(std::move(backends)) {
  for (const auto& b : backends_)
    if (!b) throw Error("scheduler: null backend in the backend list");
  usage_.resize(backends_.size());
  warned_idle_.assign(backends_.size(), false);
}

uint64_t Scheduler::signature(const Graph& graph) {
  const auto& nodes = graph.nodes();
  Hasher h;
  h.add(uint64_t(nodes.size()));
  for (const Node& n : nodes) {
    std::array<int32_t, 8> ip = n.i;
    switch (n.op) {
      case Op::SsmConv:
      case Op::GatedDeltaNet:  // sequence
        ip[1] = 0;
        break;
      default: break;
    }
    h.add2(int32_t(n.op), n.dst);
    h.add2(n.src[0], n.src[1]);
    h.add2(n.src[2], n.src[3]);
    h.add2(n.src[4], 0);
    for (size_t k = 0; k < ip.size(); k += 2) h.add2(ip[k], ip[k + 1]);
    uint32_t fb[4];
    static_assert(sizeof(fb) == sizeof(n.f));
    std::memcpy(fb, n.f.data(), sizeof(fb));
    h.add(uint64_t(fb[0]) | (uint64_t(fb[1]) << 32));
    h.add(uint64_t(fb[2]) | (uint64_t(fb[3]) << 32));
    h.add(uint64_t(reinterpret_cast<uintptr_t>(n.kv)));
    // The schema checks these ops' shapes against the cache's configuration, so it is
    // part of the plan (the address alone could be a new cache with another shape).
    if (n.kv && (n.op == Op::SsmConv || n.op == Op::GatedDeltaNet)) {
      const TesseraKvInfo& c = n.kv->config();
      const TesseraRecurrentInfo& r = n.kv->recurrent_config();
      h.add2(c.n_layers, c.n_kv_heads);
      h.add2(c.head_dim, r.n_layers);
      h.add(uint64_t(r.conv_elems));
      h.add(uint64_t(r.state_elems));
    }
    hash_tensor(h, graph, n.dst);
    for (int32_t s : n.src) hash_tensor(h, graph, s);
  }
  return h.finish();
}

std::vector<int> Scheduler::compute_placement(const Graph& graph) const {
  const auto& nodes = graph.nodes();
  // The contract first, for every node, so no backend is asked about a malformed one.
  for (size_t n = 0; n < nodes.size(); ++n) {
    ++nodes_validated_;
    const std::string why = op_schema::check(graph, nodes[n]);
    if (!why.empty()) throw Error(describe_node(graph, n) + " breaks the op schema: " + why);
  }
  std::vector<int> placement(nodes.size(), -1);
  std::vector<BackendUse> use(backends_.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    std::vector<std::string> reasons;
    const std::string device_tensor = device_memory_tensor(graph, node);
    for (size_t b = 0; b < backends_.size(); ++b) {
      // A tensor in a device's memory (the KV pages of a GPU backend) has no host
      // address: a host backend cannot run a node that names it.
      OpSupport s = !device_tensor.empty() && backends_[b]->uses_host_memory()
                        ? OpSupport::no("tensor '" + device_tensor + "' is in device memory")
                        : backends_[b]->supports(graph, node);
      if (s.supported) {
        placement[n] = int(b);
        ++use[b].placed;
        break;
      }
      if (s.reason.empty()) s.reason = std::string(op_name(node.op)) + ": unsupported";
      if (use[b].declined++ == 0) use[b].first_decline = s.reason;
      reasons.push_back(backends_[b]->name() + ": " + s.reason);
    }
    if (placement[n] >= 0) continue;
    std::ostringstream os;
    os << "no backend supports node " << n << " (" << op_name(node.op);
    if (node.dst >= 0 && size_t(node.dst) < graph.tensor_count() && !graph.tensor(node.dst).name.empty())
      os << " -> " << graph.tensor(node.dst).name;
    os << ")";
    if (backends_.empty()) {
      os << ": no backends loaded";
    } else {
      os << ": ";
      for (size_t i = 0; i < reasons.size(); ++i) os << (i ? "; " : "") << reasons[i];
    }
    throw Error(os.str());
  }
  // Counted only for placements that succeed (errors are not plans).
  for (size_t b = 0; b < backends_.size(); ++b) {
    BackendUse& u = usage_[b];
    u.placed += use[b].placed;
    if (u.declined == 0) u.first_decline = use[b].first_decline;
    u.declined += use[b].declined;
    if (declines_everything(b) && !warned_idle_[b]) {
      warned_idle_[b] = true;
      spdlog::warn("scheduler: backend '{}' declined every node it was asked about ({}; first: {}); they run on the "
                   "backends ranked after it",
                   backends_[b]->name(), u.declined, u.first_decline);
    }
  }
  return placement;
}

const std::vector<int>& Scheduler::placement(const Graph& graph) const {
  const uint64_t sig = signature(graph);
  if (auto it = plans_.find(sig); it != plans_.end()) {
    ++plan_hits_;
    return it->second;
  }
  ++plan_misses_;
  std::vector<int> p = compute_placement(graph);  // throws before anything is cached
  if (plans_.size() >= kPlanCacheSize) plans_.clear();
  return plans_.emplace(sig, std::move(p)).first->second;
}

std::vector<int> Scheduler::place(const Graph& graph) const { return placement(graph); }

void Scheduler::run(Graph& graph) const {
  const std::vector<int>& placement = this->placement(graph);
  // Host hooks, by the node they precede (a run of one backend stops before each).
  std::vector<std::pair<size_t, const Graph::HostHook*>> hooks;
  for (const auto& [node, hook] : graph.host_hooks()) hooks.emplace_back(node, &hook);
  std::stable_sort(hooks.begin(), hooks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t next_hook = 0;
  auto run_hooks_before = [&](size_t k) {
    while (next_hook < hooks.size() && hooks[next_hook].first <= k) (*hooks[next_hook++].second)(graph);
  };
  if (profile_) {
    std::vector<std::string> names;
    names.reserve(backends_.size());
    for (const auto& b : backends_) names.push_back(b->name());
    const auto& nodes = graph.nodes();
    for (size_t k = 0; k < placement.size(); ++k) {
      const auto h0 = std::chrono::steady_clock::now();
      const size_t hooks_before = next_hook;
      run_hooks_before(k);
      if (next_hook != hooks_before)
        profile_->add("host", nodes[k].op,
                      uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - h0).count()));
      const size_t b = size_t(placement[k]);
      check_run_state(graph, k, 1);
      const auto t0 = std::chrono::steady_clock::now();
      backends_[b]->execute_validated(graph, k, 1);
      const auto t1 = std::chrono::steady_clock::now();
      profile_->add(names[b], nodes[k].op,
                    uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    }
    run_hooks_before(placement.size());
    return;
  }
  size_t first = 0;
  while (first < placement.size()) {
    run_hooks_before(first);
    const size_t stop = next_hook < hooks.size() ? std::max(hooks[next_hook].first, first + 1) : placement.size();
    size_t end = first + 1;
    while (end < placement.size() && end < stop && placement[end] == placement[first]) ++end;
    check_run_state(graph, first, end - first);
    backends_[size_t(placement[first])]->execute_validated(graph, first, end - first);
    first = end;
  }
  run_hooks_before(placement.size());  // hooks after the last node
}

std::string Scheduler::describe(const Graph& graph) const {
  const std::vector<int>& placement = this->placement(graph);
  const auto& nodes = graph.nodes();
  std::ostringstream os;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    os << n << ' ' << op_name(node.op) << ' ';
    if (node.dst < 0 || size_t(node.dst) >= graph.tensor_count())
      os << '-';  // no destination (e.g. kv_write)
    else if (graph.tensor(node.dst).name.empty())
      os << 't' << node.dst;  // unnamed: its tensor index
    else
      os << graph.tensor(node.dst).name;
    os << " -> " << backends_[size_t(placement[n])]->name() << '\n';
  }
  return os.str();
}

}  // namespace tessera
