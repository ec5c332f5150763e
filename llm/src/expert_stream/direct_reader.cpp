#include "expert_stream/direct_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tessera/error.h"
#if TESSERA_HAVE_LIBURING
#include <liburing.h>
#endif

namespace tessera::detail {

namespace {

struct Piece {
  size_t req;       // index into the requests
  uint64_t offset;  // file offset of this piece
  uint64_t bytes;
  uint8_t* dst;
};

std::vector<Piece> split(std::span<const DirectReader::Request> reqs, uint64_t file_size) {
  std::vector<Piece> out;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const auto& q = reqs[r];
    for (uint64_t done = 0; done < q.bytes && q.offset + done < file_size; done += DirectReader::kPiece)
      out.push_back({r, q.offset + done, std::min<uint64_t>(DirectReader::kPiece, q.bytes - done),
                     static_cast<uint8_t*>(q.dst) + done});
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const DirectReader::Request& q, uint64_t offset, const std::string& why) {
  throw Error(path + ": reading " + q.what + " at byte " + std::to_string(offset) + ": " + why);
}

}  // namespace

DirectReader::DirectReader(const std::string& path) : path_(path) {
  // TESSERA_EXPERT_IO=pread (no io_uring) or =buffered (no O_DIRECT either) chooses a
  // fallback on purpose (tests, comparisons); unset, the fastest that works is used.
  const char* mode_env = std::getenv("TESSERA_EXPERT_IO");
  const std::string mode = mode_env ? mode_env : "";
  if (!mode.empty() && mode != "pread" && mode != "buffered")
    throw Error("TESSERA_EXPERT_IO must be pread or buffered, not '" + mode + "'");
  fd_ = mode == "buffered" ? -1 : ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (mode == "buffered") {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  } else if (fd_ >= 0) {
    direct_ = true;
  } else {
    const int e = errno;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    spdlog::warn("{}: the filesystem refuses O_DIRECT ({}): expert reads go through the page cache", path,
                 std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  size_ = uint64_t(st.st_size);
  if (!mode.empty()) return;  // pread
#if TESSERA_HAVE_LIBURING
  auto* ring = new io_uring;
  if (const int r = io_uring_queue_init(kDepth, ring, 0); r == 0) {
    ring_ = ring;
  } else {
    delete ring;
    spdlog::warn("io_uring is not available here ({}): expert reads use pread", std::strerror(-r));
  }
#else
  spdlog::warn("built without liburing: expert reads use pread");
#endif
}

DirectReader::~DirectReader() {
#if TESSERA_HAVE_LIBURING
  if (ring_) {
    io_uring_queue_exit(static_cast<io_uring*>(ring_));
    delete static_cast<io_uring*>(ring_);
  }
#endif
  if (fd_ >= 0) ::close(fd_);
}

void DirectReader::read_all(std::span<const Request> reqs) {
  if (ring_) return read_uring(reqs);
  read_pread(reqs);
}

void DirectReader::read_pread(std::span<const Request> reqs) {
  for (const Piece& p : split(reqs, size_)) {
    uint64_t done = 0;
    while (done < p.bytes) {
      const ssize_t n = ::pread(fd_, p.dst + done, p.bytes - done, off_t(p.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path_, reqs[p.req], p.offset + done, std::strerror(errno));
      if (n == 0) {
        if (p.offset + done >= size_) break;  // the widened tail of the last slice
        fail(path_, reqs[p.req], p.offset + done, "short read (file truncated?)");
      }
      done += uint64_t(n);
    }
  }
}

void DirectReader::read_uring(std::span<const Request> reqs) {
#if TESSERA_HAVE_LIBURING
  auto* ring = static_cast<io_uring*>(ring_);
  std::vector<Piece> pieces = split(reqs, size_);
  std::vector<uint64_t> done(pieces.size(), 0);
  std::vector<size_t> queue(pieces.size());  // pieces (still) to submit
  for (size_t i = 0; i < pieces.size(); ++i) queue[i] = pieces.size() - 1 - i;
  unsigned in_flight = 0;
  while (!queue.empty() || in_flight > 0) {
    while (!queue.empty() && in_flight < kDepth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (!sqe) break;
      const size_t i = queue.back();
      queue.pop_back();
      const Piece& p = pieces[i];
      io_uring_prep_read(sqe, fd_, p.dst + done[i], unsigned(p.bytes - done[i]), p.offset + done[i]);
      io_uring_sqe_set_data64(sqe, i);
      ++in_flight;
    }
    if (const int r = io_uring_submit_and_wait(ring, 1); r < 0 && r != -EINTR)
      throw Error(path_ + ": io_uring submit: " + std::strerror(-r));
    io_uring_cqe* cqe = nullptr;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      const size_t i = size_t(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      ++seen;
      --in_flight;
      const Piece& p = pieces[i];
      if (res == -EAGAIN || res == -EINTR) {
        queue.push_back(i);
      } else if (res < 0) {
        io_uring_cq_advance(ring, seen);
        fail(path_, reqs[p.req], p.offset + done[i], std::strerror(-res));
      } else if (res == 0) {
        if (p.offset + done[i] < size_) {
          io_uring_cq_advance(ring, seen);
          fail(path_, reqs[p.req], p.offset + done[i], "short read (file truncated?)");
        }
      } else {
        done[i] += uint64_t(res);
        if (done[i] < p.bytes && p.offset + done[i] < size_) queue.push_back(i);  // the rest of a partial read
      }
    }
    io_uring_cq_advance(ring, seen);
  }
#else
  read_pread(reqs);
#endif
}

}  // namespace tessera::detail
