#include "tessera/backend.h"

#include <cstdlib>
#include <new>

namespace tessera {

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  ptr_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!ptr_) throw std::bad_alloc();
}

HostBuffer::~HostBuffer() { std::free(ptr_); }

}  // namespace tessera
