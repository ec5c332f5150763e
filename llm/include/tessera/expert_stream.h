// Routed-expert weights streamed from the model file into a bounded cache, for MoE
// models larger than memory.
//
// Each expert tensor (blk.N.ffn_{gate,up,down}_exps) gets an address-space
// reservation as large as the tensor, laid out exactly like the file's bytes, so the
// tensor keeps its shape and strides and every backend reads it as usual. Only the
// experts a step routes to are made resident (read with O_DIRECT through io_uring,
// each slice's byte range widened to 4 KiB); the others' pages are released
// (MADV_DONTNEED), so memory holds at most `cache_bytes` of experts. An expert is
// the unit of residency: its three slices of one layer come and go together.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

struct ExpertStreamStats {
  uint64_t cache_bytes = 0;         // the limit
  uint64_t resident_bytes = 0;      // experts resident now
  uint64_t lookups = 0;             // (layer, expert) uses asked for
  uint64_t hits = 0;                // ... already resident
  uint64_t prefetched = 0;          // experts read ahead of their use
  uint64_t prefetch_hits = 0;       // uses served by an expert read ahead
  uint64_t bytes_read = 0;          // from the file (widened ranges)
  double read_seconds = 0;          // reads in flight (on either thread)
  double stall_seconds = 0;         // inside ensure(): the compute thread waiting for experts
  bool direct_io = false;           // O_DIRECT in use (else buffered reads)
  bool io_uring = false;            // io_uring in use (else pread)
};

class ExpertStream {
 public:
  // Opens `path` for reading (O_DIRECT where the filesystem allows it, else buffered
  // with a warning). cache_bytes: the most expert bytes resident at once.
  ExpertStream(const std::string& path, uint64_t cache_bytes);
  ~ExpertStream();
  ExpertStream(const ExpertStream&) = delete;
  ExpertStream& operator=(const ExpertStream&) = delete;

  // Registers one expert tensor of `layer`: n_expert slices of expert_bytes each,
  // starting at byte `file_offset` of the file. Returns the address the tensor's data
  // pointer takes (nothing resident yet). Throws when the range lies outside the file.
  void* add_tensor(const std::string& name, int layer, uint64_t file_offset, uint64_t expert_bytes,
                   int64_t n_expert);

  // After every add_tensor: checks that one layer's experts all fit in the cache
  // (a batch may route to every expert of a layer); throws naming the minimum size.
  void finish_setup();
  uint64_t min_cache_bytes() const;
  // Changes the limit (before the first ensure(), e.g. to min_cache_bytes()).
  void set_cache_bytes(uint64_t bytes);
  // Only experts [first, end) of each layer are ever made resident (a distributed
  // rank's share; the others' ids are left to the ranks holding them), and
  // min_cache_bytes() counts only them. Before finish_setup().
  void hold_only(int64_t first, int64_t end);

  // Makes the experts `ids` (any order, repeats allowed, each in [0, n_expert)) of
  // `layer` resident, reading the missing ones; may evict others, never these.
  // Throws on a read error or short read, naming the tensor and offset.
  void ensure(int layer, std::span<const int32_t> ids);
  // Reads experts `ids` of `layer` ahead of their use where they fit without evicting
  // anything needed sooner (least-recently-used experts go first). The stream's lock
  // is not held while the read is in flight: run_async() and stats() do not wait for
  // it (ensure() does).
  void prefetch(int layer, std::span<const int32_t> ids);
  // Runs `job` (e.g. predicting a later layer's experts and prefetching them) on the
  // stream's own I/O thread, overlapping the caller's compute; ensure() first waits
  // for every job queued before it. A job's exception is rethrown by the next ensure().
  void run_async(std::function<void(ExpertStream&)> job);

  // The layer whose streamed tensor `data` points into (an address add_tensor
  // returned, or inside that tensor), or -1.
  int layer_of(const void* data) const;

  ExpertStreamStats stats() const;

  // For tests: `hook` runs on the reading thread before every read, with the stream's
  // lock as the read has it (none for a prefetch). Empty: none.
  void set_read_hook(std::function<void()> hook);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "4G", "512M", "1500000000" -> bytes; throws tessera::Error on anything else.
uint64_t parse_byte_size(const std::string& text);

}  // namespace tessera
