// A regular subset of ECMA-262 regular expressions (JSON Schema's "pattern") as GBNF
// over the characters of a JSON string: what the regex matches is the decoded text,
// so a quote or backslash becomes its escape and "." any JSON string character.
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/utf8.h"
#include "grammar/gbnf_pieces.h"
#include "tessera/grammar.h"

namespace tessera::gbnf {

namespace {

struct Range {
  uint32_t lo, hi;
};

std::string class_char(uint32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return std::string(1, char(c));
  char buf[16];
  if (c <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(c));
  else if (c <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(c));
  else std::snprintf(buf, sizeof buf, "\\U%08X", unsigned(c));
  return buf;
}

class RegexConverter {
 public:
  RegexConverter(std::string_view p, const std::string& any) : p_(p), any_(any) {}

  std::string convert() {
    bool start = false, end = false;
    if (!p_.empty() && p_[0] == '^') {
      start = true;
      ++i_;
    }
    size_t stop = p_.size();
    if (stop > i_ && p_[stop - 1] == '$' && !(stop >= 2 && p_[stop - 2] == '\\')) {
      end = true;
      --stop;
    }
    p_ = p_.substr(0, stop);
    std::string body = alternatives();
    if (i_ < p_.size()) fail("unexpected ')'");
    std::string out;
    if (!start) out += any_ + "* ";
    out += body;
    if (!end) out += " " + any_ + "*";
    return "(" + out + ")";
  }

 private:
  std::string_view p_;
  size_t i_ = 0;
  const std::string& any_;

  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("JSON schema: pattern: " + what + " (at offset " + std::to_string(i_) + ")");
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return more() ? p_[i_] : '\0'; }

  std::string alternatives() {
    std::vector<std::string> alts{sequence()};
    while (peek() == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t k = 0; k < alts.size(); ++k) s += (k ? " | " : "") + (alts[k].empty() ? std::string("\"\"") : alts[k]);
    return s + ")";
  }

  std::string sequence() {
    std::string seq;
    while (more() && peek() != '|' && peek() != ')') {
      std::string a = atom();
      a += quantifier();
      seq += (seq.empty() ? "" : " ") + a;
    }
    return seq;
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t close = p_.find('}', i_);
      if (close == std::string_view::npos) fail("unterminated '{'");
      q = std::string(p_.substr(i_, close - i_ + 1));
      for (char d : q.substr(1, q.size() - 2))
        if (!(d >= '0' && d <= '9') && d != ',') fail("bad repetition " + q);
      i_ = close + 1;
    } else {
      return "";
    }
    if (peek() == '?') ++i_;  // lazy: the same language
    return q;
  }

  // A character of the decoded string, as grammar over its JSON text.
  static std::string json_char(uint32_t c) {
    if (c == '"') return gbnf_literal("\\\"");
    if (c == '\\') return gbnf_literal("\\\\");
    if (c == '\n') return gbnf_literal("\\n");
    if (c == '\t') return gbnf_literal("\\t");
    if (c == '\r') return gbnf_literal("\\r");
    if (c < 0x20) fail_static("a control character");
    std::string utf8;
    append_utf8(utf8, c);
    return gbnf_literal(utf8);
  }
  [[noreturn]] static void fail_static(const std::string& what) {
    throw GrammarError("JSON schema: pattern: " + what + " is not supported");
  }

  // A class of plain characters: quotes, backslashes and control characters need
  // their escapes and are matched as alternatives beside the class.
  static std::string char_set(const std::vector<Range>& ranges, bool negated) {
    if (negated) {
      std::string s = "[^";
      for (const Range& r : ranges) s += class_char(r.lo) + (r.hi != r.lo ? "-" + class_char(r.hi) : "");
      return s + "\\x00-\\x1F\\x22\\x5C]";  // and never a raw quote, backslash or control
    }
    std::string s = "[";
    std::vector<std::string> extra;
    for (const Range& r : ranges) {
      if (r.lo < 0x20) fail_static("a control character in a class");
      uint32_t lo = r.lo;
      // Split out '"' (0x22) and '\' (0x5C) as escaped alternatives.
      for (uint32_t special : {0x22u, 0x5Cu}) {
        if (lo <= special && special <= r.hi) {
          if (lo < special) s += class_char(lo) + (special - 1 != lo ? "-" + class_char(special - 1) : "");
          extra.push_back(json_char(special));
          lo = special + 1;
        }
      }
      if (lo <= r.hi) s += class_char(lo) + (r.hi != lo ? "-" + class_char(r.hi) : "");
    }
    s += "]";
    if (s == "[]") s.clear();
    if (extra.empty()) return s;
    std::string alt = "(";
    if (!s.empty()) alt += s + " | ";
    for (size_t k = 0; k < extra.size(); ++k) alt += (k ? " | " : "") + extra[k];
    return alt + ")";
  }

