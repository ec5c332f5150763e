// Host memory handed back to the system.
#pragma once
#include <cstddef>

namespace tessera {

// Drops the whole pages inside [p, p + n) from this process (MADV_PAGEOUT), for the
// source of a copy that is read instead from now on (a quantized or repacked weight):
// file pages are read again only if touched, so a model file's pages do not stay
// resident beside the copy; nothing is lost whatever the memory is (anonymous memory
// without swap stays). A kernel without MADV_PAGEOUT refuses, harmlessly.
void release_pages(const void* p, size_t n);

}  // namespace tessera
