// The OpenAI-compatible HTTP API over cpp-httplib: routes, the API key, OpenAI's
// error objects for every failure (the GuardedServer's limits included), and
// Server-Sent Events streaming. The model is attached once loaded; until then every
// route but /health answers 503. A request whose client goes away is cancelled. While
// draining, /health and new generation requests answer 503.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/embeddings_api.h"
#include "server/engine_worker.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace httplib {
class Server;
}

namespace tessera::server {

class HttpApi {
 public:
  explicit HttpApi(std::string api_key) : api_key_(std::move(api_key)) {}
  void install(httplib::Server& server);
  // The model is ready: requests are served from now on.
  void attach(EngineWorker* worker, Metrics* metrics, ModelContext model, EmbeddingContext embeddings = {});
  // The server is shutting down: no new generation request is taken.
  void begin_drain() { draining_ = true; }
  // Generation requests whose response is not finished yet.
  int64_t in_flight() const { return in_flight_->load(); }

 private:
  struct Ready {
    EngineWorker* worker;
    Metrics* metrics;
    ModelContext model;
    EmbeddingContext embeddings;
  };
  std::string api_key_;
  std::shared_ptr<const Ready> ready_;  // read with std::atomic_load
  std::atomic<bool> draining_{false};
  // Shared with each response's content provider, which may outlive a handler.
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tessera::server
