// OpenAI's Responses API (POST /v1/responses), its stateless subset: `input` (a string,
// or message, function_call and function_call_output items) and `instructions` are
// translated into the chat endpoint's form and parsed by it (the same template,
// sampling and tool-call parsing); the answer becomes a Response object (a message
// item and a function_call item per call) or the stream's events. What needs stored
// state (previous_response_id, store: true, conversation, background) is refused.
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

// The request as the chat endpoint's body. Throws ApiError (400) for what is wrong or
// not supported, naming the Responses field.
RequestJson responses_to_chat_body(const RequestJson& body);
// The request parsed (errors name the Responses fields: max_output_tokens, input,
// text). `echo`: the fields a Response repeats (instructions, max_output_tokens,
// temperature, top_p, tool_choice, tools, parallel_tool_calls, metadata).
ParsedRequest parse_responses_request(const RequestJson& body, const ModelContext& m, nlohmann::json* echo = nullptr);

// "completed", or "incomplete" when the answer hit max_output_tokens (or the context)
// without a tool call.
const char* response_status(FinishReason ended, bool tool_calls);

// A Response object. status "in_progress": no output and no usage yet. output: a
// reasoning item (one reasoning_text part, as OpenAI's open-weight models' servers
// give it) when the model reasoned (gpt-oss's analysis channel), a message item (an
// output_text part) when there is text or no call, then a function_call item per call.
nlohmann::json response_object(const ResponseIds& ids, const nlohmann::json& echo, const std::string& status,
                               const std::string& text, const std::vector<ToolCall>& calls, int64_t input_tokens,
                               int64_t output_tokens, const std::string& reasoning = {}, int64_t reasoning_tokens = 0);

// A streamed Response's events, each `event: TYPE\ndata: {type, sequence_number, ...}`:
// response.created and response.in_progress; for the reasoning item output_item.added,
// content_part.added, reasoning_text.delta..., reasoning_text.done, content_part.done,
// output_item.done; for the message item output_item.added,
// content_part.added, output_text.delta..., output_text.done, content_part.done,
// output_item.done; per call output_item.added, function_call_arguments.delta and
// .done, output_item.done; then response.completed or response.incomplete with the
// whole Response (response.failed when the engine fails).
class ResponseEvents {
 public:
  ResponseEvents(ResponseIds ids, nlohmann::json echo, int64_t input_tokens)
      : ids_(std::move(ids)), echo_(std::move(echo)), input_tokens_(input_tokens) {}
  std::string start();
  std::string delta(const AnswerDelta& d);
  std::string finish(const std::string& status, int64_t output_tokens, int64_t reasoning_tokens = 0);
  std::string failed(const std::string& message);

 private:
  std::string event(const std::string& type, nlohmann::json fields);
  std::string open_message();
  std::string close_message(const std::string& status);
  std::string open_reasoning();
  std::string close_reasoning();
  ResponseIds ids_;
  nlohmann::json echo_;
  int64_t input_tokens_;
  int64_t sequence_ = 0;
  std::string text_;
  std::string reasoning_, all_reasoning_;  // the open reasoning item's text; all of it
  std::vector<ToolCall> calls_;
  bool message_open_ = false, message_done_ = false, reasoning_open_ = false;
  int64_t items_ = 0;  // output items begun
  int64_t message_index_ = 0, reasoning_index_ = 0;
  size_t reasoning_items_ = 0;  // reasoning items closed
};

// The Responses API as a dialect of the generation routes (dialect_routes.h).
const ApiDialect& responses_dialect();

}  // namespace tessera::server
