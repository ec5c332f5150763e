// cpu_scalar: the reference ("oracle") backend. Every op of graph.h in plain,
// portable C++, following the reference arithmetic conventions (shared fixtures
// README): activations converted once per row to the weight's vec_dot type, F16 KV
// cache with F16-rounded Q, F32 softmax, RMS sums in double. Clear before fast; the
// only parallelism is over independent outputs (each computed by one thread in a
// fixed order), so results are bit-identical for any thread count.
#pragma once
#include <memory>

#include "tessera/backend.h"

namespace tessera {
class FastPool;
}

namespace tessera::cpu_scalar {

// The ops whose validation reads more than Scheduler::signature() covers: the KV
// cache's or recurrent state's configuration (through node.kv, of which the signature
// holds only the address) and the start position i[2]. execute_validated() of
// cpu_scalar, cpu_avx512 and vulkan still validates these nodes in full (a few per
// layer); it skips the checks of every other op.
inline bool validation_reads_run_state(Op op) {
  return op == Op::KvWrite || op == Op::Attention || op == Op::SsmConv || op == Op::GatedDeltaNet;
}

// Creates the backend object directly (used by the plugin's create() and by tests).
// `pool` may be null: everything then runs on the calling thread.
std::unique_ptr<Backend> make_backend(FastPool* pool);

}  // namespace tessera::cpu_scalar
