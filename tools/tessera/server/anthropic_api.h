// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens): a
// request is translated into the chat endpoint's form and parsed by it (the same
// template rendering, sampling and tool-call parsing); the answer becomes a Message
// object or the stream's events; errors take Anthropic's shape.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/answer_stream.h"
#include "server/dialect.h"
#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace tessera::server {

// Whether `path` is one of Anthropic's (its errors take Anthropic's shape).
bool is_anthropic_path(const std::string& path);

// {"type": "error", "error": {"type": <Anthropic's name for the status>, "message"}}.
nlohmann::json anthropic_error_body(int status, const std::string& message);

// A Messages request as the chat endpoint's body: system and messages (text,
// tool_use and tool_result blocks) as chat messages, tools as functions, the sampling
// fields. `counting`: count_tokens' body, where max_tokens is not required. Throws
// ApiError (400) for what is wrong or not supported.
RequestJson messages_to_chat_body(const RequestJson& body, bool counting = false);
// The request parsed: messages_to_chat_body, parse_chat_request, and the stop
// sequences (which the chat endpoint would limit to 4).
ParsedRequest parse_messages_request(const RequestJson& body, const ModelContext& m, bool counting = false);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use".
const char* anthropic_stop_reason(FinishReason ended, bool stop_string, bool tool_calls);

// The whole answer: a Message object. content: a thinking block when the model
// reasoned (gpt-oss's analysis channel; its signature is empty: this server signs
// nothing), a text block when there is text, then a tool_use block per call (empty
// when the model said nothing).
nlohmann::json message_response(const ResponseIds& ids, const std::string& text, const std::vector<ToolCall>& calls,
                                const char* stop_reason, const std::string& stop_sequence, int64_t input_tokens,
                                int64_t output_tokens, const std::string& reasoning = {});

// A streamed answer's events in Anthropic's order: message_start; per block
// content_block_start (a ping after the first), its deltas (thinking_delta, text_delta,
// input_json_delta), content_block_stop; message_delta (stop_reason, usage);
// message_stop. A thinking block opens with the first reasoning, the text block with
// the first text (closing the thinking block); tool_use blocks follow when the answer
// turns out to hold calls (they come whole, at the end).
class MessageEvents {
 public:
  MessageEvents(ResponseIds ids, int64_t input_tokens) : ids_(std::move(ids)), input_tokens_(input_tokens) {}
  std::string start() const;
  std::string delta(const AnswerDelta& d);
  std::string finish(const char* stop_reason, const std::string& stop_sequence, int64_t output_tokens);
  // An error after the stream began (the status picks the error type).
  static std::string error(int status, const std::string& message);

 private:
  std::string open_block(const nlohmann::json& block);
  std::string close_block();
  ResponseIds ids_;
  int64_t input_tokens_;
  int blocks_ = 0;          // blocks started
  bool open_ = false;       // the last one is not stopped yet
  std::string open_type_;   // its type ("thinking", "text", "tool_use")
  bool pinged_ = false;
};

// The Messages API as a dialect of the generation routes (dialect_routes.h).
const ApiDialect& anthropic_messages_dialect();

}  // namespace tessera::server
