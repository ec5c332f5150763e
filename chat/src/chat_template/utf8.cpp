#include "utf8.h"

#include <unicode/uchar.h>

namespace tessera::chat_template {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> o;
  o.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    o.push_back(i);
    next_code_point(s, i);
  }
  o.push_back(s.size());
  return o;
}

size_t code_point_count(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_code_point(s, i);
  return n;
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> v;
  v.reserve(s.size());
  for (size_t i = 0; i < s.size();) v.push_back(next_code_point(s, i));
  return v;
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string s;
  s.reserve(cps.size());
  for (uint32_t c : cps) append_utf8(s, c);
  return s;
}

bool py_isspace(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool py_isprintable(uint32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

uint32_t to_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return static_cast<uint32_t>(u_toupper(static_cast<UChar32>(c)));
}
uint32_t to_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return static_cast<uint32_t>(u_tolower(static_cast<UChar32>(c)));
}
bool is_alpha(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return u_isalpha(static_cast<UChar32>(c));
}
bool is_digit(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return u_isdigit(static_cast<UChar32>(c));
}
bool is_numeric(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return u_getNumericValue(static_cast<UChar32>(c)) != U_NO_NUMERIC_VALUE;
}
bool is_upper(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  return u_isUUppercase(static_cast<UChar32>(c));
}
bool is_lower(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  return u_isULowercase(static_cast<UChar32>(c));
}
bool is_cased(uint32_t c) { return is_upper(c) || is_lower(c) || u_istitle(static_cast<UChar32>(c)); }

}  // namespace tessera::chat_template
