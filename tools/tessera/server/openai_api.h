// OpenAI's request and response formats for /v1/completions and /v1/chat/completions:
// validating a request into a GenerationRequest (every bad field is an ApiError with
// OpenAI's error object), and building the response objects and stream chunks.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/generator.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

// An error answered with `status` and {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);
nlohmann::json error_body(const ApiError& e);

// What the request parser needs from the model.
struct ModelContext {
  const Tokenizer* tokenizer = nullptr;
  int64_t n_vocab = 0;
  int64_t n_ctx = 0;
  std::string model_id;
  // Renders messages (and tools) with the chat template into prompt text; empty
  // function = the model has no template. Throws ApiError for a template error.
  // (ordered_json keeps the client's key order, which a template's tojson prints.)
  std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools)> render_chat;
};

struct ParsedRequest {
  bool chat = false;
  GenerationRequest gen;
  std::vector<std::string> stop;  // stop strings
  bool stream = false;
  bool include_usage = false;
};

ParsedRequest parse_completion_request(const nlohmann::json& body, const ModelContext& m);
// `ordered` is the same body parsed with its key order kept (for the template).
ParsedRequest parse_chat_request(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                                 const ModelContext& m);

// "stop" or "length" (OpenAI's finish reasons).
const char* openai_finish_reason(FinishReason r, bool stop_string);

struct ResponseIds {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
nlohmann::json completion_response(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                                   int64_t prompt_tokens, int64_t completion_tokens);
// One stream chunk: text (chat: a content delta; role_only: the first chat chunk with
// the role), finish (null when empty).
nlohmann::json stream_chunk(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                            bool role_only = false);
nlohmann::json usage_chunk(const ResponseIds& ids, bool chat, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace tessera::server
