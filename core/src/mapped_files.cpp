// register_mapped_file / unregister_mapped_file (model_file.h): a SIGBUS inside a
// mapped model file ends the process naming the file.
#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>
#include <string>
#include <unistd.h>

#include "tessera/model_file.h"

namespace tessera {

namespace {

// The registry the SIGBUS handler reads: fixed slots, published with release stores so
// the handler (async-signal-safe: loads, write(2), raise) never sees a half-written one.
struct MappedSlot {
  std::atomic<const uint8_t*> base{nullptr};
  std::atomic<size_t> size{0};
  char path[512] = {};
};
MappedSlot g_mapped[64];
std::mutex g_mapped_mutex;  // writers only
struct sigaction g_prev_sigbus;

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const auto* addr = static_cast<const uint8_t*>(info ? info->si_addr : nullptr);
  for (const MappedSlot& m : g_mapped) {
    const uint8_t* b = m.base.load(std::memory_order_acquire);
    if (!b || addr < b || addr >= b + m.size.load(std::memory_order_relaxed)) continue;
    write_str("tessera: fatal: model file ");
    write_str(m.path);
    write_str(" changed while in use (truncated or rewritten in place: SIGBUS reading its mapped weights); "
              "replace model files by writing a new file and renaming it\n");
    break;
  }
  // Then the signal takes its course: the handler that was there before (a sanitizer's),
  // or the default action (terminate, core dump) once this handler returns.
  if ((g_prev_sigbus.sa_flags & SA_SIGINFO) && g_prev_sigbus.sa_sigaction) {
    g_prev_sigbus.sa_sigaction(sig, info, ctx);
  } else if (g_prev_sigbus.sa_handler != SIG_DFL && g_prev_sigbus.sa_handler != SIG_IGN) {
    g_prev_sigbus.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);  // pending until this handler returns; re-executing the load would fault again anyway
  }
}

}  // namespace

void register_mapped_file(const void* base, size_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev_sigbus);
  });
  std::lock_guard<std::mutex> lock(g_mapped_mutex);
  for (MappedSlot& m : g_mapped) {
    if (m.base.load(std::memory_order_relaxed)) continue;
    const std::string shown = printable(path, sizeof m.path - 1);
    std::memcpy(m.path, shown.c_str(), std::min(shown.size() + 1, sizeof m.path));
    m.path[sizeof m.path - 1] = '\0';
    m.size.store(size, std::memory_order_relaxed);
    m.base.store(static_cast<const uint8_t*>(base), std::memory_order_release);
    return;
  }
}

void unregister_mapped_file(const void* base) {
  std::lock_guard<std::mutex> lock(g_mapped_mutex);
  for (MappedSlot& m : g_mapped)
    if (m.base.load(std::memory_order_relaxed) == base) m.base.store(nullptr, std::memory_order_release);
}

}  // namespace tessera
