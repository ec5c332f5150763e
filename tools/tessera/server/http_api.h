// The OpenAI-compatible HTTP API over cpp-httplib: routes, the API key, OpenAI's
// error objects for every failure, and Server-Sent Events streaming. The model is
// attached once loaded; until then every route but /health answers 503.
#pragma once
#include <atomic>
#include <memory>
#include <string>

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
  void attach(EngineWorker* worker, Metrics* metrics, ModelContext model);

 private:
  struct Ready {
    EngineWorker* worker;
    Metrics* metrics;
    ModelContext model;
  };
  std::string api_key_;
  std::shared_ptr<const Ready> ready_;  // read with std::atomic_load
};

}  // namespace tessera::server
