#include "tessera/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace tessera {

void release_pages(const void* p, size_t n) {
#ifdef MADV_PAGEOUT
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (uintptr_t(p) + page - 1) / page * page, e = (uintptr_t(p) + n) / page * page;
  if (b < e) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_PAGEOUT);
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace tessera
