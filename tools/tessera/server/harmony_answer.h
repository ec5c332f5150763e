// gpt-oss's answers in OpenAI's harmony format: messages on channels, split into the
// message's content, its reasoning and its tool calls, whole or while streaming.
//
// After the generation prompt "<|start|>assistant" the model writes messages
//   HEADER <|message|> TEXT <|end|>   (the next one starts with <|start|>assistant)
// and ends its answer with <|return|> (after a final message) or <|call|> (after a
// tool call); both end the generation, so they are not in the text. A HEADER holds
// <|channel|>NAME, perhaps a recipient " to=functions.NAME" (before or after the
// channel) and a content type ("json" or "<|constrain|>json"), e.g.
//   <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER
//   <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}
//    to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}
// Mapping:
// - a message with a recipient is a tool call (whatever its channel);
// - the analysis channel is reasoning;
// - the final channel, the commentary channel without a recipient (a preamble meant for
//   the user) and any other channel are content.
// Successive messages of one field are joined with "\n". The calls are reported only
// if every one of them names a function of the request's tools ("functions." prefix
// optional) and its text is a JSON object; otherwise each call's text is content, in
// its place. Content that follows a call is held until the answer ends for that reason.
// An answer that does not start like a header (plain text: the model left the format,
// or a grammar made it write JSON directly) is all content, markers included.
//
// The markers are control tokens in gpt-oss's vocabulary, which decode to nothing;
// the server decodes the tokens harmony_marker_tokens() finds with their text for this
// format, so the parser reads them in the text (a model that spells a marker with
// ordinary tokens is read the same way).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/tool_calls.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

// The vocabulary's ids of harmony's marker tokens (<|start|>, <|end|>, <|message|>,
// <|channel|>, <|constrain|>, <|return|>, <|call|>) that it has as single tokens.
std::vector<int32_t> harmony_marker_tokens(const Tokenizer& tokenizer);

struct HarmonyDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;  // finish() only
};

class HarmonyParser {
 public:
  // `tools`: the request's tools array (null: no call is valid; calls become content).
  explicit HarmonyParser(nlohmann::json tools) : tools_(std::move(tools)) {}
  // More answer text; returns the content and reasoning that can be sent now.
  HarmonyDelta push(const std::string& text);
  // The answer ended: what was held back, and the tool calls.
  HarmonyDelta finish();
  // Bytes of the answer text read so far (the rest is held: it may be a marker's start).
  size_t consumed() const { return consumed_; }
  // Whether byte `offset` of the answer lies in an analysis message, its header and
  // end marker included (what counts as a reasoning token).
  bool in_reasoning(size_t offset) const;

 private:
  enum class Mode { Header, Body, Plain };
  enum class Kind { Content, Reasoning, Call };
  struct Held {  // content after the first call, and the calls' text, in order
    int call = -1;  // index into calls_, or -1: content
    std::string text;
  };
  struct RawCall {
    std::string recipient, text;
  };
  void begin_message(const std::string& header);
  void body_text(const std::string& text, HarmonyDelta& d);
  void end_message();
  void emit_content(const std::string& text, HarmonyDelta& d);

  nlohmann::json tools_;
  Mode mode_ = Mode::Header;
  std::string buf_;  // text not read yet
  size_t consumed_ = 0;
  Kind kind_ = Kind::Content;
  bool fresh_ = true;  // the current message has had no text yet
  bool content_out_ = false, reasoning_out_ = false;  // some was sent (a "\n" goes before the next message's)
  std::vector<RawCall> calls_;
  std::vector<Held> held_;
  std::vector<std::pair<size_t, size_t>> reasoning_spans_;  // [begin, end) of analysis messages
  bool finished_ = false;
};

// The whole answer at once (the same as pushing it and finishing).
HarmonyDelta parse_harmony(const std::string& text, const nlohmann::json& tools);

}  // namespace tessera::server
