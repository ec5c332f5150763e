// One answer as a response carries it. Generated tokens become content through the
// TextStream (stop strings, whole UTF-8 characters) and, when the request's tools are
// parsed, the ToolCallFilter (text that may be a tool call is held back). Each
// token's log-probabilities travel with the content that holds the token's first
// byte, so a stream's chunks and the whole answer report the same tokens:
// - a token whose bytes all lie in a cut-off stop string (or after it) is not
//   reported; a token that straddles the cut is, with all its bytes;
// - a token that adds no bytes (a control token) goes with the next content;
// - when the answer turns out to hold tool calls, the remaining tokens (the calls'
//   own) come with the calls, at the end.
// In the harmony format (gpt-oss) the answer's channels are parsed (harmony_answer.h):
// its marker tokens are decoded with their text for the parser, analysis becomes
// `reasoning`, and a token is sent with the delta in which the parser read its first
// byte (markers and reasoning included).
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/harmony_answer.h"
#include "server/text_stream.h"
#include "server/tool_calls.h"
#include "tessera/sampler.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

// The length of the valid UTF-8 character at s[i] (1-4), or 0 when the byte there does
// not start one (a stray continuation byte, a truncated or overlong sequence, a
// surrogate, a code point above U+10FFFF).
size_t utf8_char_len(std::string_view s, size_t i);
// s with every byte that is not part of a valid character replaced by U+FFFD: what
// clients are sent of text a model generated (one U+FFFD per such byte).
std::string sanitize_utf8(std::string_view s);

struct AnswerToken {
  int32_t id = -1;
  size_t offset = 0;       // bytes of the answer before this token
  size_t char_offset = 0;  // characters of the sent (sanitized) answer before the one holding its first byte
  size_t text_bytes = 0;   // bytes it adds to the answer
  TokenLogprobs lp;
};

struct AnswerDelta {
  std::string content;               // text to send now (valid UTF-8: sanitize_utf8)
  std::vector<AnswerToken> tokens;   // log-probabilities to send with it
  std::vector<ToolCall> tool_calls;  // from finish() only: the answer's tool calls
  std::string reasoning;             // harmony: the analysis channel's text to send now (likewise)
};

class AnswerStream {
 public:
  // tool_format None: no tool-call parsing; `tools`: the request's tools array
  // (Harmony: the channels are parsed whatever the tools; null tools: no call is valid).
  AnswerStream(const Tokenizer& tokenizer, std::vector<std::string> stops, ToolCallFormat tool_format = ToolCallFormat::None,
               nlohmann::json tools = nullptr);
  // A generated token, with its log-probabilities when the request asked for them.
  AnswerDelta push(int32_t token, const std::optional<TokenLogprobs>& logprobs);
  // A stop string completed: call finish() for the rest (further tokens are ignored).
  bool stopped() const { return text_.stopped(); }
  const std::string& stop_sequence() const { return text_.stop_sequence(); }  // the one that did
  // The generation ended (or a stop string ended it): everything still held back,
  // the tool calls if the answer holds some, and the remaining tokens.
  AnswerDelta finish();
  // Harmony, once finished: the tokens of its analysis messages (0 otherwise).
  int64_t reasoning_tokens() const;
  // The answer's text so far (stop string cut; harmony: with its markers).
  const std::string& text() const { return text_.text(); }

 private:
  void take_tokens(AnswerDelta& d, size_t released, bool final);
  size_t released() const;  // bytes of text_.text() that the parser or filter has passed on
  size_t chars_before(size_t offset);
  const Tokenizer& tok_;
  TextStream text_;
  ToolCallFormat format_;
  ToolCallFilter filter_;
  std::optional<HarmonyParser> harmony_;  // the Harmony format's parser
  std::vector<int32_t> markers_;          // harmony: tokens decoded with their text
  std::vector<size_t> offsets_;           // harmony: each token's offset in the answer
  nlohmann::json tools_;
  std::deque<AnswerToken> pending_;
  size_t bytes_ = 0;
  size_t scan_bytes_ = 0, scan_chars_ = 0;  // chars_before's position in text_.text()
  bool finished_ = false;
};

}  // namespace tessera::server
