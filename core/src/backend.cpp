#include "tessera/backend.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "tessera/error.h"

namespace tessera {

HostBuffer::HostBuffer(size_t bytes, BufferUsage usage) : size_(bytes), usage_(usage) {
  if (bytes > SIZE_MAX - 128) throw std::bad_alloc();
  ptr_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!ptr_) throw std::bad_alloc();
}

HostBuffer::~HostBuffer() { std::free(ptr_); }

void HostBuffer::check(size_t offset, size_t bytes, const char* what) const {
  if (offset > size_ || bytes > size_ - offset)
    throw Error(std::string("buffer ") + what + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                ") outside the buffer's " + std::to_string(size_));
}

void HostBuffer::set(size_t offset, const void* src, size_t bytes) {
  check(offset, bytes, "set");
  if (bytes) std::memcpy(static_cast<char*>(ptr_) + offset, src, bytes);
}

void HostBuffer::get(size_t offset, void* dst, size_t bytes) const {
  check(offset, bytes, "get");
  if (bytes) std::memcpy(dst, static_cast<const char*>(ptr_) + offset, bytes);
}

void HostBuffer::copy(size_t dst_offset, size_t src_offset, size_t bytes) {
  check(dst_offset, bytes, "copy");
  check(src_offset, bytes, "copy");
  if (bytes) std::memmove(static_cast<char*>(ptr_) + dst_offset, static_cast<const char*>(ptr_) + src_offset, bytes);
}

}  // namespace tessera
