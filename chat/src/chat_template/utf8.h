// UTF-8 helpers. Python strings are sequences of code points: len(), indexing, slicing,
// strip() and friends count code points, so the interpreter decodes where it must.
// Invalid bytes decode as U+FFFD one byte at a time (never a crash); they cannot come
// from JSON input, only from a template file that is not UTF-8.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/utf8.h"  // append_utf8, next_code_point

namespace tessera::chat_template {

bool is_ascii(std::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);
size_t code_point_count(std::string_view s);
std::vector<uint32_t> decode_utf8(std::string_view s);
std::string encode_utf8(const std::vector<uint32_t>& cps);

// Python's str.isspace() set (strip(), split() with no argument).
bool py_isspace(uint32_t cp);
// Python's str.isprintable() (repr() escapes the rest).
bool py_isprintable(uint32_t cp);
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool is_alpha(uint32_t cp);
bool is_digit(uint32_t cp);     // Unicode decimal digit (str.isdigit/isdecimal)
bool is_numeric(uint32_t cp);   // str.isnumeric
bool is_upper(uint32_t cp);
bool is_lower(uint32_t cp);
bool is_cased(uint32_t cp);

}  // namespace tessera::chat_template
