#include "server/answer_stream.h"

#include <algorithm>

#include "tessera/tokenizer.h"

namespace tessera::server {

size_t utf8_char_len(std::string_view s, size_t i) {
  const size_t n = s.size();
  if (i >= n) return 0;
  auto cont = [&](size_t k) { return k < n && (uint8_t(s[k]) & 0xC0) == 0x80; };
  const uint8_t b = uint8_t(s[i]);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(i + 1) ? 2 : 0;
  const uint8_t b1 = i + 1 < n ? uint8_t(s[i + 1]) : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const bool ok1 = b == 0xE0 ? (b1 >= 0xA0 && b1 <= 0xBF) : b == 0xED ? (b1 >= 0x80 && b1 <= 0x9F) : cont(i + 1);
    return ok1 && cont(i + 2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const bool ok1 = b == 0xF0 ? (b1 >= 0x90 && b1 <= 0xBF) : b == 0xF4 ? (b1 >= 0x80 && b1 <= 0x8F) : cont(i + 1);
    return ok1 && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_len(s, i);
    if (len > 0) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
  }
  return out;
}

AnswerStream::AnswerStream(const Tokenizer& tokenizer, std::vector<std::string> stops, ToolCallFormat tool_format,
                           nlohmann::json tools)
    : tok_(tokenizer), text_(tokenizer, std::move(stops)), format_(tool_format),
      filter_(tool_format == ToolCallFormat::Harmony ? ToolCallFormat::None : tool_format), tools_(std::move(tools)) {
  if (format_ == ToolCallFormat::Harmony) {
    harmony_.emplace(tools_);
    markers_ = harmony_marker_tokens(tokenizer);
  }
}

int64_t AnswerStream::reasoning_tokens() const {
  if (!harmony_ || !finished_) return 0;
  int64_t n = 0;
  for (size_t o : offsets_) n += harmony_->in_reasoning(o);
  return n;
}

size_t AnswerStream::released() const { return harmony_ ? harmony_->consumed() : filter_.released().size(); }

// Characters (as sent: each byte outside a valid character is one U+FFFD) of the
// answer before the one that holds byte `offset`; offsets come in increasing order and
// lie in the released text, where characters are whole.
size_t AnswerStream::chars_before(size_t offset) {
  const std::string& t = text_.text();
  while (scan_bytes_ < t.size()) {
    const size_t len = std::max<size_t>(1, utf8_char_len(t, scan_bytes_));
    if (scan_bytes_ + len > offset) break;
    scan_bytes_ += len;
    ++scan_chars_;
  }
  return scan_chars_;
}

void AnswerStream::take_tokens(AnswerDelta& d, size_t released, bool final) {
  while (!pending_.empty()) {
    AnswerToken& t = pending_.front();
    const bool sent = t.offset < released || (t.text_bytes == 0 && t.offset <= released && !(final && stopped()));
    if (!sent) break;
    t.char_offset = chars_before(t.offset);
    d.tokens.push_back(std::move(t));
    pending_.pop_front();
  }
}

AnswerDelta AnswerStream::push(int32_t token, const std::optional<TokenLogprobs>& logprobs) {
  AnswerDelta d;
  if (finished_ || text_.stopped()) return d;
  const bool marker = std::find(markers_.begin(), markers_.end(), token) != markers_.end();
  const std::string piece = tok_.token_to_piece(token, marker);
  if (logprobs) pending_.push_back({token, bytes_, 0, piece.size(), *logprobs});
  if (harmony_) offsets_.push_back(bytes_);
  bytes_ += piece.size();
  if (harmony_) {
    HarmonyDelta h = harmony_->push(text_.push_piece(piece));
    d.content = std::move(h.content);
    d.reasoning = sanitize_utf8(h.reasoning);
  } else {
    d.content = filter_.push(text_.push_piece(piece));
  }
  if (!text_.stopped()) take_tokens(d, released(), false);
  d.content = sanitize_utf8(d.content);
  return d;
}

AnswerDelta AnswerStream::finish() {
  AnswerDelta d;
  if (finished_) return d;
  finished_ = true;
  if (harmony_) {
    HarmonyDelta h = harmony_->push(text_.finish());
    HarmonyDelta rest = harmony_->finish();
    d.content = sanitize_utf8(h.content + rest.content);
    d.reasoning = sanitize_utf8(h.reasoning + rest.reasoning);
    d.tool_calls = std::move(rest.calls);
    take_tokens(d, text_.text().size(), true);
    return d;
  }
  const size_t before = filter_.released().size();
  d.content = filter_.push(text_.finish());
  if (format_ != ToolCallFormat::None) {
    ToolCallResult r = parse_tool_calls(format_, text_.text(), tools_);
    const std::string& released = filter_.released();
    // What was released is a prefix of the calls' content by construction; checked anyway.
    if (r.found && r.content.compare(0, released.size(), released) == 0) {
      d.content = r.content.substr(before);
      d.tool_calls = std::move(r.calls);
    } else {
      d.content += filter_.held();
    }
  }
  take_tokens(d, text_.text().size(), true);
  d.content = sanitize_utf8(d.content);
  return d;
}

}  // namespace tessera::server
