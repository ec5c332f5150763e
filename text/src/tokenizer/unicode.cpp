#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <array>

namespace tessera::tok {

namespace {

uint8_t classify(uint32_t cp) {
  uint8_t c = 0;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER: c = kLetter | kUpper; break;
    case U_LOWERCASE_LETTER: c = kLetter | kLower; break;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER: c = kLetter; break;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER: c = kNumber; break;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK: c = kMark; break;
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION: c = kPunct; break;
    case U_MATH_SYMBOL:
    case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL:
    case U_OTHER_SYMBOL: c = kSymbol; break;
    default: break;
  }
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) c |= kWhitespace;
  return c;
}

struct AsciiTable {
  std::array<uint8_t, 128> cls{};
  AsciiTable() {
    for (uint32_t i = 0; i < 128; ++i) cls[i] = classify(i);
  }
};

struct ByteMap {
  std::array<uint32_t, 256> b2u{};
  std::array<int16_t, 324> u2b{};  // code points used are < 256 + 68
  ByteMap() {
    u2b.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      b2u[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      u2b[b2u[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

uint8_t cp_class(uint32_t cp) {
  static const AsciiTable ascii;
  if (cp < 128) return ascii.cls[cp];
  if (cp > 0x10FFFF) return 0;
  return classify(cp);
}

std::vector<uint32_t> utf8_to_cpts(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return i + k < n && (p[i + k] & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(c);
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && cont(1)) {
      out.push_back(((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu));
      i += 2;
    } else if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
      out.push_back(((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu));
      i += 3;
    } else if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
      const uint32_t cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) |
                          (p[i + 3] & 0x3Fu);
      if (cp > 0x10FFFF) {
        out.push_back(0xFFFD);
        i += 1;
      } else {
        out.push_back(cp);
        i += 4;
      }
    } else {
      out.push_back(0xFFFD);
      i += 1;
    }
  }
  return out;
}

uint32_t byte_to_unicode(uint8_t b) { return byte_map().b2u[b]; }

int unicode_to_byte(uint32_t cp) {
  const auto& m = byte_map();
  return cp < m.u2b.size() ? m.u2b[cp] : -1;
}

}  // namespace tessera::tok
