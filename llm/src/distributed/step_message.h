// What rank 0 sends the other ranks of a distributed run before each forward step: the
// KV cache's bookkeeping calls since the last step (which they replay) and the step's
// chunks. A byte layout of its own: every rank runs the same build.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/kv_cache.h"

namespace tessera::detail {

struct StepChunk {
  KvCache::SeqId seq = 0;
  std::vector<int32_t> tokens;
};

struct StepMessage {
  bool quit = false;  // the run is over: the other ranks return
  std::vector<KvCache::Call> calls;
  std::vector<StepChunk> chunks;
};

std::vector<uint8_t> encode(const StepMessage& m);
// Throws tessera::Error on bytes encode() did not make.
StepMessage decode(const std::vector<uint8_t>& bytes);

}  // namespace tessera::detail
