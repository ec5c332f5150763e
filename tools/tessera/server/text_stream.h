// Turns generated tokens into text a client may be sent: a piece never ends inside a
// UTF-8 character, and text that could be the start of a stop string is held back
// until it is known not to be one. When a stop string completes, the text before it
// is the last text of the answer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);
  // Append a generated token; returns the text that can be sent now.
  std::string push(int32_t token);
  // The same for a token's piece (its bytes) already looked up.
  std::string push_piece(const std::string& piece);
  // The generation ended without a stop string: everything still held back.
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (empty while none has).
  const std::string& stop_sequence() const { return stop_sequence_; }
  const std::string& text() const { return sent_; }  // all text returned so far
  size_t held() const { return pending_.size(); }     // bytes received but not returned

 private:
  std::string take(size_t n);
  const Tokenizer& tok_;
  std::vector<std::string> stops_;
  std::string pending_, sent_, stop_sequence_;
  bool stopped_ = false;
};

// Bytes of s that end in complete UTF-8 sequences (an incomplete last one is held back).
size_t complete_utf8_prefix(const std::string& s);

}  // namespace tessera::server
