// A built-in SentencePiece-style vocabulary for generated models that are not given
// a vocabulary file: <unk> <s> </s>, the 256 byte-fallback pieces <0xNN>, printable
// ASCII characters with and without the word-start marker U+2581, common English
// words, then unused filler pieces up to the requested size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::gen {

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;  // 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
};

// n_vocab 0 = just the real pieces (about 700); otherwise padded (must be >= that).
Vocab builtin_vocab(int64_t n_vocab);

}  // namespace tessera::gen
