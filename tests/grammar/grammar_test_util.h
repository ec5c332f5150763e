// Matching whole texts against a grammar through a one-byte-per-token vocabulary.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tessera/grammar.h"

namespace tessera::test {

// Tokens 0..255 are the bytes; token 256 ends the generation.
inline std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  static auto v = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
    pieces.push_back("");
    return std::make_shared<const TokenVocabulary>(pieces, std::vector<int32_t>{256});
  }();
  return v;
}

// Whether `text` is a whole sentence of the grammar.
inline bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(std::make_shared<GrammarConstraint>(g, byte_vocabulary()));
  for (unsigned char c : text) {
    if (!m.accepts(c)) return false;
    m.accept(c);
  }
  return m.complete() && m.accepts(256);
}

inline bool matches(const std::string& gbnf, const std::string& text) { return matches(Grammar::parse(gbnf), text); }

}  // namespace tessera::test
