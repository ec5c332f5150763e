#include <cstdio>

#include "tessera/grammar.h"

namespace tessera {

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  for (char ch : utf8) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through: GBNF literals are UTF-8
    }
  }
  return out + "\"";
}

}  // namespace tessera
