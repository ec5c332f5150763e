// libFuzzer target: any byte string as a .safetensors file. The reader maps files by
// path, so the bytes go into a memfd opened through /proc/self/fd (no disk writes).
// It must refuse the file with a one-line tessera::Error or present it; a presented
// file's tensors are walked (first and last byte of each read, which ASan checks lie
// inside the mapping) and its strings escaped for display. Anything else (a crash, a
// sanitizer report, an exception of another type, a leak) is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "safetensors_reader.h"
#include "tessera/error.h"
#include "tessera/model_file.h"

namespace {

int memfd = -1;
std::string memfd_path;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  memfd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (memfd < 0) {
    std::perror("memfd_create");
    std::abort();
  }
  memfd_path = "/proc/self/fd/" + std::to_string(memfd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (ftruncate(memfd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(memfd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  std::unique_ptr<tessera::safetensors::SafetensorsFile> f;
  try {
    f = tessera::safetensors::SafetensorsFile::open(memfd_path);
  } catch (const tessera::Error& e) {
    if (std::string(e.what()).find('\n') != std::string::npos) std::abort();  // errors are one line
    return 0;
  }
  unsigned sum = 0;
  uint64_t prev_end = 0;
  for (const auto& t : f->tensors()) {
    if (t.file_offset + t.nbytes > f->file_size()) std::abort();
    if (t.nbytes) {
      if (t.file_offset < prev_end) std::abort();  // data order, no shared bytes
      prev_end = t.file_offset + t.nbytes;
      const auto* p = static_cast<const uint8_t*>(t.data);
      sum += p[0] + p[t.nbytes - 1];
    }
    (void)tessera::printable(t.name, 80);
  }
  for (const auto& [k, v] : f->metadata()) sum += tessera::printable(k, 80).size() + tessera::printable(v, 80).size();
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
