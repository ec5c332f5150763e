// Trying a plugin file in a child process before the host loads it: its static
// initializers, entry point and probe run there first, so a plugin that crashes or
// hangs is refused with a reason instead of killing or hanging tessera.
#pragma once
#include <chrono>
#include <string>

namespace tessera::detail {

struct SandboxVerdict {
  bool safe = true;    // the child loaded and probed it without crashing, hanging or throwing
  std::string reason;  // why not (e.g. "crashed with SIGSEGV during probe")
};

// Loads `file` in a forked child, checks its descriptor like the registry does (a
// file the registry would refuse before probing is "safe": the host's own checks say
// why), calls its probe and reports how that ended. A child that has not finished
// within `timeout` is killed.
SandboxVerdict try_plugin_in_child(const std::string& file, std::chrono::milliseconds timeout);

// try_plugin_in_child with the verdict remembered by the file's path, size and
// modification time (one small file per plugin path under $XDG_CACHE_HOME/tessera,
// else ~/.cache/tessera), so a plugin is tried once per version of its file; a timeout
// is not remembered (a loaded machine can cause it). The timeout is 10 s, or
// $TESSERA_PROBE_TIMEOUT_MS. TESSERA_PROBE_IN_PROCESS=1 skips the child (debugging a
// plugin under gdb): every verdict is then "safe".
SandboxVerdict vet_plugin(const std::string& file);

}  // namespace tessera::detail
