// RankGroup over MPI: MPI_Bcast for rank 0's step messages, MPI_Allgatherv for the
// experts' products. Only one thread calls MPI at a time (the engine's), which may not
// be the main thread (the server steps the engine on a thread of its own), so the run
// asks for MPI_THREAD_SERIALIZED.
#include "tessera/mpi_run.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "tessera/error.h"

#if TESSERA_HAVE_MPI
#include <mpi.h>
#endif

namespace tessera::dist {

bool launched_with_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::atoi(v) > 1;
  return false;
}

#if TESSERA_HAVE_MPI

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(what) + " failed: " + text);
}

class MpiRankGroup final : public RankGroup {
  static constexpr int kStageTag = 7;

 public:
  MpiRankGroup() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw Error("the MPI library cannot be called from the engine's thread (it provides thread level " +
                  std::to_string(provided) + ", below MPI_THREAD_SERIALIZED)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiRankGroup() override {
    for (Pending& p : pending_) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    pending_.clear();
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void broadcast(std::vector<uint8_t>& bytes) override {
    const double t0 = now_s();
    uint64_t n = bytes.size();
    // The length first, waited for without spinning once the wait is long (an idle
    // server's ranks wait here between requests); steps in a busy run arrive sooner.
    MPI_Request req;
    check(MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req), "MPI_Ibcast");
    for (int done = 0;;) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      if (now_s() - t0 > 0.05) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (rank_ != 0) bytes.resize(size_t(n));
    if (n > 0) check(MPI_Bcast(bytes.data(), int(n), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    (rank_ == 0 ? traffic_.bytes_sent : traffic_.bytes_received) += n + 8;
    traffic_.seconds += now_s() - t0;
  }

  void all_gather(std::span<const uint8_t> mine, std::span<const size_t> counts, std::span<uint8_t> all) override {
    const double t0 = now_s();
    if (counts.size() != size_t(size_)) throw Error("all_gather: one count per rank expected");
    counts_.resize(counts.size());
    displs_.resize(counts.size());
    size_t at = 0, total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] > size_t(INT32_MAX) || at > size_t(INT32_MAX)) throw Error("all_gather: more than 2 GiB at once");
      counts_[r] = int(counts[r]);
      displs_[r] = int(at);
      at += counts[r];
      total += counts[r];
    }
    if (mine.size() != counts[size_t(rank_)] || all.size() < total) throw Error("all_gather: buffer sizes do not match");
    check(MPI_Allgatherv(mine.data(), int(mine.size()), MPI_BYTE, all.data(), counts_.data(), displs_.data(), MPI_BYTE,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
    traffic_.bytes_sent += mine.size();
    traffic_.bytes_received += total - mine.size();
    traffic_.seconds += now_s() - t0;
    ++traffic_.exchanges;
  }

  void send(int to, std::span<const uint8_t> bytes) override {
    const double t0 = now_s();
    if (bytes.size() > size_t(INT32_MAX)) throw Error("send: more than 2 GiB at once");
    check(MPI_Send(bytes.data(), int(bytes.size()), MPI_BYTE, to, kStageTag, MPI_COMM_WORLD), "MPI_Send");
    traffic_.bytes_sent += bytes.size();
    traffic_.seconds += now_s() - t0;
  }

  void send_async(int to, std::span<const uint8_t> bytes) override {
    const double t0 = now_s();
    if (bytes.size() > size_t(INT32_MAX)) throw Error("send: more than 2 GiB at once");
    Pending& p = pending_.emplace_back();
    p.bytes.assign(bytes.begin(), bytes.end());
    check(MPI_Isend(p.bytes.data(), int(p.bytes.size()), MPI_BYTE, to, kStageTag, MPI_COMM_WORLD, &p.req),
          "MPI_Isend");
    traffic_.bytes_sent += bytes.size();
    traffic_.seconds += now_s() - t0;
  }

  void wait_sends() override {
    const double t0 = now_s();
    for (Pending& p : pending_) check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait");
    pending_.clear();
    traffic_.seconds += now_s() - t0;
  }

  void recv(int from, std::span<uint8_t> bytes) override {
    const double t0 = now_s();
    if (bytes.size() > size_t(INT32_MAX)) throw Error("recv: more than 2 GiB at once");
    MPI_Status st;
    check(MPI_Recv(bytes.data(), int(bytes.size()), MPI_BYTE, from, kStageTag, MPI_COMM_WORLD, &st), "MPI_Recv");
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (size_t(got) != bytes.size())
      throw Error("recv: " + std::to_string(got) + " bytes from rank " + std::to_string(from) + ", expected " +
                  std::to_string(bytes.size()));
    traffic_.bytes_received += bytes.size();
    traffic_.seconds += now_s() - t0;
    ++traffic_.exchanges;
  }

  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "tessera: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  RankTraffic traffic() const override { return traffic_; }

 private:
  // A send in flight owns its copy of the bytes (a deque: its elements never move).
  struct Pending {
    std::vector<uint8_t> bytes;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  int rank_ = 0, size_ = 1;
  std::deque<Pending> pending_;
  std::vector<int> counts_, displs_;
  RankTraffic traffic_;
};

}  // namespace

std::shared_ptr<RankGroup> join() { return std::make_shared<MpiRankGroup>(); }

#else

std::shared_ptr<RankGroup> join() {
  throw Error("started by an MPI launcher, but this tessera was built without MPI (install libopenmpi-dev and "
              "rebuild: scripts/setup.sh does both)");
}

#endif

}  // namespace tessera::dist
