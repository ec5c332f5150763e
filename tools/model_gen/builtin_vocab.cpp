#include "builtin_vocab.h"

#include <cstdio>
#include <set>

#include "tessera/error.h"

namespace tessera::gen {

namespace {
const char* const kWords[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
    "so", "no", "time", "up", "out", "about", "into", "than", "them", "then", "some", "could", "what", "other",
    "its", "new", "two", "may", "first", "any", "like", "now", "my", "such", "make", "over", "our", "even", "most",
    "me", "state", "after", "also", "made", "many", "did", "must", "before", "back", "see", "through", "way",
    "where", "get", "much", "go", "well", "your", "know", "should", "down", "work", "year", "because", "come",
    "people", "just", "say", "each", "those", "take", "day", "good", "how", "long", "very", "little", "world",
    "life", "great", "old", "here", "thing", "man", "same", "upon", "never", "once", "story", "king", "house",
    "water", "light", "night", "small", "large", "hello", "model", "token", "once", "upon", "there", "lived",
};
}  // namespace

Vocab builtin_vocab(int64_t n_vocab) {
  Vocab v;
  std::set<std::string> seen;
  auto add = [&](const std::string& piece, float score, int32_t type) {
    if (!seen.insert(piece).second) return;
    v.tokens.push_back(piece);
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.f, 2);
  add("<s>", 0.f, 3);
  add("</s>", 0.f, 3);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0.f, 6);
  }
  const std::string marker = "\xE2\x96\x81";  // U+2581, SentencePiece's word start
  float score = -1.f;
  // Whole words score highest so the merge order prefers them.
  for (const char* w : kWords) add(marker + w, score -= 0.01f, 1);
  for (const char* w : kWords) add(w, score -= 0.01f, 1);
  for (char c = 'a'; c <= 'z'; ++c)
    for (const char* pair : {"e", "t", "a", "o", "n", "r", "s", "h"}) add(std::string(1, c) + pair, score -= 0.01f, 1);
  add(marker, score -= 0.01f, 1);
  for (int c = 33; c < 127; ++c) add(marker + std::string(1, char(c)), score -= 0.01f, 1);
  for (int c = 33; c < 127; ++c) add(std::string(1, char(c)), score -= 0.01f, 1);

  if (n_vocab > 0) {
    if (n_vocab < int64_t(v.tokens.size()))
      throw Error("vocabulary size " + std::to_string(n_vocab) + " is smaller than the built-in vocabulary (" +
                  std::to_string(v.tokens.size()) + " pieces)");
    for (int64_t i = int64_t(v.tokens.size()); i < n_vocab; ++i) add("<unused" + std::to_string(i) + ">", -1e9f, 5);
  }
  return v;
}

}  // namespace tessera::gen
