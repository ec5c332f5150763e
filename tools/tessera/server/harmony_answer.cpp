#include "server/harmony_answer.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "tessera/tokenizer.h"

namespace tessera::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kMessage = "<|message|>", kChannel = "<|channel|>", kStart = "<|start|>";
// What ends a message's text: the first three are part of it, the others begin the
// next message's header (a model that skips <|end|>).
constexpr std::array<std::string_view, 5> kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", kStart, kChannel};
constexpr size_t kConsumedEnds = 3;
// How a header may begin: after the generation prompt's "<|start|>assistant", and
// after an <|end|>.
constexpr std::array<std::string_view, 6> kHeaderStarts = {kChannel, " to=", "to=", kStart, kMessage, "<|constrain|>"};
// A header longer than this is not one: the answer is plain text.
constexpr size_t kMaxHeader = 256;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The word after position p: up to whitespace or a marker's '<'.
std::string word_at(const std::string& s, size_t p) {
  size_t e = p;
  while (e < s.size() && !is_ws(s[e]) && s[e] != '<') ++e;
  return s.substr(p, e - p);
}

// Whether `s` begins like a header: it starts with one of kHeaderStarts (full = true)
// or is a proper prefix of one (full = false).
bool header_start(const std::string& s, bool& full) {
  for (std::string_view h : kHeaderStarts) {
    if (s.size() >= h.size() ? s.compare(0, h.size(), h) == 0 : h.compare(0, s.size(), s) == 0) {
      full = s.size() >= h.size();
      return true;
    }
  }
  return false;
}

// Bytes at the end of s that may begin a body end marker.
size_t marker_tail(const std::string& s) {
  size_t longest = 0;
  for (std::string_view m : kBodyEnds) longest = std::max(longest, m.size());
  for (size_t n = std::min(longest - 1, s.size()); n > 0; --n)
    for (std::string_view m : kBodyEnds)
      if (n < m.size() && s.compare(s.size() - n, n, m, 0, n) == 0) return n;
  return 0;
}

// The recipient in a header: the word after "to=" where that starts a word.
std::string recipient_of(const std::string& h) {
  for (size_t p = h.find("to="); p != std::string::npos; p = h.find("to=", p + 1))
    if (p == 0 || is_ws(h[p - 1]) || h[p - 1] == '>') return word_at(h, p + 3);
  return {};
}

}  // namespace

std::vector<int32_t> harmony_marker_tokens(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const char* m : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"}) {
    const std::vector<int32_t> t = tok.encode_with_special(m, false);
    if (t.size() == 1 && tok.token_to_piece(t[0], true) == m) ids.push_back(t[0]);
  }
  return ids;
}

void HarmonyParser::begin_message(const std::string& header) {
  const std::string to = recipient_of(header);
  std::string channel;
  if (const size_t c = header.find(kChannel); c != std::string::npos) channel = word_at(header, c + kChannel.size());
  kind_ = !to.empty() ? Kind::Call : channel == "analysis" ? Kind::Reasoning : Kind::Content;
  fresh_ = true;
  if (kind_ == Kind::Call) {
    calls_.push_back({to, {}});
    held_.push_back({int(calls_.size() - 1), {}});
  }
}

bool HarmonyParser::in_reasoning(size_t offset) const {
  for (const auto& [b, e] : reasoning_spans_)
    if (offset >= b && offset < e) return true;
  return false;
}

void HarmonyParser::emit_content(const std::string& text, HarmonyDelta& d) {
  if (text.empty()) return;
  if (calls_.empty()) {
    if (fresh_ && content_out_) d.content += '\n';
    d.content += text;
    content_out_ = true;
  } else {
    if (fresh_ || held_.empty() || held_.back().call >= 0) held_.push_back({-1, {}});
    held_.back().text += text;
  }
  fresh_ = false;
}

void HarmonyParser::body_text(const std::string& text, HarmonyDelta& d) {
  if (text.empty()) return;
  switch (kind_) {
    case Kind::Content: emit_content(text, d); break;
    case Kind::Reasoning:
      if (fresh_ && reasoning_out_) d.reasoning += '\n';
      d.reasoning += text;
      reasoning_out_ = true;
      fresh_ = false;
      break;
    case Kind::Call: calls_.back().text += text; break;
  }
}

