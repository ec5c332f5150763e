#include "server/dialect_routes.h"

#include <httplib.h>

#include <chrono>

#include "server/anthropic_api.h"
#include "server/dialect.h"
#include "server/guarded_server.h"
#include "server/http_api.h"
#include "server/responses_api.h"

namespace tessera::server {

using nlohmann::json;

namespace {

void send_error(httplib::Response& res, const ApiDialect& d, int status, const std::string& message,
                const std::string& param = {}, const std::string& code = {}) {
  res.status = status;
  res.set_content(dump(d.error(status, message, param, code)), "application/json");
}

// Runs `handle`, which reads the request body: a body that is not JSON, or an ApiError,
// is answered here in the dialect's shape. False when it was.
template <typename F>
bool read_request(httplib::Response& res, const ApiDialect& d, F&& handle) {
  try {
    handle();
    return true;
  } catch (const json::exception& e) {
    send_error(res, d, 400, std::string("invalid JSON body: ") + e.what(), "", "invalid_json");
  } catch (const ApiError& e) {
    send_error(res, d, e.status, e.what(), e.param, e.code);
  }
  return false;
}

// The model, or null after answering 503 (loading, or draining for generation).
std::shared_ptr<const ServedModel> served_or_503(const HttpApi& api, const ApiDialect& d, httplib::Response& res,
                                                 bool generation) {
  auto r = api.served();
  if (!r) {
    send_error(res, d, 503, "the model is loading", "", "loading");
  } else if (generation && api.draining()) {
    send_error(res, d, 503, "the server is shutting down", "", "shutting_down");
    r = nullptr;
  }
  return r;
}

void generate(const HttpApi& api, const ApiDialect& dialect, const httplib::Request& req, httplib::Response& res) {
  auto r = served_or_503(api, dialect, res, true);
  if (!r) return;
  auto in_flight = std::make_shared<InFlight>(api.in_flight_counter());
  ParsedRequest parsed;
  json context;
  if (!read_request(res, dialect, [&] { parsed = dialect.parse(RequestJson::parse(req.body), r->model, context); })) {
    ++r->metrics->request_errors_total;
    return;
  }
  ResponseIds ids{new_id(dialect.id_prefix()),
                  std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count(),
                  r->model.model_id};
  auto ex = std::make_shared<Exchange>(std::move(parsed), std::move(ids), *r->model.tokenizer);
  ex->job = std::make_shared<Job>(ex->req.gen);
  if (!r->worker->submit(ex->job)) {
    ++r->metrics->request_errors_total;
    send_error(res, dialect, 503, "the server is busy: too many requests are waiting; retry later", "", "queue_full");
    return;
  }
  if (!ex->req.stream) {
    const char* finish = nullptr;
    std::string error;
    AnswerDelta all;
    while (!ex->finished) {
      if (GuardedServer::client_gone()) {  // nobody will read the answer
        ex->job->cancel();
        ++r->metrics->requests_cancelled_total;
        return;
      }
      AnswerDelta d = ex->advance(ex->job->wait(std::chrono::milliseconds(100)), finish, error);
      all.content += d.content;
      all.reasoning += d.reasoning;
      for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
    }
    if (!error.empty()) {  // the request was validated: an error here is the engine's
      ++r->metrics->request_errors_total;
      send_error(res, dialect, 500, error);
      return;
    }
    res.set_content(dump(dialect.response(*ex, all, context)), "application/json");
    return;
  }
  std::shared_ptr<ApiDialect::Stream> events = dialect.stream(*ex, context);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, events, in_flight](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
        if (!ex->role_sent) {  // the stream's first events go out before the first token
          ex->role_sent = true;
          if (!write(events->start(*ex))) return ex->job->cancel(), false;
        }
        while (!ex->finished) {
          if (!sink.is_writable()) {
            ex->job->cancel();  // the client went away
            return false;
          }
          const char* finish = nullptr;
          std::string error;
          const AnswerDelta d = ex->advance(ex->job->wait(std::chrono::milliseconds(100)), finish, error);
          if (!error.empty()) {
            write(events->error(*ex, error));
            break;
          }
          if (!write(events->advance(*ex, d))) {
            ex->job->cancel();
            return false;
          }
        }
        sink.done();
        return true;
      },
      [ex, metrics = r->metrics](bool success) {
        if (!success || !ex->finished) {  // the stream was cut: the client went away or stopped reading
          ex->job->cancel();
          ++metrics->requests_cancelled_total;
        }
      });
}

}  // namespace

void install_dialect_routes(httplib::Server& svr, const HttpApi& api) {
  svr.Post("/v1/messages", [&api](const httplib::Request& req, httplib::Response& res) {
    generate(api, anthropic_messages_dialect(), req, res);
  });
  // The prompt's size as this server renders and tokenizes it, without generating.
  svr.Post("/v1/messages/count_tokens", [&api](const httplib::Request& req, httplib::Response& res) {
    const ApiDialect& d = anthropic_messages_dialect();
    auto r = served_or_503(api, d, res, false);
    if (!r) return;
    read_request(res, d, [&] {
      const ParsedRequest p = parse_messages_request(RequestJson::parse(req.body), r->model, true);
      res.set_content(dump(json{{"input_tokens", p.gen.prompt.size()}}), "application/json");
    });
  });
  svr.Post("/v1/responses", [&api](const httplib::Request& req, httplib::Response& res) {
    generate(api, responses_dialect(), req, res);
  });
}

}  // namespace tessera::server
