// Private Unicode helpers for the tokenizer: UTF-8 <-> code points, the general
// category classes the pre-tokenizer regexes use, and GPT-2's byte <-> unicode map.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/utf8.h"  // append_utf8

namespace tessera::tok {

using tessera::append_utf8;

// Class bits of one code point (Unicode general categories, grouped as the
// pre-tokenizer regexes use them).
enum CpClass : uint8_t {
  kLetter = 1 << 0,       // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 1 << 1,       // \p{N}: Nd Nl No
  kMark = 1 << 2,         // \p{M}: Mn Mc Me
  kPunct = 1 << 3,        // \p{P}
  kSymbol = 1 << 4,       // \p{S}
  kWhitespace = 1 << 5,   // \s: the Unicode White_Space property
  kUpper = 1 << 6,        // \p{Lu} \p{Lt} (with kLetter)
  kLower = 1 << 7,        // \p{Ll} (with kLetter)
};

uint8_t cp_class(uint32_t cp);

// Length of the UTF-8 sequence a lead byte announces (1 for continuation / invalid
// bytes), as SentencePiece-style splitting uses it.
inline size_t utf8_len(unsigned char c) {
  static constexpr uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lut[c >> 4];
}

// Decodes UTF-8; each invalid or truncated sequence consumes one byte and yields
// U+FFFD (llama.cpp's convention), so the result never fails.
std::vector<uint32_t> utf8_to_cpts(std::string_view s);

// GPT-2 byte-level BPE alphabet: byte -> code point, and its inverse (-1 if none).
uint32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);

}  // namespace tessera::tok
