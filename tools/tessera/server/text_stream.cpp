#include "server/text_stream.h"

#include <algorithm>

#include "tessera/tokenizer.h"

namespace tessera::server {

size_t complete_utf8_prefix(const std::string& s) {
  size_t i = s.size();
  int back = 0;
  while (i > 0 && back < 4 && (uint8_t(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return s.size();
  const uint8_t lead = uint8_t(s[i - 1]);
  const int need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  return back >= need ? s.size() : i - 1;
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops) : tok_(tokenizer) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::take(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  sent_ += out;
  return out;
}

std::string TextStream::push(int32_t token) {
  if (stopped_) return {};
  return push_piece(tok_.token_to_piece(token));
}

std::string TextStream::push_piece(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  // The earliest complete stop string ends the text.
  size_t cut = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_)
    if (const size_t at = pending_.find(s); at < cut) cut = at, which = &s;
  if (cut != std::string::npos) {
    stopped_ = true;
    stop_sequence_ = *which;
    std::string out = take(cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that a stop string starts with.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  const size_t ready = complete_utf8_prefix(pending_.substr(0, pending_.size() - hold));
  return take(ready);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  return take(pending_.size());
}

}  // namespace tessera::server
