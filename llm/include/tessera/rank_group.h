// The processes one model runs over in a distributed run (docs/distributed.md): what
// the engine asks of them. Rank 0 owns everything a user sees (tokenization,
// scheduling, sampling, output) and sends each forward step to the other ranks, which
// replay it; every rank holds its share of the routed experts and they exchange the
// products of those experts inside the step. The MPI implementation lives in its own
// library (dist/); the core, the engine and the plugins do not depend on MPI.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessera {

struct RankTraffic {
  uint64_t bytes_sent = 0, bytes_received = 0;  // by this rank, payload only
  double seconds = 0;                           // inside broadcast() and all_gather()
  uint64_t exchanges = 0;                       // all_gather() calls
};

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank 0 passes `bytes`; every other rank gets them in `bytes` (resized).
  virtual void broadcast(std::vector<uint8_t>& bytes) = 0;
  // Every rank passes its own bytes (`mine`, counts[rank()] of them) and receives every
  // rank's in `all`, rank after rank (counts[r] bytes from rank r). Every rank passes
  // the same counts.
  virtual void all_gather(std::span<const uint8_t> mine, std::span<const size_t> counts, std::span<uint8_t> all) = 0;
  // Point to point (--split layers: each rank hands its layers' output to the next).
  // send() returns once the bytes are on their way (for large messages: once the
  // receiver takes them); send_async() copies them and returns at once, and
  // wait_sends() returns once every send_async() so far was delivered. Messages from
  // one rank to another arrive in the order sent, whichever call sent them. recv()
  // fills exactly `bytes`; the sender sends as many.
  virtual void send(int to, std::span<const uint8_t> bytes) = 0;
  virtual void send_async(int to, std::span<const uint8_t> bytes) = 0;
  virtual void wait_sends() = 0;
  virtual void recv(int from, std::span<uint8_t> bytes) = 0;
  // Ends the run on every rank after writing "rank R: message" to stderr (a rank that
  // cannot go on: the others would wait for it forever).
  [[noreturn]] virtual void abort(const std::string& message) = 0;
  virtual RankTraffic traffic() const = 0;
};

// How a distributed run shares the model out: every MoE layer's routed experts, or
// contiguous ranges of layers.
enum class Split : uint8_t { Experts, Layers };

// The layers [first, end) that `rank` of `ranks` runs with Split::Layers: contiguous
// ranges whose lengths differ by at most one, the longer ones first, so rank 0 (which
// also holds the embeddings and the output head) always has layers; with more ranks
// than layers the last ranks have none and pass the activations on.
struct LayerRange {
  int64_t first = 0, end = 0;
};
inline LayerRange layer_range(int64_t n_layer, int rank, int ranks) {
  return {(n_layer * rank + ranks - 1) / ranks, (n_layer * (rank + 1) + ranks - 1) / ranks};
}

// The same sized by each rank's memory (--split layers): rank r's share of the layers
// is proportional to the bytes its memory has for them, memory[r] (rank 0's less
// `fixed`, the embeddings and output head it also holds), in contiguous ranges in rank
// order, rank 0 with at least one layer. Every rank passes the same arguments. Without
// a budget for every rank (or none with room) the ranges are layer_range()'s.
inline LayerRange layer_range_by_memory(int64_t n_layer, int rank, std::span<const uint64_t> memory, uint64_t fixed) {
  const int ranks = int(memory.size());
  if (ranks < 1 || rank < 0 || rank >= ranks) return layer_range(n_layer, rank, std::max(ranks, 1));
  long double total = 0;
  std::vector<long double> room(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const uint64_t m = memory[size_t(r)];
    room[size_t(r)] = (long double)(r == 0 ? (m > fixed ? m - fixed : 0) : m);
    total += room[size_t(r)];
  }
  if (total <= 0) return layer_range(n_layer, rank, ranks);
  // Range ends at the rounded cumulative shares, never going back.
  auto end_of = [&](int r) {
    long double upto = 0;
    for (int i = 0; i <= r; ++i) upto += room[size_t(i)];
    int64_t e = r == ranks - 1 ? n_layer : int64_t(std::llround(double((long double)n_layer * upto / total)));
    return std::clamp<int64_t>(e, std::min<int64_t>(1, n_layer), n_layer);
  };
  return {rank == 0 ? 0 : end_of(rank - 1), end_of(rank)};
}

// The experts [first, end) of a layer with n_expert experts that `rank` of `ranks`
// holds: contiguous blocks whose sizes differ by at most one expert (every expert of a
// layer has the same bytes, so this balances bytes).
struct ExpertRange {
  int64_t first = 0, end = 0;
};
inline ExpertRange expert_range(int64_t n_expert, int rank, int ranks) {
  return {n_expert * rank / ranks, n_expert * (rank + 1) / ranks};
}
// The rank holding `expert` under expert_range().
inline int expert_owner(int64_t expert, int64_t n_expert, int ranks) {
  int r = int(expert * ranks / n_expert);
  while (r + 1 < ranks && expert_range(n_expert, r + 1, ranks).first <= expert) ++r;
  while (r > 0 && expert_range(n_expert, r, ranks).first > expert) --r;
  return r;
}

}  // namespace tessera
