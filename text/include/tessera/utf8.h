// UTF-8 encoding and decoding of one code point, shared by the tokenizer, the chat
// template interpreter and the grammars. Invalid input decodes as U+FFFD one byte at a
// time; a code point past U+10FFFF encodes as U+FFFD.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

void append_utf8(std::string& out, uint32_t cp);
// Decodes the code point at s[i] and advances i past it.
uint32_t next_code_point(std::string_view s, size_t& i);

}  // namespace tessera
