// Scheduler: places each node on the first backend (in rank order) that supports it
// and executes maximal runs of consecutive nodes on the same backend as one call.
#include "tessera/scheduler.h"

#include <sstream>

#include "tessera/error.h"

namespace tessera {

Scheduler::Scheduler(std::vector<std::shared_ptr<Backend>> backends) : backends_(std::move(backends)) {
  for (const auto& b : backends_)
    if (!b) throw Error("scheduler: null backend in the backend list");
}

std::vector<int> Scheduler::place(const Graph& graph) const {
  const auto& nodes = graph.nodes();
  std::vector<int> placement(nodes.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    std::vector<std::string> reasons;
    for (size_t b = 0; b < backends_.size(); ++b) {
      OpSupport s = backends_[b]->supports(graph, node);
      if (s.supported) {
        placement[n] = int(b);
        break;
      }
      reasons.push_back(backends_[b]->name() + ": " + (s.reason.empty() ? "unsupported" : s.reason));
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
  return placement;
}

void Scheduler::run(Graph& graph) const {
  const std::vector<int> placement = place(graph);
  size_t first = 0;
  while (first < placement.size()) {
    size_t end = first + 1;
    while (end < placement.size() && placement[end] == placement[first]) ++end;
    backends_[size_t(placement[first])]->execute(graph, first, end - first);
    first = end;
  }
}

std::string Scheduler::describe(const Graph& graph) const {
  const std::vector<int> placement = place(graph);
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
