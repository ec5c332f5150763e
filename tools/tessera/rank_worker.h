// Distributed runs from the command line (docs/distributed.md): `mpirun -np N tessera
// COMMAND ...` starts N copies. Rank 0 runs COMMAND as usual; the others never run it:
// they load what rank 0 loads and replay its forward steps, printing nothing but errors.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/engine.h"
#include "tessera/rank_group.h"

namespace tessera::cli {

// The run's group when started by an MPI launcher with several processes, else null.
// Setting a group exchanges every rank's memory budget (every rank calls it at start).
void set_rank_group(std::shared_ptr<RankGroup> group);
std::shared_ptr<RankGroup> rank_group();
// Every rank's memory budget in bytes, rank by rank (empty outside a distributed run).
const std::vector<uint64_t>& rank_memory();

// Rank 0, after making an engine of a distributed run: tells the other ranks what to
// load (the model, the resolved sizes and the backends that rank 0 runs on).
void send_engine_setup(const EngineOptions& options, const Engine& engine);
// Rank 0, before it exits: the other ranks load no more engines and exit with `rc`.
void finish_ranks(int rc);

// A rank other than 0: its whole process. argv: the command's arguments (the common
// options are read from them; the rest are the command's, for rank 0). Returns the
// exit status.
int run_rank_worker(int argc, char** argv);

}  // namespace tessera::cli
