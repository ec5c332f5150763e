// The child process that tries a plugin before the host loads it (probe_sandbox.h).
// The child reports its progress one byte at a time through a pipe ('L' loading, 'P'
// probing, 'D' done, 'T' + text: the probe threw), so the parent can say at which
// stage a crash or a hang happened.
#include "plugin/probe_sandbox.h"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/plugin_abi.h"

namespace tessera::detail {

namespace {

void put(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

// Runs in the child: never returns.
[[noreturn]] void child_main(const std::string& file, int fd) {
  put(fd, "L", 1);
  void* lib = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  auto entry = lib ? reinterpret_cast<TesseraPluginEntryFn>(::dlsym(lib, TESSERA_PLUGIN_ENTRY_SYMBOL)) : nullptr;
  const TesseraPluginDescriptor* d = entry ? entry() : nullptr;
  // Only a descriptor the host would probe is probed here (the host's checks give the
  // reasons for the others).
  constexpr size_t kProbeEnd = offsetof(TesseraPluginDescriptor, probe) + sizeof(TesseraPluginDescriptor::probe);
  if (d && d->abi_version >= TESSERA_PLUGIN_ABI_MIN_VERSION && d->abi_version <= TESSERA_PLUGIN_ABI_VERSION &&
      d->struct_size >= kProbeEnd && d->probe) {
    put(fd, "P", 1);
    try {
      char reason[512] = {};
      (void)d->probe(reason, sizeof reason);
    } catch (const std::exception& e) {
      const std::string msg = std::string("T") + e.what();
      put(fd, msg.data(), msg.size());
      ::_exit(0);
    } catch (...) {
      put(fd, "T(not a std::exception)", 23);
      ::_exit(0);
    }
  }
  put(fd, "D", 1);
  ::_exit(0);  // no atexit handlers, no stdio flush, no plugin destructors
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string stage_words(char stage) {
  switch (stage) {
    case 'L': return "while loading (static initializers or dependencies)";
    case 'P': return "during probe";
    default: return "before loading";
  }
}

std::string cache_folder() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tessera";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tessera";
  return {};
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

SandboxVerdict try_plugin_in_child(const std::string& file, std::chrono::milliseconds timeout) {
  int fds[2];
  if (::pipe(fds) != 0) return {true, {}};  // cannot sandbox: the host's own load decides
  std::fflush(nullptr);                     // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {true, {}};
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(file, fds[1]);
  }
  ::close(fds[1]);

  std::string got;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, int(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      timed_out = true;
      break;
    }
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child exited or closed the pipe
    got.append(buf, size_t(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  // The last stage marker reached ('T' carries the exception text after it).
  char stage = 0;
  std::string thrown;
  if (const size_t t = got.find('T'); t != std::string::npos && got.find('P') < t) {
    stage = 'T';
    thrown = got.substr(t + 1);
  } else if (!got.empty()) {
    stage = got.back();
  }
  const auto secs = [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f s", double(timeout.count()) / 1000.0);
    return std::string(b);
  };
  if (timed_out) return {false, "timed out after " + secs() + " " + stage_words(stage)};
  if (WIFSIGNALED(status)) return {false, "crashed with " + signal_name(WTERMSIG(status)) + " " + stage_words(stage)};
  if (stage == 'T') return {false, "probe threw an exception: " + thrown};
  if (stage != 'D')
    return {false, "exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + " " +
                       stage_words(stage)};
  return {true, {}};
}

SandboxVerdict vet_plugin(const std::string& file) {
  if (const char* e = std::getenv("TESSERA_PROBE_IN_PROCESS"); e && std::string(e) == "1") return {true, {}};
  long ms = 10000;
  if (const char* e = std::getenv("TESSERA_PROBE_TIMEOUT_MS"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end && *end == '\0' && v > 0) ms = v;
  }
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return {true, {}};  // the host's load reports it
  std::ostringstream key;
  key << "tessera-plugin-vet-1|" << file << "|" << st.st_size << "|" << st.st_mtim.tv_sec << "."
      << st.st_mtim.tv_nsec << "|" << TESSERA_PLUGIN_ABI_VERSION;
  const std::string dir = cache_folder();
  std::filesystem::path path;
  if (!dir.empty()) {
    char name[64];
    // One file per plugin path: a new version of the file replaces its verdict.
    std::snprintf(name, sizeof name, "plugin-vet-%016llx.txt", static_cast<unsigned long long>(fnv1a(file)));
    path = std::filesystem::path(dir) / name;
    std::ifstream in(path);
    std::string k, verdict, reason;
    if (in && std::getline(in, k) && k == key.str() && std::getline(in, verdict)) {
      std::getline(in, reason);
      if (verdict == "safe") return {true, {}};
      if (verdict == "refused")
        return {false, reason + " (remembered from an earlier run: " + path.string() +
                           "; changing the file tries it again)"};
    }
  }
  SandboxVerdict v = try_plugin_in_child(file, std::chrono::milliseconds(ms));
  // A timeout can be a loaded machine rather than the plugin: tried again next time.
  const bool remember = !path.empty() && v.reason.rfind("timed out", 0) != 0;
  if (remember) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::filesystem::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp);
      out << key.str() << "\n" << (v.safe ? "safe" : "refused") << "\n" << v.reason << "\n";
      if (!out) ec = std::make_error_code(std::errc::io_error);
    }
    if (!ec) std::filesystem::rename(tmp, path, ec);
    if (ec) {
      std::filesystem::remove(tmp, ec);
      spdlog::debug("plugins: cannot remember the verdict on {} in {}", file, dir);
    }
  }
  return v;
}

}  // namespace tessera::detail
