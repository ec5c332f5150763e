// The memory this process may still take: the lowest of what its memory cgroup
// allows (cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes, of its own cgroup
// and every ancestor, each minus that cgroup's usage), RLIMIT_AS minus the address
// space mapped, and MemAvailable; with the source that set it, for messages.
// Unreadable or malformed files are skipped: a source that cannot be read limits
// nothing.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tessera {

struct MemoryLimit {
  std::string source;    // "cgroup v1 memory.limit_in_bytes", "RLIMIT_AS", "MemAvailable", ...
  std::string where;     // the cgroup path ("/a/b") for cgroup limits, else empty
  uint64_t limit = 0;    // bytes
  uint64_t used = 0;     // bytes of it taken now (0 for MemAvailable: already what is left)
  bool hard = false;     // enforced (the OOM killer or a failing allocation), not an estimate
  uint64_t left() const { return limit > used ? limit - used : 0; }
  // "cgroup v1 memory.limit_in_bytes 12.0 GiB minus 0.2 GiB in use"
  std::string describe() const;
};

struct MemoryBudget {
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
  uint64_t bytes = kUnlimited;       // the lowest left() of `limits`
  std::vector<MemoryLimit> limits;   // every limit found, in the order read
  int binding = -1;                  // index of the limit that set `bytes`, -1 if none was found

  bool limited() const { return binding >= 0; }
  // Whether the budget comes from an enforced limit (cgroup, RLIMIT_AS) rather than
  // from MemAvailable, which the kernel may still raise by reclaiming or swapping.
  bool hard() const { return binding >= 0 && limits[size_t(binding)].hard; }
  // "memory budget 11.8 GiB (cgroup v1 memory.limit_in_bytes 12.0 GiB minus 0.2 GiB in use)"
  std::string describe() const;
};

// Reads the budget of the calling process. `root` prefixes every /proc and /sys path
// ("/" on a running system; a test's fake tree).
MemoryBudget read_memory_budget(const std::string& root = "/");

// "11.8 GiB", "512 MiB": bytes for messages, one decimal in GiB from 1 GiB up.
std::string format_memory(uint64_t bytes);

}  // namespace tessera