void HarmonyParser::end_message() {
  kind_ = Kind::Content;
  fresh_ = true;
  mode_ = Mode::Header;
}

HarmonyDelta HarmonyParser::push(const std::string& text) {
  HarmonyDelta d;
  if (finished_) return d;
  buf_ += text;
  for (;;) {
    if (mode_ == Mode::Plain) {
      emit_content(buf_, d);
      consumed_ += buf_.size();
      buf_.clear();
      return d;
    }
    if (mode_ == Mode::Header) {
      bool full = false;
      if (!header_start(buf_, full)) {
        mode_ = Mode::Plain;
        fresh_ = true;
        continue;
      }
      const size_t m = buf_.find(kMessage);
      if (m == std::string::npos || m > kMaxHeader) {
        if (buf_.size() < kMaxHeader + kMessage.size()) return d;  // the header may go on
        mode_ = Mode::Plain;
        fresh_ = true;
        continue;
      }
      begin_message(buf_.substr(0, m));
      if (kind_ == Kind::Reasoning) reasoning_spans_.push_back({consumed_, consumed_});
      consumed_ += m + kMessage.size();
      buf_.erase(0, m + kMessage.size());
      mode_ = Mode::Body;
      continue;
    }
    // Body: up to the first marker that ends it.
    size_t at = std::string::npos, which = 0;
    for (size_t i = 0; i < kBodyEnds.size(); ++i)
      if (const size_t p = buf_.find(kBodyEnds[i]); p < at) at = p, which = i;
    if (at == std::string::npos) {
      const size_t keep = marker_tail(buf_);
      body_text(buf_.substr(0, buf_.size() - keep), d);
      consumed_ += buf_.size() - keep;
      buf_.erase(0, buf_.size() - keep);
      return d;
    }
    body_text(buf_.substr(0, at), d);
    const size_t skip = at + (which < kConsumedEnds ? kBodyEnds[which].size() : 0);
    consumed_ += skip;
    buf_.erase(0, skip);
    if (kind_ == Kind::Reasoning) reasoning_spans_.back().second = consumed_;
    end_message();
  }
}

HarmonyDelta HarmonyParser::finish() {
  HarmonyDelta d;
  if (finished_) return d;
  finished_ = true;
  if (mode_ == Mode::Body) {
    body_text(buf_, d);  // the message the generation ended (<|return|>, <|call|>, or a limit)
  } else if (mode_ == Mode::Header && !buf_.empty()) {
    // A header cut off carries no text and is dropped; text shorter than any header
    // start is not one.
    bool full = false;
    if (header_start(buf_, full) && !full) {
      fresh_ = true;
      emit_content(buf_, d);
    }
  }
  consumed_ += buf_.size();
  buf_.clear();
  if (mode_ == Mode::Body && kind_ == Kind::Reasoning) reasoning_spans_.back().second = consumed_;
  if (calls_.empty()) return d;

  std::vector<ToolCall> calls;
  bool valid = true;
  for (const RawCall& rc : calls_) {
    ToolCall c;
    c.name = rc.recipient.compare(0, 10, "functions.") == 0 ? rc.recipient.substr(10) : rc.recipient;
    const ojson args = ojson::parse(trim(rc.text), nullptr, false);  // the model's key order kept
    if (!find_tool_function(tools_, c.name) || args.is_discarded() || !args.is_object()) {
      valid = false;
      break;
    }
    c.arguments = args.dump();
    c.id = new_tool_call_id();
    calls.push_back(std::move(c));
  }
  // Held content, and the calls' own text when they are not calls after all.
  bool out = content_out_;
  for (const Held& h : held_) {
    const std::string& text = h.call >= 0 ? calls_[size_t(h.call)].text : h.text;
    if ((h.call >= 0 && valid) || text.empty()) continue;
    if (out) d.content += '\n';
    d.content += text;
    out = true;
  }
  if (valid) d.calls = std::move(calls);
  return d;
}

HarmonyDelta parse_harmony(const std::string& text, const json& tools) {
  HarmonyParser p(tools);
  HarmonyDelta d = p.push(text);
  HarmonyDelta rest = p.finish();
  d.content += rest.content;
  d.reasoning += rest.reasoning;
  d.calls = std::move(rest.calls);
  return d;
}

}  // namespace tessera::server
