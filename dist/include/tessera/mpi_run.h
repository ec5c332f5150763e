// Joining a distributed run started by `mpirun` (docs/distributed.md).
#pragma once
#include <memory>

#include "tessera/rank_group.h"

namespace tessera::dist {

// True when an MPI launcher started this process as one of several (Open MPI's, PMIx's
// or PMI's environment says so); a plain start is never a distributed run.
bool launched_with_ranks();

// Joins the run: the group of every process the launcher started. Its destructor
// leaves MPI. Throws tessera::Error when this build has no MPI, or the MPI library
// cannot be called from the engine's thread.
std::shared_ptr<RankGroup> join();

}  // namespace tessera::dist
