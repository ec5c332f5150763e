// A Backend that runs ranges of nodes, with the two entry points the Backend interface
// has: execute() (outside callers) validates the range first, execute_validated() (the
// scheduler, whose plans are validated once) checks only that the range lies inside
// the graph and what the backend says its plan signature does not cover. Both then
// run the range.
#pragma once
#include <cstddef>

#include "tessera/backend.h"
#include "tessera/graph.h"
#include "tessera/op_schema.h"

namespace tessera {

class RangeBackend : public Backend {
 public:
  void execute(Graph& graph, size_t first, size_t count) final {
    op_schema::validate_for_execute(*this, graph, first, count);
    run_range(graph, first, count);
  }
  void execute_validated(Graph& graph, size_t first, size_t count) final {
    op_schema::check_range(name().c_str(), graph, first, count);
    check_unsigned(graph, first, count);
    run_range(graph, first, count);
  }

 protected:
  // Runs [first, first + count): every node is valid and supported. Ids read from
  // tensors that earlier nodes compute are checked where they are read.
  virtual void run_range(Graph& graph, size_t first, size_t count) = 0;
  // What supports() read that Scheduler::signature() leaves out, checked again for a
  // validated range (throws tessera::Error); nothing by default.
  virtual void check_unsigned(const Graph& graph, size_t first, size_t count) const {}
};

}  // namespace tessera
