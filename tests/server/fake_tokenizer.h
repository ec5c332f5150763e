// A tokenizer over a fixed list of pieces for the server's unit tests (no model).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer.h"

namespace tessera::server {

// A vocabulary of fixed pieces; id 0 is a control token (no text unless shown), and
// so is every piece added with control().
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int32_t> encode(std::string_view, bool) const override { return {1}; }
  // A control token's text gives that token; anything else {1}.
  std::vector<int32_t> encode_with_special(std::string_view text, bool) const override {
    for (int32_t id : controls_)
      if (pieces_.at(size_t(id)) == text) return {id};
    return {1};
  }
  std::string token_to_piece(int32_t id, bool show_special) const override {
    if (id == 0) return show_special ? "<|ctl|>" : "";
    for (int32_t c : controls_)
      if (c == id) return show_special ? pieces_.at(size_t(id)) : "";
    return pieces_.at(size_t(id));
  }
  int32_t n_vocab() const override { return int32_t(pieces_.size()); }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return 0; }
  bool add_bos_default() const override { return false; }
  bool is_end_of_generation(int32_t id) const override { return id == 0; }
  std::string model_name() const override { return "fake"; }
  // The id of a piece (added if new).
  int32_t id(const std::string& piece) {
    for (size_t i = 1; i < pieces_.size(); ++i)
      if (pieces_[i] == piece) return int32_t(i);
    pieces_.push_back(piece);
    return int32_t(pieces_.size() - 1);
  }
  // The id of a control token with this text (added if new).
  int32_t control(const std::string& text) {
    const int32_t i = id(text);
    for (int32_t c : controls_)
      if (c == i) return i;
    controls_.push_back(i);
    return i;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> controls_;
};

}  // namespace tessera::server
