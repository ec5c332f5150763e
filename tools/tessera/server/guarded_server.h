// cpp-httplib's Server with the limits a public server needs (cpp-httplib 0.11 has
// no total read deadline, no header size or count bound and no connection bound):
// every connection is read through a ConnectionStream that bounds the request head's
// bytes, the body's bytes and the time the whole request may take to arrive, so a
// slow or endless client costs one thread for at most --read-timeout; connections
// beyond --max-connections get a 503 at once; a handler can ask whether its client is
// still there; a drain closes connections after their current request and wakes every
// blocked read and write at the end.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <httplib.h>

namespace tessera::server {

struct Metrics;

struct HttpLimits {
  size_t max_connections = 1024;           // open connections; more get 503
  size_t max_body_bytes = size_t(8) << 20;  // request body
  size_t max_header_bytes = 16384;         // request line and headers together
  size_t max_headers = 100;                // header lines
  std::chrono::seconds read_timeout{10};   // a whole request (line, headers, body) must arrive in this
  std::chrono::seconds idle_timeout{5};    // a kept-alive connection without a new request is closed
  std::chrono::seconds write_timeout{10};  // a client that takes no data for this long is dropped
  size_t max_requests_per_connection = 100;
};

class GuardedServer : public httplib::Server {
 public:
  GuardedServer(const HttpLimits& limits, Metrics& metrics);
  ~GuardedServer() override;

  // Why the current request (on this thread) is refused: 413 (body too large), 431
  // (header bytes or lines), 408 (it did not arrive in time), with a message; or
  // status 0. Set before routing (Content-Length, header count) or when a read fails.
  struct Refusal {
    int status = 0;
    std::string message, code;
  };
  static Refusal refusal();
  // The current request's client has closed its end (or reset the connection).
  static bool client_gone();

  // From now on every connection closes after its current request.
  void begin_drain() { draining_ = true; }
  // Stop accepting, and make every blocked read and write on a connection fail now.
  void close_all();
  size_t open_connections() const;

 private:
  class Connection;
  class ConnectionPool;
  class Rejecter;
  bool process_and_close_socket(socket_t sock) override;
  // Serves the connection's requests; false when input may be left unread (close
  // it gently).
  bool serve(socket_t sock);
  static thread_local Connection* t_connection_;  // the connection this thread serves
  static thread_local bool t_over_limit_;         // the listener hands over one beyond the bound

  HttpLimits limits_;
  Metrics& metrics_;
  int wake_[2] = {-1, -1};  // readable once close_all() ran
  std::atomic<bool> draining_{false};
  std::atomic<size_t> open_{0};  // connections being served (not those refused)
  std::unique_ptr<Rejecter> rejecter_;
};

}  // namespace tessera::server
