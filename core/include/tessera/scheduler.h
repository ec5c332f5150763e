// Validates a graph against the op schema (op_schema.h) once per plan, places each
// node on the best-ranked backend that runs it natively, falling back down the
// ranking, and runs consecutive nodes on the same backend as one execute_validated()
// call after checking their run-time state. Copies between host and device backends
// are the job of the device backend's execute() (host tensors in, host tensors out)
// until a device backend needs more.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/backend.h"

namespace tessera {

// Time per (backend, op) accumulated by a profiled Scheduler::run(). The graph's host
// hooks (e.g. reading streamed experts) are recorded as backend "host" under the op
// of the node they precede.
struct OpProfile {
  struct Stat {
    uint64_t ns = 0;     // total nanoseconds (std::chrono::steady_clock)
    uint64_t nodes = 0;  // nodes executed
  };
  std::map<std::pair<std::string, Op>, Stat> stats;

  void add(std::string_view backend, Op op, uint64_t ns);
  void clear() { stats.clear(); }
  // Nodes / nanoseconds recorded for (backend, op), 0 when none.
  uint64_t nodes(std::string_view backend, Op op) const;
  uint64_t ns(std::string_view backend, Op op) const;
  uint64_t total_ns() const;
  // One line per (backend, op), by time descending: backend, op, nodes, total ms,
  // percent of the total; then a total line.
  std::string table() const;
};

class Scheduler {
 public:
  // backends in rank order, best first.
  explicit Scheduler(std::vector<std::shared_ptr<Backend>> backends);

  const std::vector<std::shared_ptr<Backend>>& backends() const { return backends_; }

  // Backend index for each node. Computing a placement first checks every node with
  // op_schema::check() (a node that breaks its op's contract throws tessera::Error
  // "node K (op -> 'dst') breaks the op schema: <op>: <reason>" before any backend is
  // asked), then asks the backends in rank order whether they run it natively; throws
  // tessera::Error naming the node and every backend's reason if none does.
  //
  // Placements are cached by a 64-bit signature of the graph's topology, so a graph
  // of a shape seen before is neither validated again nor placed again. The
  // signature covers the node count and, per node, the op, the src/dst tensor
  // indices, i[] and f[], the kv pointer and the shape of that cache's configuration
  // (layers, KV heads, head size, recurrent layers and state sizes), and for every
  // tensor a node names its dtype, ne[], nb[], its buffer and whether its data is
  // null. It leaves out what changes every step without changing the topology: i[1]
  // (sequence) of SsmConv and GatedDeltaNet. KvWrite and Attention take their slots and
  // block tables as I32 tensors, so a step's mix of sequences changes only their data.
  // It does not cover tensor names, data addresses or any tensor's contents: those are
  // op_schema::check_run_state()'s, before every run.
  // Assumption: a backend's supports() depends only on what the signature covers
  // (a backend whose answer depends on anything else, say the context length an
  // Attention node reaches, must not be used with this cache). Errors are never
  // cached. At most kPlanCacheSize placements are kept (the cache is cleared when
  // full). The cache makes place(), run() and describe() unsafe to call on one
  // Scheduler from several threads at once.
  std::vector<int> place(const Graph& graph) const;
  // Place and execute the whole graph. Before each run of consecutive nodes on one
  // backend, every node of it passes op_schema::check_run_state() (throws
  // tessera::Error "node K (op -> 'dst'): <reason>" otherwise); the run then goes to
  // the backend's execute_validated(), which need not check anything the schema
  // covers.
  void run(Graph& graph) const;
  // Human-readable placement: one line per node "op -> backend".
  std::string describe(const Graph& graph) const;

  // The topology signature place() caches by (see above).
  static uint64_t signature(const Graph& graph);
  static constexpr size_t kPlanCacheSize = 64;
  size_t plan_hits() const { return plan_hits_; }
  size_t plan_misses() const { return plan_misses_; }
  // Nodes checked with op_schema::check() by this scheduler (once per node of each
  // placement computed; a cache hit checks none).
  size_t nodes_validated() const { return nodes_validated_; }

  // What each backend (rank order, as backends()) was given over every placement
  // computed so far: nodes placed on it, nodes it was asked about and declined, and the
  // first reason it gave. A backend asked about nodes that declined every one of them
  // is also logged once (spdlog warning): its nodes ran on the backends after it.
  struct BackendUse {
    size_t placed = 0;
    size_t declined = 0;
    std::string first_decline;
  };
  const std::vector<BackendUse>& usage() const { return usage_; }
  // True when backend b was asked about at least one node and declined them all.
  bool declines_everything(size_t b) const { return usage_.at(b).placed == 0 && usage_.at(b).declined > 0; }

  // With a profile set (nullptr = off), run() executes every node as its own
  // execute_validated() call, timed with std::chrono::steady_clock, and adds its time
  // to the profile under (backend name, op). This disables a backend's fusion across nodes
  // (and a GPU backend's single submission per run), so a profiled step is a little
  // slower than an unprofiled one. The profile must outlive its use here.
  void set_profile(OpProfile* profile) { profile_ = profile; }
  OpProfile* profile() const { return profile_; }

 private:
  // The cached placement for graph (computed and stored on a miss). The reference
  // stays valid until the next call.
  const std::vector<int>& placement(const Graph& graph) const;
  std::vector<int> compute_placement(const Graph& graph) const;

  std::vector<std::shared_ptr<Backend>> backends_;
  mutable std::unordered_map<uint64_t, std::vector<int>> plans_;
  mutable size_t plan_hits_ = 0, plan_misses_ = 0, nodes_validated_ = 0;
  mutable std::vector<BackendUse> usage_;
  mutable std::vector<bool> warned_idle_;
  OpProfile* profile_ = nullptr;
};

}  // namespace tessera
