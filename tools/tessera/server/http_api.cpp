#include "server/http_api.h"

#include <algorithm>

#include <httplib.h>

#include <atomic>
#include <chrono>

#include "server/anthropic_api.h"
#include "server/answer_stream.h"
#include "server/dialect_routes.h"
#include "server/exchange.h"
#include "server/guarded_server.h"
#include "server/tokenize_api.h"
#include "tessera/tokenizer.h"

namespace tessera::server {

using nlohmann::json;

namespace {

void send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// An error of the shared handlers (limits, API key, unknown path, exceptions), in the
// shape of the API that `req`'s path belongs to.
void send_error(const httplib::Request& req, httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code) {
  send_error(res, status,
             is_anthropic_path(req.path) ? anthropic_error_body(status, message) : error_body(message, type, "", code));
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// Runs `handle`, which reads the request body: a body that is not JSON, or an ApiError,
// is answered here with its 4xx. False when it was.
template <typename F>
bool read_request(httplib::Response& res, F&& handle) {
  try {
    handle();
    return true;
  } catch (const json::exception& e) {
    send_error(res, 400, error_body(std::string("invalid JSON body: ") + e.what(), "invalid_request_error", "",
                                    "invalid_json"));
  } catch (const ApiError& e) {
    send_error(res, e.status, error_body(e));
  }
  return false;
}

}  // namespace

void HttpApi::attach(EngineWorker* worker, Metrics* metrics, ModelContext model, EmbeddingContext embeddings) {
  std::atomic_store(&ready_,
                    std::make_shared<const Ready>(Ready{worker, metrics, std::move(model), std::move(embeddings)}));
}

void HttpApi::install(httplib::Server& svr) {
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A request over a limit of the GuardedServer (its body is not read).
    if (const auto r = GuardedServer::refusal(); r.status != 0) {
      send_error(req, res, r.status, r.message, "invalid_request_error", r.code);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (api_key_.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    // OpenAI's clients send "Authorization: Bearer KEY", Anthropic's "x-api-key: KEY".
    const std::string auth = req.get_header_value("Authorization"), x_api_key = req.get_header_value("x-api-key");
    if (auth != "Bearer " + api_key_ && x_api_key != api_key_) {
      send_error(req, res, 401,
                 auth.empty() && x_api_key.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                                                   : "invalid API key",
                 "invalid_request_error", "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib answers 400 when a read fails; say which limit made it fail.
    if (const auto r = GuardedServer::refusal(); r.status != 0) {
      send_error(req, res, r.status, r.message, "invalid_request_error", r.code);
      return;
    }
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(req, res, 404, "unknown path " + req.path, "invalid_request_error", "not_found");
    else
      send_error(req, res, res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error", "");
  });
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(req, res, 500, what, "server_error", "");
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    if (!std::atomic_load(&ready_)) {
      send_error(res, 503, error_body("the model is loading", "unavailable", "", "loading"));
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });

  auto ready_or_503 = [this](httplib::Response& res) -> std::shared_ptr<const Ready> {
    auto r = std::atomic_load(&ready_);
    if (!r) send_error(res, 503, error_body("the model is loading", "unavailable", "", "loading"));
    return r;
  };

  svr.Get("/metrics", [ready_or_503](const httplib::Request&, httplib::Response& res) {
    if (auto r = ready_or_503(res)) res.set_content(r->metrics->render(), "text/plain; version=0.0.4");
  });

  svr.Get("/v1/models", [ready_or_503](const httplib::Request&, httplib::Response& res) {
    auto r = ready_or_503(res);
    if (!r) return;
    json m = {{"id", r->model.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });

  auto generate = [this, ready_or_503](bool chat) {
    return [this, ready_or_503, chat](const httplib::Request& req, httplib::Response& res) {
      auto r = ready_or_503(res);
      if (!r) return;
      if (draining_) {
        send_error(res, 503, error_body("the server is shutting down", "server_error", "", "shutting_down"));
        return;
      }
      auto in_flight = std::make_shared<InFlight>(in_flight_);
      ParsedRequest parsed;
      if (!read_request(res, [&] {
            const RequestJson body = RequestJson::parse(req.body);
            parsed = chat ? parse_chat_request(body, r->model) : parse_completion_request(body, r->model);
          })) {
        ++r->metrics->request_errors_total;
        return;
      }
      ResponseIds ids{new_id(chat ? "chatcmpl-" : "cmpl-"),
                      std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count(),
                      r->model.model_id};
      // One job for the request, one answer (Exchange) per choice (OpenAI's n).
      const int n = parsed.n;
      auto job = std::make_shared<Job>(parsed.gen, n);
      std::vector<std::shared_ptr<Exchange>> exs;
      for (int i = 0; i < n; ++i) {
        exs.push_back(std::make_shared<Exchange>(parsed, ids, *r->model.tokenizer));
        exs.back()->job = job;
        exs.back()->choice = i;
      }
      if (!r->worker->submit(job)) {
        ++r->metrics->request_errors_total;
        send_error(res, 503, error_body("the server is busy: too many requests are waiting; retry later",
                                        "server_error", "", "queue_full"));
        return;
      }
      const int64_t prompt_tokens = int64_t(parsed.gen.prompt.size());
      auto all_finished = [exs] {
        return std::all_of(exs.begin(), exs.end(), [](const auto& e) { return e->finished; });
      };
      auto completion_tokens = [exs] {
        int64_t sum = 0;
        for (const auto& e : exs) sum += e->completion_tokens;
        return sum;
      };
      auto reasoning_tokens = [exs] {
        int64_t sum = 0;
        for (const auto& e : exs) sum += e->answer.reasoning_tokens();
        return sum;
      };
      // A choice's JSON (built for choice 0) placed at its index.
      auto at_index = [](json j, int i) {
        if (j.contains("choices") && !j["choices"].empty()) j["choices"][0]["index"] = i;
        return j;
      };
      if (!parsed.stream) {
        std::vector<const char*> finish(size_t(n), "stop");
        std::string error;
        std::vector<AnswerDelta> all(static_cast<size_t>(n));
        while (!all_finished()) {
          if (GuardedServer::client_gone()) {  // nobody will read the answer
            job->cancel();
            ++r->metrics->requests_cancelled_total;
            return;
          }
          const std::vector<Job::Event> events = job->wait(std::chrono::milliseconds(100));
          for (int i = 0; i < n; ++i) {
            AnswerDelta d = exs[size_t(i)]->advance(events, finish[size_t(i)], error);
            AnswerDelta& a = all[size_t(i)];
            a.content += d.content;
            a.reasoning += d.reasoning;
            for (auto& t : d.tokens) a.tokens.push_back(std::move(t));
            for (auto& c : d.tool_calls) a.tool_calls.push_back(std::move(c));
          }
        }
        if (!error.empty()) {  // the request was validated: an error here is the engine's
          ++r->metrics->request_errors_total;
          send_error(res, 500, error_body(error, "server_error", "", ""));
          return;
        }
        json out;
        for (int i = 0; i < n; ++i) {
          const Exchange& ex = *exs[size_t(i)];
          const AnswerDelta& a = all[size_t(i)];
          json one = completion_response(ex.ids, chat, a.content, finish[size_t(i)], prompt_tokens,
                                         ex.completion_tokens, ex.logprobs(a.tokens), a.tool_calls, a.reasoning);
          if (i == 0) out = std::move(one);
          else out["choices"].push_back(at_index(one, i)["choices"][0]);
        }
        out["usage"] = usage_json(prompt_tokens, completion_tokens(), reasoning_tokens());
        res.set_content(dump(out), "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [exs, job, chat, n, prompt_tokens, in_flight, all_finished, completion_tokens, reasoning_tokens, at_index](
              size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
            for (int i = 0; i < n; ++i) {
              Exchange& ex = *exs[size_t(i)];
              if (chat && !ex.role_sent) {
                ex.role_sent = true;
                if (!write(sse(at_index(stream_chunk(ex.ids, true, "", nullptr, true), i)))) return job->cancel(), false;
              }
            }
            while (!all_finished()) {
              if (!sink.is_writable()) {
                job->cancel();  // the client went away
                return false;
              }
              const std::vector<Job::Event> events = job->wait(std::chrono::milliseconds(100));
              std::string error;
              for (int i = 0; i < n; ++i) {
                Exchange& ex = *exs[size_t(i)];
                if (ex.finished) continue;
                const char* finish = nullptr;
                const AnswerDelta d = ex.advance(events, finish, error);
                if (!error.empty()) break;
                if ((!d.content.empty() || !d.reasoning.empty() || !d.tokens.empty()) &&
                    !write(sse(at_index(stream_chunk(ex.ids, chat, d.content, nullptr, false, ex.logprobs(d.tokens), {},
                                                     d.reasoning),
                                        i)))) {
                  job->cancel();
                  return false;
                }
                if (!d.tool_calls.empty() &&
                    !write(sse(at_index(stream_chunk(ex.ids, chat, "", nullptr, false, nullptr, d.tool_calls), i)))) {
                  job->cancel();
                  return false;
                }
                if (finish) write(sse(at_index(stream_chunk(ex.ids, chat, "", finish), i)));
              }
              if (!error.empty()) {
                write(sse(error_body(error, "server_error", "", "")));
                break;
              }
            }
            if (exs[0]->req.include_usage)
              write(sse(usage_chunk(exs[0]->ids, chat, prompt_tokens, completion_tokens(), reasoning_tokens())));
            write("data: [DONE]\n\n");
            sink.done();
            return true;
          },
          [job, all_finished, metrics = r->metrics](bool success) {
            if (!success || !all_finished()) {  // the stream was cut: the client went away or stopped reading
              job->cancel();
              ++metrics->requests_cancelled_total;
            }
          });
    };
  };
  svr.Post("/v1/completions", generate(false));
  svr.Post("/v1/chat/completions", generate(true));

  svr.Post("/v1/embeddings", [this, ready_or_503](const httplib::Request& req, httplib::Response& res) {
    auto r = ready_or_503(res);
    if (!r) return;
    if (draining_) {
      send_error(res, 503, error_body("the server is shutting down", "server_error", "", "shutting_down"));
      return;
    }
    InFlight in_flight(in_flight_);
    EmbeddingRequest parsed;
    if (!read_request(res, [&] {
          parsed = parse_embedding_request(RequestJson::parse(req.body), r->model, r->embeddings);
        })) {
      ++r->metrics->request_errors_total;
      return;
    }
    // The worker computes the pooled states between generation steps.
    auto job = std::make_shared<EmbeddingJob>(std::move(parsed.inputs), *r->embeddings.pooling);
    if (!r->worker->submit(job)) {
      ++r->metrics->request_errors_total;
      send_error(res, 503, error_body("the server is busy: too many requests are waiting; retry later", "server_error",
                                      "", "queue_full"));
      return;
    }
    while (!job->wait(std::chrono::milliseconds(100))) {
      if (GuardedServer::client_gone()) {
        job->cancel();
        ++r->metrics->requests_cancelled_total;
        return;
      }
    }
    if (!job->error.empty()) {
      ++r->metrics->request_errors_total;
      send_error(res, job->busy ? 503 : 500, error_body(job->error, "server_error", "", job->busy ? "busy" : ""));
      return;
    }
    res.set_content(dump(embedding_response(parsed, job->results, r->model.model_id)), "application/json");
  });

  // llama.cpp's tokenizer endpoints: answered here, without the engine's worker.
  auto tokenizer_route = [ready_or_503](json (*respond)(const RequestJson&, const ModelContext&)) {
    return [ready_or_503, respond](const httplib::Request& req, httplib::Response& res) {
      auto r = ready_or_503(res);
      if (!r) return;
      read_request(res, [&] {
        res.set_content(dump(respond(RequestJson::parse(req.body), r->model)), "application/json");
      });
    };
  };
  svr.Post("/tokenize", tokenizer_route(&tokenize_response));
  svr.Post("/detokenize", tokenizer_route(&detokenize_response));

  install_dialect_routes(svr, *this);
}

}  // namespace tessera::server
