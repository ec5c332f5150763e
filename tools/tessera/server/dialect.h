// An API other than OpenAI's chat and completions served over the same generation
// loop (dialect_routes.h): how it parses a request, renders the whole answer, streams
// its events and words its errors. Anthropic's Messages and OpenAI's Responses are
// dialects.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/exchange.h"

namespace tessera::server {

// tessera's sampling extensions of the chat endpoint (llama.cpp's and vLLM's names,
// llama.cpp's GBNF `grammar` among them), passed through unchanged by the dialects'
// translations into the chat form.
inline constexpr const char* kSamplingExtensions[] = {"seed", "min_p", "repeat_penalty", "ignore_eos",
                                                       "speculative.n_max", "grammar"};

class ApiDialect {
 public:
  virtual ~ApiDialect() = default;
  // The response id's prefix ("msg_", "resp_").
  virtual const char* id_prefix() const = 0;
  // The error object answered with `status`.
  virtual nlohmann::json error(int status, const std::string& message, const std::string& param,
                               const std::string& code) const = 0;
  // The request; `context` keeps what the response needs of it besides the
  // ParsedRequest (e.g. fields a response echoes). Throws ApiError.
  virtual ParsedRequest parse(const RequestJson& body, const ModelContext& m, nlohmann::json& context) const = 0;
  // The whole answer: `all` holds its text and tool calls.
  virtual nlohmann::json response(const Exchange& ex, const AnswerDelta& all, const nlohmann::json& context) const = 0;

  // A streamed answer's Server-Sent Events, one writer per request.
  class Stream {
   public:
    virtual ~Stream() = default;
    // Before the first token.
    virtual std::string start(const Exchange& ex) = 0;
    // What `d` adds; once ex.finished, also the stream's end.
    virtual std::string advance(const Exchange& ex, const AnswerDelta& d) = 0;
    // The engine failed after the start: the last event.
    virtual std::string error(const Exchange& ex, const std::string& message) = 0;
  };
  virtual std::unique_ptr<Stream> stream(const Exchange& ex, const nlohmann::json& context) const = 0;
};

}  // namespace tessera::server
