// The byte-level BPE pre-tokenizers of gpt-oss (GPT-4o's o200k), DeepSeek-V3 and V2 on
// texts that reach their corners: case runs, marks, contractions (long s included),
// digit groups, CJK runs, control characters. The expected pieces are what the
// tokenizer.json regexes give under Python's `regex` module (the same engine family as
// Hugging Face's tokenizers); docs/decisions.md 143 has the wider comparison.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

using namespace tessera::tok;

namespace {

struct Case {
  PreType type;
  std::string text;
  std::vector<std::string> pieces;
};

std::vector<std::string> pieces_of(PreType type, const std::string& text) {
  const auto cpts = utf8_to_cpts(text);
  std::vector<std::string> out;
  for (const Span& s : pretokenize(type, cpts)) {
    std::string piece;
    for (size_t i = s.begin; i < s.end; ++i) append_utf8(piece, cpts[i]);
    out.push_back(piece);
  }
  return out;
}

}  // namespace

TEST(Pretokenize, Gpt4oAndDeepseekMatchTheirRegexes) {
  const Case cases[] = {
      {PreType::Gpt4o, "Hello World's HTTPServer isOK", {"Hello", " World's", " HTTPServer", " is", "OK"}},
      {PreType::Gpt4o, "  indented\x0a\x0a\x09" "code/path//x 12345", {" ", " indented", "\x0a\x0a", "\x09" "code", "/path", "//", "x", " ", "123", "45"}},
      {PreType::Gpt4o, "caf\xc3\xa9 na\xc3\xafve \xc4\xb0stanbul DZ\xc7\x85ungla", {"caf\xc3\xa9", " na\xc3\xafve", " \xc4\xb0stanbul", " DZ\xc7\x85ungla"}},
      {PreType::Gpt4o, "I'M HERE'S it'S they'LL \xe2\x80\x99s '\xc5\xbf", {"I'M", " HERE'S", " it'S", " they'LL", " \xe2\x80\x99", "s", " '", "\xc5\xbf"}},
      {PreType::Gpt4o, "\xd0\x96\xd0\xb6 \xce\xa9\xcf\x89 \xd7\x90\xd7\x91 x\xcc\x81y \xe2\x83\x9d", {"\xd0\x96\xd0\xb6", " \xce\xa9\xcf\x89", " \xd7\x90\xd7\x91", " x\xcc\x81y", " \xe2\x83\x9d"}},
      {PreType::Gpt4o, "a-b_c (d) [e]/\x0d\x0a" "f", {"a", "-b", "_c", " (", "d", ")", " [", "e", "]/\x0d\x0a", "f"}},
      {PreType::DeepseekV3, "Hello, world! It's 2024-11-28.", {"Hello", ",", " world", "!", " It", "'s", " ", "202", "4", "-", "11", "-", "28", "."}},
      {PreType::DeepseekV3, "\xe4\xb8\xad\xe6\x96\x87\xe6\xb7\xb7\xe5\x90\x88" "English\xe3\x81\x82\xe3\x82\xa2\xe3\x83\xbc\xe9\xbe\xa6", {"\xe4\xb8\xad\xe6\x96\x87\xe6\xb7\xb7\xe5\x90\x88", "English", "\xe3\x81\x82\xe3\x82\xa2\xe3\x83\xbc", "\xe9\xbe\xa6"}},
      {PreType::DeepseekV3, "x=1234567; .Net 'quoted' \xc3\xa9l\xc3\xa8ve", {"x", "=", "123", "456", "7", ";", " .", "Net", " '", "quoted", "'", " \xc3\xa9l\xc3\xa8ve"}},
      {PreType::DeepseekV3, "tabs\x09\x09" "and\x0d\x0a\x0d\x0anewlines  \xc2\xa0 ", {"tabs", "\x09", "\x09" "and", "\x0d\x0a\x0d\x0a", "newlines", "  \xc2\xa0 "}},
      {PreType::DeepseekV3, "\x01" "ctrl\x7f \xd9\xa0\xd9\xa3 \xf0\x9f\x98\x80!!", {"\x01" "ctrl", "\x7f", " ", "\xd9\xa0\xd9\xa3", " \xf0\x9f\x98\x80!!"}},
      {PreType::DeepseekLlm, "h\xc3\xa9llo World 123\x0a", {"h", "\xc3\xa9", "llo", " World", " ", "123", "\x0a"}},
      {PreType::DeepseekLlm, "Stra\xc3\x9f" "e \xe1\xbd\x9f\xe1\xbd\xbd \xe1\xbe\xbe\xe2\x84\xa6\xe2\x84\xaa\xe2\x84\xad \xef\xbc\xa1\xef\xbd\x81\xef\xbc\x81!  ", {"Stra", "\xc3\x9f", "e", " ", "\xe1\xbd\x9f\xe1\xbd\xbd", " ", "\xe1\xbe\xbe\xe2\x84\xa6\xe2\x84\xaa\xe2\x84\xad", " \xef\xbc\xa1\xef\xbd\x81", "\xef\xbc\x81!", "  "}},
      {PreType::DeepseekLlm, "\xe4\xb8\xad\xe6\x96\x87\xe3\x81\x82\xea\xb0\x80\xe0\xa4\x95\xe0\xa4\xbf \xd9\xa0\xd9\xa3x\x0d\x0a\x09 \xe3\x80\x80\xe3\x80\x81" "end   ", {"\xe4\xb8\xad\xe6\x96\x87\xe3\x81\x82\xea\xb0\x80\xe0\xa4\x95\xe0\xa4\xbf", " ", "\xd9\xa0\xd9\xa3", "x", "\x0d", "\x0a", "\x09", " ", "\xe3\x80\x80\xe3\x80\x81", "end", "   "}},
      {PreType::Gpt4o, "it'\xc5\xbf ok", {"it'\xc5\xbf", " ok"}},  // (?i:'s) folds U+017F to s
  };
  for (const Case& c : cases) EXPECT_EQ(pieces_of(c.type, c.text), c.pieces) << c.text;
}

// Pieces always cover the text in order, whatever the bytes.
TEST(Pretokenize, PiecesCoverTheText) {
  const std::string text = "a\xff\xfe b\x80 \xe4\xb8\xad 12 \r\n";
  for (PreType t : {PreType::Gpt4o, PreType::DeepseekV3, PreType::DeepseekLlm}) {
    const auto cpts = utf8_to_cpts(text);
    size_t at = 0;
    for (const Span& s : pretokenize(t, cpts)) {
      EXPECT_EQ(s.begin, at);
      EXPECT_LT(s.begin, s.end);
      at = s.end;
    }
    EXPECT_EQ(at, cpts.size());
  }
}
