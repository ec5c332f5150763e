// cpu_scalar: the reference ("oracle") backend. Every op of graph.h in plain,
// portable C++, following the reference arithmetic conventions (shared fixtures
// README): activations converted once per row to the weight's vec_dot type, F16 KV
// cache with F16-rounded Q, F32 softmax, RMS sums in double. Clear before fast; the
// only parallelism is over independent outputs (each computed by one thread in a
// fixed order), so results are bit-identical for any thread count. It runs every node
// the core's op schema accepts. No other plugin includes this header or links its code
// (a backend never links another plugin); the unit tests do, to compare with it.
#pragma once
#include <memory>

#include "tessera/backend.h"
#include "tessera/pool_ref.h"

namespace tessera {
}

namespace tessera::cpu_scalar {

// Creates the backend object directly (used by the plugin's create() and by tests).
// `pool` may be null: everything then runs on the calling thread.
std::unique_ptr<Backend> make_backend(PoolRef pool);

}  // namespace tessera::cpu_scalar
