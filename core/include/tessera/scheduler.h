// Places each node of a graph on the best-ranked backend that supports it, falling
// back down the ranking; runs consecutive nodes on the same backend as one
// execute() call. Copies between host and device backends are the job of the device
// backend's execute() (host tensors in, host tensors out) until a device backend
// needs more.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tessera/backend.h"

namespace tessera {

class Scheduler {
 public:
  // backends in rank order, best first.
  explicit Scheduler(std::vector<std::shared_ptr<Backend>> backends);

  const std::vector<std::shared_ptr<Backend>>& backends() const { return backends_; }

  // Backend index for each node; throws tessera::Error naming the node and every
  // backend's reason if no backend supports it.
  std::vector<int> place(const Graph& graph) const;
  // Place and execute the whole graph.
  void run(Graph& graph) const;
  // Human-readable placement: one line per node "op -> backend".
  std::string describe(const Graph& graph) const;

 private:
  std::vector<std::shared_ptr<Backend>> backends_;
};

}  // namespace tessera
