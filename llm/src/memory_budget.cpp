// Reading the memory budget (memory_budget.h) from /proc and /sys under a root.
//
// cgroups: /proc/self/cgroup names the process's cgroup per hierarchy ("0::/path" for
// v2, "N:memory:/path" for v1's memory controller); /proc/self/mountinfo says where
// each hierarchy is mounted and which of its cgroups the mount shows as its top (a
// container's mount shows its own cgroup there). Every cgroup from the process's own
// up to the mount's top can limit it, so each level with a limit is one MemoryLimit.
// A cgroup's usage counts its page cache too; the inactive file pages among them are
// what the kernel drops first under the limit, so they are not counted as used (the
// working set, as container runtimes report it).
#include "tessera/memory_budget.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

namespace tessera {

namespace {

// A v1 limit at or above this is "no limit" (the kernel reports PAGE_COUNTER_MAX pages,
// about 2^63 bytes).
constexpr uint64_t kV1NoLimit = uint64_t(1) << 62;

std::string join(const std::string& root, const std::string& abs) {
  if (root.empty() || root == "/") return abs;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  return r + abs;
}

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s;
  char buf[4096];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    s.append(buf, size_t(in.gcount()));
    if (s.size() > (1u << 20)) return std::nullopt;  // no file read here is this large
  }
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The whole of `s` (trimmed) as an unsigned decimal, else nothing.
std::optional<uint64_t> parse_u64(std::string_view s) {
  s = trim(s);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<uint64_t> read_u64(const std::string& path) {
  auto s = read_small_file(path);
  return s ? parse_u64(*s) : std::nullopt;
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string_view> lines(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const size_t nl = s.find('\n');
    out.push_back(s.substr(0, nl));
    if (nl == std::string_view::npos) break;
    s.remove_prefix(nl + 1);
  }
  return out;
}

// "key value [unit]" lines (/proc/meminfo, /proc/self/status, memory.stat): the value
// of `key` times 1024 when the unit is kB.
std::optional<uint64_t> keyed_value(const std::string& text, std::string_view key) {
  for (std::string_view line : lines(text)) {
    const auto f = fields(line);
    if (f.size() < 2 || f[0] != key) continue;
    auto v = parse_u64(f[1]);
    if (!v) return std::nullopt;
    if (f.size() >= 3 && f[2] == "kB") {
      if (*v > UINT64_MAX / 1024) return std::nullopt;
      *v *= 1024;
    }
    return v;
  }
  return std::nullopt;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mount_path(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
        s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Mount {
  std::string root;        // the cgroup the mount shows at its top
  std::string mountpoint;  // where
};

// The cgroup2 mount (v2) or the cgroup mount carrying the memory controller (v1).
std::optional<Mount> find_mount(const std::string& mountinfo, bool v2) {
  for (std::string_view line : lines(mountinfo)) {
    const auto f = fields(line);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    // Before the "-": id, parent, major:minor, root, mount point, options, optional
    // fields; after it: file system type, source, super options.
    if (dash < 5 || dash + 4 > f.size()) continue;
    const std::string_view fstype = f[dash + 1];
    if (v2 ? fstype != "cgroup2" : fstype != "cgroup") continue;
    if (!v2) {
      bool memory = false;
      std::string_view opts = f[dash + 3];
      while (!opts.empty()) {
        const size_t c = opts.find(',');
        if (opts.substr(0, c) == "memory") memory = true;
        if (c == std::string_view::npos) break;
        opts.remove_prefix(c + 1);
      }
      if (!memory) continue;
    }
    return Mount{unescape_mount_path(f[3]), unescape_mount_path(f[4])};
  }
  return std::nullopt;
}

// The process's cgroup path in the v2 hierarchy ("0::/a/b") or v1's memory one.
std::optional<std::string> own_cgroup(const std::string& cgroup_file, bool v2) {
  for (std::string_view line : lines(cgroup_file)) {
    const size_t a = line.find(':');
    if (a == std::string_view::npos) continue;
    const size_t b = line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string_view path = line.substr(b + 1);
    if (path.empty() || path.front() != '/') continue;
    if (v2) {
      if (id == "0" && controllers.empty()) return std::string(path);
      continue;
    }
    std::string_view c = controllers;
    while (!c.empty()) {
      const size_t comma = c.find(',');
      if (c.substr(0, comma) == "memory") return std::string(path);
      if (comma == std::string_view::npos) break;
      c.remove_prefix(comma + 1);
    }
  }
  return std::nullopt;
}

std::string parent_of(const std::string& cgroup) {
  const size_t slash = cgroup.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : cgroup.substr(0, slash);
}

// The limits of `cgroup` and its ancestors visible under the mount.
void read_cgroup_limits(const std::string& root, const Mount& m, const std::string& cgroup, bool v2,
                        std::vector<MemoryLimit>& out) {
  // The cgroup relative to the mount's top: the mount of a container shows its own
  // cgroup as "/", and the process's path may or may not include that prefix.
  std::string rel = cgroup;
  if (m.root != "/" && (cgroup == m.root || cgroup.rfind(m.root + "/", 0) == 0)) rel = cgroup.substr(m.root.size());
  if (rel.empty()) rel = "/";
  bool own = true;
  for (std::string level = rel;; level = parent_of(level)) {
    const std::string dir = join(root, m.mountpoint + (level == "/" ? "" : level));
    const char* limit_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* usage_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    if (auto text = read_small_file(dir + limit_file)) {
      std::optional<uint64_t> limit = parse_u64(*text);
      const bool none = v2 ? trim(*text) == "max" : limit && *limit >= kV1NoLimit;
      if (limit && !none) {
        MemoryLimit l;
        l.source = std::string(v2 ? "cgroup v2 memory.max" : "cgroup v1 memory.limit_in_bytes");
        if (!own) l.where = level;
        l.limit = *limit;
        l.hard = true;
        if (auto usage = read_u64(dir + usage_file)) {
          l.used = *usage;
          if (auto stat = read_small_file(dir + "/memory.stat")) {
            auto inactive = keyed_value(*stat, v2 ? "inactive_file" : "total_inactive_file");
            if (!inactive && !v2) inactive = keyed_value(*stat, "inactive_file");
            if (inactive && *inactive <= l.used) l.used -= *inactive;
          }
        }
        out.push_back(l);
      }
    }
    own = false;
    if (level == "/") break;
  }
}

}  // namespace

std::string format_memory(uint64_t bytes) {
  char buf[48];
  const double b = double(bytes);
  if (bytes >= (uint64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(uint64_t(1) << 30));
  else if (bytes >= (uint64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / double(uint64_t(1) << 20));
  else
    std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024.0);
  return buf;
}

std::string MemoryLimit::describe() const {
  std::string s = source;
  if (!where.empty()) s += " of cgroup " + where;
  s += " " + format_memory(limit);
  if (used > 0) s += " minus " + format_memory(used) + (source == "RLIMIT_AS" ? " mapped" : " in use");
  return s;
}

std::string MemoryBudget::describe() const {
  if (!limited()) return "memory budget: no limit found (no cgroup limit, RLIMIT_AS or MemAvailable could be read)";
  return "memory budget " + format_memory(bytes) + " (" + limits[size_t(binding)].describe() + ")";
}

MemoryBudget read_memory_budget(const std::string& root) {
  MemoryBudget b;
  const auto cgroup_file = read_small_file(join(root, "/proc/self/cgroup"));
  const auto mountinfo = read_small_file(join(root, "/proc/self/mountinfo"));
  if (cgroup_file && mountinfo) {
    for (bool v2 : {true, false}) {
      auto cg = own_cgroup(*cgroup_file, v2);
      auto m = find_mount(*mountinfo, v2);
      if (cg && m) read_cgroup_limits(root, *m, *cg, v2, b.limits);
    }
  }
  if (auto limits = read_small_file(join(root, "/proc/self/limits"))) {
    for (std::string_view line : lines(*limits)) {
      constexpr std::string_view kName = "Max address space";
      if (line.substr(0, kName.size()) != kName) continue;
      const auto f = fields(line.substr(kName.size()));
      if (f.empty() || f[0] == "unlimited") break;
      if (auto soft = parse_u64(f[0])) {
        MemoryLimit l;
        l.source = "RLIMIT_AS";
        l.limit = *soft;
        l.hard = true;
        if (auto status = read_small_file(join(root, "/proc/self/status")))
          l.used = keyed_value(*status, "VmSize:").value_or(0);
        b.limits.push_back(l);
      }
      break;
    }
  }
  if (auto meminfo = read_small_file(join(root, "/proc/meminfo")))
    if (auto avail = keyed_value(*meminfo, "MemAvailable:")) {
      MemoryLimit l;
      l.source = "MemAvailable";
      l.limit = *avail;
      b.limits.push_back(l);
    }
  for (size_t i = 0; i < b.limits.size(); ++i)
    if (b.binding < 0 || b.limits[i].left() < b.bytes) {
      b.binding = int(i);
      b.bytes = b.limits[i].left();
    }
  return b;
}

}  // namespace tessera
