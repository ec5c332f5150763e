// The OpenAI-compatible HTTP API over cpp-httplib: routes, the API key, OpenAI's
// error objects for every failure (the GuardedServer's limits included; on
// Anthropic's paths, Anthropic's shape), and Server-Sent Events streaming. Anthropic's
// Messages and OpenAI's Responses are installed beside it (dialect_routes.h). The
// model is attached once loaded; until then every route but /health answers 503. A
// request whose client goes away is cancelled. While draining, /health and new
// generation requests answer 503.
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

// What a generation route needs once the model is loaded.
struct ServedModel {
  EngineWorker* worker;
  Metrics* metrics;
  ModelContext model;
  EmbeddingContext embeddings;
};

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

  // For the routes of other APIs (dialect_routes.h): the model (null while it
  // loads), whether the server is draining, and the counter of responses in flight.
  std::shared_ptr<const ServedModel> served() const { return std::atomic_load(&ready_); }
  bool draining() const { return draining_; }
  const std::shared_ptr<std::atomic<int64_t>>& in_flight_counter() const { return in_flight_; }

 private:
  using Ready = ServedModel;
  std::string api_key_;
  std::shared_ptr<const Ready> ready_;  // read with std::atomic_load
  std::atomic<bool> draining_{false};
  // Shared with each response's content provider, which may outlive a handler.
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace tessera::server
