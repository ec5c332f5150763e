// Tool calls in a model's answer: the call syntax of the chat template's family
// (chosen by the template's text), parsed into OpenAI's tool_calls, and a streaming
// filter that holds back text that may be the start of a call.
//
// Formats:
// - Hermes (Qwen2.5, Qwen3, Qwen3.5, Hermes, SmolLM-style templates: the template
//   mentions "<tool_call>"): <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
//   one block per call, or Qwen3.5/Qwen3-Coder's XML body
//   <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>.
//   Text before the first block is the message's content; text after a block is dropped.
// - Llama3Json (Llama 3.1/3.2/3.3: the template has "<|python_tag|>" or "parameters"):
//   the whole answer is one JSON object {"name": ..., "parameters": {...}}.
// - Mistral (the template has "[TOOL_CALLS]"): the whole answer is a JSON array of
//   {"name": ..., "arguments": {...}} (the [TOOL_CALLS] control token prints as nothing).
// - Harmony (gpt-oss: the template has "<|channel|>"): the answer is a sequence of
//   messages on channels, parsed by harmony_answer.h, not by parse_tool_calls.
// An answer is a tool call only if every call in it parses, names a function of the
// request's `tools` and has an object (or a string holding a JSON object) as its
// arguments; otherwise the whole answer is plain content.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::server {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral, Harmony };

// The format a chat template asks its model to call tools in (None: not recognised;
// the answer is then always plain content).
ToolCallFormat detect_tool_call_format(const std::string& template_text);
const char* tool_call_format_name(ToolCallFormat f);

struct ToolCall {
  std::string id;         // "call_..." (Mistral: 9 characters, as its template requires)
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ToolCallResult {
  bool found = false;       // the answer holds tool calls (calls non-empty)
  std::string content;      // when found: the text before the first call, trailing whitespace removed
  std::vector<ToolCall> calls;
};

// The request's tool (its "function" object) named `name`, or null.
const nlohmann::json* find_tool_function(const nlohmann::json& tools, const std::string& name);
// A new call id: "call_" and 24 letters and digits.
std::string new_tool_call_id();

// Parses a complete answer (not Harmony: see harmony_answer.h). `tools`: the request's tools array (OpenAI's
// [{"type": "function", "function": {"name", "parameters"}}]).
ToolCallResult parse_tool_calls(ToolCallFormat f, const std::string& text, const nlohmann::json& tools);

// Streaming: passes content on as it comes and holds back what may be (the start of)
// a tool call: for Hermes the longest tail that "<tool_call>" starts with and the
// whitespace before it, and everything from a complete "<tool_call>" on; for the
// whole-answer formats leading whitespace, and everything when the answer starts like
// JSON ('{' or '['). What it has released is always a prefix of
// parse_tool_calls(...).content when the answer turns out to hold calls.
class ToolCallFilter {
 public:
  explicit ToolCallFilter(ToolCallFormat f) : format_(f) {}
  // More answer text; returns the content that can be sent now.
  std::string push(const std::string& text);
  const std::string& released() const { return released_; }  // all content returned so far
  const std::string& held() const { return held_; }

 private:
  ToolCallFormat format_;
  enum class State { Start, Passing, Capturing } state_ = State::Start;
  std::string held_, released_;
};

}  // namespace tessera::server
