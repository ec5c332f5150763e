// Whether a plugin file or folder can be trusted not to have been planted by someone
// else: code tessera loads must be writable only by the user running it (or root).
#pragma once
#include <string>

namespace tessera::detail {

// Empty when `path` (a plugin .so or its folder) is writable only by its owner, who is
// root or the current user (group-writable is accepted for the user's own group);
// otherwise the reason to refuse it, e.g. "folder /x is writable by other users (mode 0777)".
std::string untrusted_reason(const std::string& path, bool is_folder);

}  // namespace tessera::detail
