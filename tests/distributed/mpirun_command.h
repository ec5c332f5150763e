// The launcher prefix that runs `tessera` as several ranks on the test machine.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace tessera::test {

// More ranks than cores, no binding, root allowed (containers), shared memory without
// the ptrace-based single copy (which containers forbid), and Open MPI's session
// directory under one of this test process's own: launches from concurrent test
// processes (ctest -j) otherwise race to create the shared /tmp/ompi.HOST.UID, and the
// loser fails at start with "File exists".
// The directory is removed when the test process ends, if Open MPI left it empty.
inline std::string mpirun_command(const std::string& mpirun, int ranks) {
  struct SessionBase {
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("tessera_ompi_" + std::to_string(getpid()));
    SessionBase() { std::filesystem::create_directories(dir); }
    ~SessionBase() {
      std::error_code ec;
      std::filesystem::remove(dir, ec);
    }
  };
  static const SessionBase session;
  const std::filesystem::path& base = session.dir;
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "OMPI_MCA_orte_tmpdir_base=" +
         base.string() + " " + mpirun + " -np " + std::to_string(ranks) + " --oversubscribe --bind-to none ";
}

}  // namespace tessera::test
