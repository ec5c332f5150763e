#include "server/anthropic_routes.h"

#include <httplib.h>

#include <chrono>

#include "server/anthropic_api.h"
#include "server/exchange.h"
#include "server/guarded_server.h"
#include "server/http_api.h"

namespace tessera::server {

using nlohmann::json;

namespace {

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump(anthropic_error_body(status, message)), "application/json");
}

// Runs `handle`, which reads the request body: a body that is not JSON, or an ApiError,
// is answered here in Anthropic's shape. False when it was.
template <typename F>
bool read_request(httplib::Response& res, F&& handle) {
  try {
    handle();
    return true;
  } catch (const json::exception& e) {
    send_error(res, 400, std::string("invalid JSON body: ") + e.what());
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what());
  }
  return false;
}

// The model, or null after answering 503 (loading, or draining for generation).
std::shared_ptr<const ServedModel> served_or_503(const HttpApi& api, httplib::Response& res, bool generation) {
  auto r = api.served();
  if (!r) send_error(res, 503, "the model is loading");
  else if (generation && api.draining()) send_error(res, 503, "the server is shutting down"), r = nullptr;
  return r;
}

const char* stop_reason(const Exchange& ex, bool tool_calls) {
  return anthropic_stop_reason(ex.ended, ex.stop_string, tool_calls);
}

}  // namespace

void install_anthropic_routes(httplib::Server& svr, const HttpApi& api) {
  svr.Post("/v1/messages", [&api](const httplib::Request& req, httplib::Response& res) {
    auto r = served_or_503(api, res, true);
    if (!r) return;
    auto in_flight = std::make_shared<InFlight>(api.in_flight_counter());
    ParsedRequest parsed;
    if (!read_request(res, [&] { parsed = parse_messages_request(RequestJson::parse(req.body), r->model); })) {
      ++r->metrics->request_errors_total;
      return;
    }
    ResponseIds ids{new_id("msg_"),
                    std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count(),
                    r->model.model_id};
    auto ex = std::make_shared<Exchange>(std::move(parsed), std::move(ids), *r->model.tokenizer);
    ex->job = std::make_shared<Job>(ex->req.gen);
    if (!r->worker->submit(ex->job)) {
      ++r->metrics->request_errors_total;
      send_error(res, 503, "the server is busy: too many requests are waiting; retry later");
      return;
    }
    const int64_t input_tokens = int64_t(ex->req.gen.prompt.size());
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
        for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
      }
      if (!error.empty()) {  // the request was validated: an error here is the engine's
        ++r->metrics->request_errors_total;
        send_error(res, 500, error);
        return;
      }
      res.set_content(dump(message_response(ex->ids, all.content, all.tool_calls, stop_reason(*ex, !all.tool_calls.empty()),
                                            ex->answer.stop_sequence(), input_tokens, ex->completion_tokens)),
                      "application/json");
      return;
    }
    auto events = std::make_shared<MessageEvents>(ex->ids, input_tokens);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [ex, events, in_flight](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
          if (!ex->role_sent) {  // message_start goes out before the first token
            ex->role_sent = true;
            if (!write(events->start())) return ex->job->cancel(), false;
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
              write(MessageEvents::error(500, error));
              break;
            }
            std::string out = events->delta(d);
            if (ex->finished)
              out += events->finish(stop_reason(*ex, !d.tool_calls.empty()), ex->answer.stop_sequence(),
                                    ex->completion_tokens);
            if (!write(out)) {
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
  });

  // The prompt's size as this server renders and tokenizes it, without generating.
  svr.Post("/v1/messages/count_tokens", [&api](const httplib::Request& req, httplib::Response& res) {
    auto r = served_or_503(api, res, false);
    if (!r) return;
    read_request(res, [&] {
      const ParsedRequest p = parse_messages_request(RequestJson::parse(req.body), r->model, true);
      res.set_content(dump(json{{"input_tokens", p.gen.prompt.size()}}), "application/json");
    });
  });
}

}  // namespace tessera::server