  // \d \w \s and their negations, as ranges; false if `e` is not one of them.
  static bool class_escape(char e, std::vector<Range>& out, bool& negated) {
    negated = e == 'D' || e == 'W' || e == 'S';
    switch (e) {
      case 'd': case 'D': out.push_back({'0', '9'}); return true;
      case 'w': case 'W':
        out.insert(out.end(), {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}});
        return true;
      case 's': case 'S': out.insert(out.end(), {{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}); return true;
      default: return false;
    }
  }

  uint32_t escaped_char(char e) {
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'b': case 'B': fail("word boundaries (\\b, \\B)");
      case 'u': {
        if (i_ + 4 > p_.size()) fail("\\u needs 4 hex digits");
        const uint32_t v = uint32_t(std::stoul(std::string(p_.substr(i_, 4)), nullptr, 16));
        i_ += 4;
        return v;
      }
      default:
        if (e >= '1' && e <= '9') fail("back-references");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) fail(std::string("the escape \\") + e);
        return uint32_t(static_cast<unsigned char>(e));
    }
  }

  uint32_t utf8_char() { return next_code_point(p_, i_); }  // patterns come from JSON: valid UTF-8

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        ++i_;
        if (peek() == ':') {
          ++i_;
        } else if (peek() == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) fail("unterminated group name");
          i_ = close + 1;
        } else {
          fail("look-around assertions");
        }
      }
      std::string inner = alternatives();
      if (peek() != ')') fail("missing ')'");
      ++i_;
      return "(" + (inner.empty() ? std::string("\"\"") : inner) + ")";
    }
    if (c == '[') return bracket();
    if (c == '.') {
      ++i_;
      return any_;
    }
    if (c == '^' || c == '$') fail("an anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') fail(std::string("'") + c + "' follows nothing");
    if (c == '\\') {
      ++i_;
      if (!more()) fail("a trailing backslash");
      const char e = p_[i_++];
      std::vector<Range> rs;
      bool negated = false;
      if (class_escape(e, rs, negated)) {
        if (!negated && e == 's') return "(\" \" | " + json_char('\t') + " | " + json_char('\n') + " | " + json_char('\r') + ")";
        return char_set(rs, negated);
      }
      return json_char(escaped_char(e));
    }
    return json_char(utf8_char());
  }

  std::string bracket() {
    ++i_;  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++i_;
    }
    std::vector<Range> ranges;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        ++i_;
        if (!more()) fail("a trailing backslash");
        const char e = p_[i_++];
        bool neg = false;
        std::vector<Range> rs;
        if (class_escape(e, rs, neg)) {
          if (neg) fail("\\D, \\W or \\S inside a class");
          ranges.insert(ranges.end(), rs.begin(), rs.end());
          continue;
        }
        lo = escaped_char(e);
      } else {
        lo = utf8_char();
      }
      uint32_t hi = lo;
      if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (peek() == '\\') {
          ++i_;
          hi = escaped_char(p_[i_++]);
        } else {
          hi = utf8_char();
        }
        if (hi < lo) fail("a range that ends before it starts");
      }
      ranges.push_back({lo, hi});
    }
    if (!more()) fail("unterminated '['");
    ++i_;  // ]
    if (negated) {
      for (const Range& r : ranges)
        if (r.lo < 0x20) fail("a control character in a class");
    }
    return char_set(ranges, negated);
  }
};

}  // namespace

std::string regex(std::string_view pattern, const std::string& any_char) {
  return RegexConverter(pattern, any_char).convert();
}

}  // namespace tessera::gbnf
