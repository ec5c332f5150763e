#include "server/guarded_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "server/metrics.h"
#include "tessera/error.h"

namespace tessera::server {

namespace {

using Clock = std::chrono::steady_clock;

// poll() on fd (and the wake pipe) for `events`: 1 ready, 0 timed out, -1 woken or failed.
int wait_fd(int fd, short events, int wake_fd, Clock::duration timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int r = ::poll(p, wake_fd >= 0 ? 2 : 1, int(std::clamp<long long>(left, 0, INT_MAX)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? -1 : 0;
    if (wake_fd >= 0 && p[1].revents) return -1;
    return 1;
  }
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (uint8_t(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

// A whole HTTP response with an OpenAI error object, for when cpp-httplib is not
// writing one (a refused connection, a request line that never ended).
std::string canned_response(int status, const char* reason, const std::string& message, const std::string& code) {
  const std::string body = "{\"error\":{\"message\":" + json_quote(message) +
                           ",\"type\":\"invalid_request_error\",\"param\":null,\"code\":" + json_quote(code) + "}}";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nConnection: close\r\n" + (status == 503 ? "Retry-After: 1\r\n" : "") +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

// One client connection: the Stream cpp-httplib reads requests from and writes
// responses to, with the byte and time budgets of the request being read.
class GuardedServer::Connection final : public httplib::Stream {
 public:
  enum class Phase { Idle, Head, Body };
  Connection(int fd, const HttpLimits& limits, int wake_fd) : fd_(fd), limits_(limits), wake_(wake_fd) {}

  bool is_readable() const override {
    return pos_ < len_ || wait_fd(fd_, POLLIN, wake_, limits_.read_timeout) > 0;
  }
  // A streaming handler asks this before it writes: false once the client is gone.
  bool is_writable() const override {
    return !peer_closed() && wait_fd(fd_, POLLOUT, wake_, limits_.write_timeout) > 0;
  }

  ssize_t read(char* out, size_t n) override {
    size_t budget = SIZE_MAX;
    if (phase_ == Phase::Head) budget = limits_.max_header_bytes - std::min(limits_.max_header_bytes, phase_bytes_);
    // A chunked body's size is known only while it is read; its framing gets 64 KiB.
    if (phase_ == Phase::Body) budget = limits_.max_body_bytes + 65536 - std::min(limits_.max_body_bytes + 65536, phase_bytes_);
    if (budget == 0) {
      if (phase_ == Phase::Head)
        refuse(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) +
                        " bytes (--max-header-bytes)", "request_header_too_large");
      else
        refuse(413, "the request body exceeds " + std::to_string(limits_.max_body_bytes) + " bytes (--max-body)",
               "request_too_large");
      return -1;
    }
    if (pos_ == len_) {
      auto timeout = std::chrono::duration_cast<Clock::duration>(limits_.read_timeout);
      if (deadline_) timeout = std::min(timeout, *deadline_ - Clock::now());
      const int w = timeout.count() > 0 ? wait_fd(fd_, POLLIN, wake_, timeout) : 0;
      if (w == 0) {
        if (phase_ != Phase::Idle && seen_bytes_ > 0)
          refuse(408, "the request did not arrive within " + std::to_string(limits_.read_timeout.count()) +
                          " s (--read-timeout)", "request_timeout");
        timed_out_ = true;
        return -1;
      }
      if (w < 0) return -1;
      ssize_t r;
      do r = ::recv(fd_, buf_, sizeof buf_, 0);
      while (r < 0 && errno == EINTR);
      if (r <= 0) return r;
      pos_ = 0;
      len_ = size_t(r);
    }
    const size_t k = std::min({n, budget, len_ - pos_});
    std::memcpy(out, buf_ + pos_, k);
    pos_ += k;
    phase_bytes_ += k;
    seen_bytes_ += k;
    return ssize_t(k);
  }

  ssize_t write(const char* p, size_t n) override {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::send(fd_, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        done += size_t(r);
        wrote_ = true;
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (wait_fd(fd_, POLLOUT, wake_, limits_.write_timeout) <= 0) return -1;
      } else {
        return -1;
      }
    }
    return ssize_t(n);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  socket_t socket() const override { return fd_; }

  // Waits up to `timeout` for the next request's first byte (true), or the end.
  bool wait_for_request(Clock::duration timeout) const {
    return pos_ < len_ || wait_fd(fd_, POLLIN, wake_, timeout) > 0;
  }
  void begin_request(Clock::time_point deadline) {
    phase_ = Phase::Head;
    phase_bytes_ = seen_bytes_ = 0;
    deadline_ = deadline;
    wrote_ = timed_out_ = false;
  }
  // body_length: Content-Length, or -1 for a chunked body, 0 for none.
  void headers_read(int64_t body_length) {
    phase_ = Phase::Body;
    phase_bytes_ = 0;
    body_length_ = body_length;
  }
  // The request had a body and cpp-httplib did not read it (a handler answered
  // before routing): the connection cannot carry another request.
  bool body_unread() const {
    return phase_ == Phase::Body && (body_length_ < 0 ? phase_bytes_ == 0 : phase_bytes_ < size_t(body_length_));
  }
  void end_request() {
    phase_ = Phase::Idle;
    deadline_.reset();
  }
  // The client shut down its side or reset the connection.
  bool peer_closed() const {
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
  }
  void refuse(int status, std::string message, std::string code) {
    if (refusal_.status == 0) refusal_ = {status, std::move(message), std::move(code)};
  }

  struct Verdict {
    int status = 0;
    std::string message, code;
  };
  const Verdict& verdict() const { return refusal_; }
  bool wrote() const { return wrote_; }
  bool timed_out() const { return timed_out_; }
  size_t seen_bytes() const { return seen_bytes_; }

 private:
  void address(bool peer, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if ((peer ? ::getpeername : ::getsockname)(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
      port = ntohs(s->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
      port = ntohs(s->sin6_port);
    }
    ip = buf;
  }

  int fd_;
  const HttpLimits& limits_;
  int wake_;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
  Phase phase_ = Phase::Idle;
  size_t phase_bytes_ = 0, seen_bytes_ = 0;
  int64_t body_length_ = 0;
  std::optional<Clock::time_point> deadline_;
  bool wrote_ = false, timed_out_ = false;
  Verdict refusal_;
};

thread_local GuardedServer::Connection* GuardedServer::t_connection_ = nullptr;
thread_local bool GuardedServer::t_over_limit_ = false;

// The threads that serve connections: one per open connection, started on demand
// (cpp-httplib's own pool has a fixed size and an unbounded queue behind it).
class GuardedServer::ConnectionPool final : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(GuardedServer& server) : server_(server) {}
  void enqueue(std::function<void()> fn) override {
    if (server_.open_.load() >= server_.limits_.max_connections) {
      t_over_limit_ = true;  // fn() hands the socket to the Rejecter at once
      fn();
      t_over_limit_ = false;
      return;
    }
    ++server_.open_;
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_) threads_.emplace_back([this] { work(); });
    else cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      --server_.open_;
      lock.lock();
    }
  }
  GuardedServer& server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

// Closes connections without losing what was written to them: a socket closed with
// unread input sends a reset, and the client may never see the 503 or 413 it was
// sent. One thread answers connections beyond the bound with 503, then for these and
// for refused requests shuts the write side and reads what the client still sends
// until it closes, a second passes without input, or 5 s in all.
class GuardedServer::Rejecter {
 public:
  explicit Rejecter(size_t max_connections)
      : response_(canned_response(503, "Service Unavailable",
                                  "the server has " + std::to_string(max_connections) +
                                      " connections open (--max-connections); retry later",
                                  "too_many_connections")) {
    if (::pipe2(notify_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("cannot create a pipe");
    thread_ = std::thread([this] { run(); });
  }
  ~Rejecter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    poke();
    thread_.join();
    for (auto& [fd, reject] : incoming_) ::close(fd);
    ::close(notify_[0]);
    ::close(notify_[1]);
  }
  void reject(int fd) { add(fd, true); }
  void linger(int fd) { add(fd, false); }

 private:
  static constexpr size_t kMaxLingering = 4096;
  void add(int fd, bool reject) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.emplace_back(fd, reject);
    }
    poke();
  }
  void poke() {
    const char c = 1;
    [[maybe_unused]] ssize_t r = ::write(notify_[1], &c, 1);
  }
  static bool drain(int fd) {  // false: the client closed or the socket failed
    char scratch[16384];
    for (;;) {
      const ssize_t r = ::recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
      if (r > 0) continue;
      if (r < 0 && errno == EINTR) continue;
      return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
  void run() {
    struct Lingering {
      int fd;
      Clock::time_point until, last;  // a second after the last input; 5 s after the start
    };
    std::vector<Lingering> lingering;
    for (;;) {
      std::vector<std::pair<int, bool>> fresh;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
        fresh.swap(incoming_);
      }
      const auto now = Clock::now();
      for (auto [fd, reject] : fresh) {
        if (reject) {
          drain(fd);
          [[maybe_unused]] ssize_t r = ::send(fd, response_.data(), response_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        ::shutdown(fd, SHUT_WR);
        if (lingering.size() >= kMaxLingering) {
          ::close(lingering.front().fd);
          lingering.erase(lingering.begin());
        }
        lingering.push_back({fd, now + std::chrono::seconds(1), now + std::chrono::seconds(5)});
      }
      std::vector<pollfd> p{{notify_[0], POLLIN, 0}};
      for (const auto& l : lingering) p.push_back({l.fd, POLLIN, 0});
      int r = ::poll(p.data(), p.size(), lingering.empty() ? -1 : 100);
      if (r < 0 && errno != EINTR) break;
      if (p[0].revents) {
        char buf[256];
        while (::read(notify_[0], buf, sizeof buf) > 0) {
        }
      }
      const auto later = Clock::now();
      std::vector<Lingering> kept;
      for (size_t i = 0; i < lingering.size(); ++i) {
        bool done = later >= lingering[i].until;
        if (!done && p[i + 1].revents) {
          done = !drain(lingering[i].fd);
          lingering[i].until = std::min(later + std::chrono::seconds(1), lingering[i].last);
        }
        if (done) ::close(lingering[i].fd);
        else kept.push_back(lingering[i]);
      }
      lingering.swap(kept);
    }
    for (const auto& l : lingering) ::close(l.fd);
  }

  const std::string response_;
  int notify_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<std::pair<int, bool>> incoming_;
  bool stop_ = false;
  std::thread thread_;
};

GuardedServer::GuardedServer(const HttpLimits& limits, Metrics& metrics) : limits_(limits), metrics_(metrics) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("cannot create a pipe");
  rejecter_ = std::make_unique<Rejecter>(limits_.max_connections);
  new_task_queue = [this] { return new ConnectionPool(*this); };
  set_payload_max_length(limits_.max_body_bytes);
  set_keep_alive_max_count(limits_.max_requests_per_connection);
  set_keep_alive_timeout(limits_.idle_timeout.count());
  // A response sent before the request's body was read (an API-key refusal) ends the
  // connection: the body would be taken for the next request. So does a refusal (the serve loop closes it).
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (t_connection_ && (t_connection_->body_unread() || t_connection_->verdict().status != 0)) {
      res.headers.erase("Keep-Alive");
      if (!res.has_header("Connection")) res.set_header("Connection", "close");
    }
  });
  // A refused request's client that waits for "100 Continue" gets the refusal instead.
  set_expect_100_continue_handler([](const httplib::Request&, httplib::Response& res) {
    const Refusal r = refusal();
    if (r.status == 0) return 100;
    res.status = r.status;
    return r.status;
  });
}

GuardedServer::~GuardedServer() {
  rejecter_.reset();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

GuardedServer::Refusal GuardedServer::refusal() {
  if (!t_connection_) return {};
  const auto& v = t_connection_->verdict();
  return {v.status, v.message, v.code};
}

bool GuardedServer::client_gone() { return t_connection_ && t_connection_->peer_closed(); }

void GuardedServer::close_all() {
  const char c = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_[1], &c, 1);
  stop();
}

size_t GuardedServer::open_connections() const { return open_.load(); }

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (t_over_limit_) {
    ++metrics_.http_connections_refused_total;
    rejecter_->reject(sock);
    return true;
  }
  ++metrics_.http_connections_open;
  const bool clean = serve(sock);
  --metrics_.http_connections_open;
  if (clean) {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  } else {
    rejecter_->linger(sock);
  }
  return true;
}

bool GuardedServer::serve(socket_t sock) {
  Connection c(sock, limits_, wake_[0]);
  t_connection_ = &c;
  struct Reset {
    ~Reset() { t_connection_ = nullptr; }
  } reset;
  auto deadline = Clock::now() + limits_.read_timeout;
  for (size_t n = 0; n < limits_.max_requests_per_connection; ++n) {
    if (n > 0) {
      if (!c.wait_for_request(limits_.idle_timeout)) return true;
      deadline = Clock::now() + limits_.read_timeout;
    }
    const bool last = draining_ || n + 1 == limits_.max_requests_per_connection;
    c.begin_request(deadline);
    bool closed = false;
    const bool ok = process_request(c, last, closed, [&](httplib::Request& req) {
      // Headers are in: check their count and the announced body size before the
      // body is read (or the handler runs).
      const size_t lines = req.headers.size() >= 4 ? req.headers.size() - 4 : 0;  // less REMOTE_ADDR and co.
      if (lines > limits_.max_headers) {
        c.refuse(431, "the request has " + std::to_string(lines) + " header lines; the limit is " +
                          std::to_string(limits_.max_headers) + " (--max-headers)",
                 "request_header_too_large");
      }
      int64_t body_length = 0;
      if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
        body_length = -1;
      } else if (req.has_header("Content-Length")) {
        const std::string v = req.get_header_value("Content-Length");
        errno = 0;
        const unsigned long long len = std::strtoull(v.c_str(), nullptr, 10);
        if (c.verdict().status == 0 && (errno == ERANGE || len > limits_.max_body_bytes))
          c.refuse(413, "the request body is " + v + " bytes; the limit is " + std::to_string(limits_.max_body_bytes) +
                            " bytes (--max-body)",
                   "request_too_large");
        body_length = int64_t(std::min<unsigned long long>(len, INT64_MAX));
      }
      c.headers_read(body_length);
      if (c.verdict().status != 0 || last) {
        req.headers.erase("Connection");
        req.set_header("Connection", "close");
      }
    });
    const bool unread = c.body_unread();
    c.end_request();
    const auto& v = c.verdict();
    if (v.status != 0) {
      ++metrics_.http_requests_refused_total;
      // A request line that never ended: cpp-httplib answered nothing.
      if (!c.wrote()) {
        const std::string r = canned_response(v.status, v.status == 408 ? "Request Timeout"
                                                        : v.status == 413 ? "Payload Too Large"
                                                                          : "Request Header Fields Too Large",
                                              v.message, v.code);
        c.write(r.data(), r.size());
      }
      return false;  // the rest of the request is unread
    }
    if (unread) return false;
    if (c.timed_out()) return c.seen_bytes() == 0;
    if (!ok || closed || last) return true;
  }
  return true;
}

}  // namespace tessera::server
