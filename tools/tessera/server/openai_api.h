// OpenAI's request and response formats for /v1/completions and /v1/chat/completions:
// validating a request into a GenerationRequest (every bad field is an ApiError with
// OpenAI's error object), and building the response objects and stream chunks.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/answer_stream.h"
#include "server/grammar_cache.h"
#include "server/tool_calls.h"
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
  // The most tokens one answer may have (--max-tokens-limit): max_tokens -1 (the rest
  // of the context) and any larger max_tokens are lowered to it; 0 = n_ctx.
  int64_t max_tokens_limit = 0;
  std::string model_id;
  // Renders messages (and tools) with the chat template into prompt text; empty
  // function = the model has no template. Throws ApiError for a template error.
  // (ordered_json keeps the client's key order, which a template's tojson prints.)
  std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools)> render_chat;
  // How the template's model writes tool calls (detect_tool_call_format).
  ToolCallFormat tool_format = ToolCallFormat::None;
  // Speculative decoding: the server's --spec-max when it has a drafter (--spec), the
  // default of a request's "speculative.n_max"; 0 = no drafter (only 0 is accepted).
  int spec_max = 0;
  // Compiled grammars for structured output (response_format, grammar, forced tool
  // calls); null: requests that ask for them are refused.
  std::shared_ptr<GrammarCache> grammars;
};

// Log-probabilities: at most this many alternatives per token (completions'
// `logprobs`, chat's `top_logprobs`).
constexpr int kMaxTopLogprobs = 20;

// The most choices one request may ask for (n).
constexpr int kMaxChoices = 16;

struct ParsedRequest {
  bool chat = false;
  GenerationRequest gen;
  // Choices (OpenAI's n): the prompt is prefilled once and each choice samples with
  // the seed + its index.
  int n = 1;
  std::vector<std::string> stop;  // stop strings
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // report log-probabilities (gen.logprobs = top_logprobs)
  int top_logprobs = 0;   // alternatives per token
  // Chat with `tools` (and tool_choice not "none"): the answer's tool calls are parsed
  // in this format; None: the answer is plain content. Harmony: every chat answer of a
  // harmony template (its channels are parsed; calls only with `tools`).
  ToolCallFormat tool_format = ToolCallFormat::None;
  nlohmann::json tools;            // the request's tools array (null: no calls are parsed)
  bool parallel_tool_calls = true;  // false: only the first call is returned
  // The grammar a forced tool call (tool_choice) puts on the answer, as GBNF.
  std::string tool_grammar;
};

// A request body, parsed once with its key order kept (a chat template's tojson prints
// the client's order).
using RequestJson = nlohmann::ordered_json;
ParsedRequest parse_completion_request(const RequestJson& body, const ModelContext& m);
ParsedRequest parse_chat_request(const RequestJson& body, const ModelContext& m);

// "stop" or "length" (OpenAI's finish reasons).
const char* openai_finish_reason(FinishReason r, bool stop_string);

// A token's bytes as a JSON-safe string: valid UTF-8 characters as they are, each
// byte that is not part of one (a token holding part of a character) as the four
// characters "\xNN" (OpenAI's way); `escaped` tells whether any byte was.
std::string token_display(const std::string& bytes, bool& escaped);
// The `logprobs` object of a choice for these tokens. Completions: {tokens,
// token_logprobs, top_logprobs (per token an object token text -> log-probability:
// the top_n most likely and the chosen token), text_offset (in Unicode characters of
// the answer)}; a token with bytes that are not whole characters is shown as
// "bytes:\xNN...". Chat: {content: [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}]}], refusal: null}. Token text is the token's piece with control
// tokens shown (e.g. "</s>"); -inf is given as -9999.0, as OpenAI does.
nlohmann::json logprobs_json(const std::vector<AnswerToken>& tokens, const Tokenizer& tokenizer, bool chat,
                             int top_n);
// OpenAI's tool_calls array (stream: each with its index).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool stream);

struct ResponseIds {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};
// usage; with reasoning tokens (harmony's analysis) also completion_tokens_details.
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens = 0);
// The whole answer; with tool calls (chat) the message's content is null when empty.
// Reasoning (harmony's analysis channel), when there is some, is the message's
// `reasoning_content` (the field vLLM and llama.cpp's server use).
nlohmann::json completion_response(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                                   int64_t prompt_tokens, int64_t completion_tokens,
                                   const nlohmann::json& logprobs = nullptr, const std::vector<ToolCall>& calls = {},
                                   const std::string& reasoning = {});
// One stream chunk: text (chat: a content delta; role_only: the first chat chunk with
// the role), finish (null when empty), the choice's logprobs (null: none), and (chat)
// tool calls as a tool_calls delta and reasoning as a reasoning_content delta.
nlohmann::json stream_chunk(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                            bool role_only = false, const nlohmann::json& logprobs = nullptr,
                            const std::vector<ToolCall>& calls = {}, const std::string& reasoning = {});
nlohmann::json usage_chunk(const ResponseIds& ids, bool chat, int64_t prompt_tokens, int64_t completion_tokens,
                           int64_t reasoning_tokens = 0);

}  // namespace tessera::server
