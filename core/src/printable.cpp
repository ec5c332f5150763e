// printable() (printable.h): text from files and plugins made safe for a terminal.
#include "tessera/printable.h"

#include <algorithm>
#include <cstdint>

namespace tessera {

std::string printable(std::string_view s, size_t max_len) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max_len ? max_len : s.size()) + 8);
  auto escape_byte = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  size_t i = 0;
  while (i < s.size()) {
    if (max_len && out.size() >= max_len) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
      else escape_byte(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes, no
    // overlong forms, surrogates or values above U+10FFFF.
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    bool ok = len != 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok) ok = !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
    if (!ok) {
      escape_byte(c);
      ++i;
      continue;
    }
    if (cp >= 0x80 && cp <= 0x9f) {  // C1 controls (CSI is U+009B)
      for (size_t k = 0; k < len; ++k) escape_byte(static_cast<unsigned char>(s[i + k]));
    } else if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) {
      out += "\\u{";
      for (int sh = 12; sh >= 0; sh -= 4) out += hex[(cp >> sh) & 15];
      out += '}';
    } else {
      out.append(s.data() + i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace tessera
