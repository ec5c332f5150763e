// The op schema: each op's contract (arity, dtypes, shapes, strides, parameters), the
// one definition every backend and the scheduler share. It is split by when a fact can
// change:
//
//  - check():           what Scheduler::signature() covers (ops, tensor dtypes, ne[], nb[],
//                       i[]/f[] parameters and the KV cache's configuration behind node.kv).
//                       The scheduler calls it once per plan, before it asks any backend.
//  - check_run_state(): what changes from step to step without changing the signature:
//                       data pointers, the sequence a KV or recurrent node names, its start
//                       position and the KV positions reserved for it. The scheduler calls
//                       it for every node of a run, right before the run executes.
//
// Ids stored inside tensors (GetRows rows, MatMulId experts, GatherCols columns) are
// data that earlier nodes of the same run may compute (a GPU backend records the whole
// run before any of it executes), so the kernels that read them check them.
//
// A backend's supports() is then only asked "do you run this node natively", about
// nodes that already satisfy check().
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/graph.h"

namespace tessera {

class Backend;

namespace op_schema {

// "" when node satisfies its op's contract, else "<op>: <reason>" (e.g. "rms_norm: eps
// (f[0]) must be a finite value >= 0"). Reads the graph's tensors (never their data)
// and node.kv's configuration; nothing that Scheduler::signature() leaves out.
std::string check(const Graph& graph, const Node& node);

// "" when the run-time state lets node execute now, else the reason: every src/dst
// tensor has data (or lives in a backend's buffer); a KvWrite's slots lie in its
// storage; an Attention's sequence table covers q's token rows once each and names
// pages of the storage for every position it reads; for SsmConv and GatedDeltaNet
// sequence i[1] exists. Assumes
// check() accepted the node (for this graph or one with the same signature).
std::string check_run_state(const Graph& graph, const Node& node);

// What a backend's execute() (callers that did not go through the scheduler) runs
// before computing: the range lies inside the graph, and each node of it passes
// check(), check_run_state() and be.supports(). Throws tessera::Error
// "<be.name()>: node K (op -> 'dst'): reason".
void validate_for_execute(const Backend& be, const Graph& graph, size_t first, size_t count);

// Throws tessera::Error "<backend>: node range [first, end) exceeds the graph's N nodes"
// when the range does not lie inside the graph (execute_validated's one check).
void check_range(const char* backend, const Graph& graph, size_t first, size_t count);

// Calls of check() in this process (all threads): tests assert that validation happens
// once per plan, not once per step.
uint64_t checks_made();

// "F32[8, 3] 'name'": how messages name a tensor.
std::string tensor_desc(const Tensor& t);

}  // namespace op_schema
}  // namespace tessera
