#include "plugin/file_trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace tessera::detail {

std::string untrusted_reason(const std::string& path, bool is_folder) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // the caller's own access reports it
  const std::string what = std::string(is_folder ? "folder " : "file ") + path;
  char mode[16];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  // A sticky world-writable folder (/tmp) still lets others add files: refused too.
  if (st.st_mode & S_IWOTH) return what + " is writable by other users (mode " + mode + ")";
  if ((st.st_mode & S_IWGRP) && st.st_gid != ::getegid())
    return what + " is writable by its group " + std::to_string(st.st_gid) + ", not yours (mode " + mode + ")";
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return what + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  return {};
}

}  // namespace tessera::detail
