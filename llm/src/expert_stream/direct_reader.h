// Reading byte ranges of a file with many requests in flight: io_uring (liburing) and
// O_DIRECT where available, else pread and/or the page cache, said once on stderr.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace tessera::detail {

class DirectReader {
 public:
  struct Request {
    uint64_t offset = 0;  // in the file; with direct() a multiple of kAlign
    uint64_t bytes = 0;   // with direct() a multiple of kAlign (the tail may pass EOF)
    void* dst = nullptr;  // with direct() kAlign-aligned
    std::string what;     // for errors: e.g. "blk.3.ffn_up_exps expert 17"
  };
  static constexpr uint64_t kAlign = 4096;

  explicit DirectReader(const std::string& path);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Reads every request, up to kDepth pieces of at most kPiece bytes in flight. Bytes
  // past the end of the file are left as they were. Throws tessera::Error naming the
  // request and offset on a read error or a short read before EOF.
  void read_all(std::span<const Request> reqs);

  bool direct() const { return direct_; }
  bool uring() const { return ring_ != nullptr; }
  uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  static constexpr unsigned kDepth = 32;
  static constexpr uint64_t kPiece = 1 << 20;

 private:
  void read_pread(std::span<const Request> reqs);
  void read_uring(std::span<const Request> reqs);

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t size_ = 0;
  void* ring_ = nullptr;  // struct io_uring*, when liburing works here
};

}  // namespace tessera::detail
