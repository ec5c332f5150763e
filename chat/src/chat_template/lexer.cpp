#include "lexer.h"

#include <cstring>

#include "tessera/chat_template.h"
#include "utf8.h"

namespace tessera::chat_template {

namespace {

[[noreturn]] void syntax_error(const std::string& msg, int line) {
  throw ChatTemplateError(ChatTemplateError::Kind::Syntax, msg, line);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Jinja2 reads string literals with Python's unicode-escape codec.
std::string decode_string_literal(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    auto hex = [&](size_t digits) -> uint32_t {
      uint32_t v = 0;
      for (size_t k = 0; k < digits; ++k) {
        size_t j = i + 1 + k;
        char h = j < body.size() ? body[j] : '\0';
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) syntax_error("truncated \\" + std::string(1, e) + " escape in a string literal", line);
        v = v * 16 + static_cast<uint32_t>(d);
      }
      i += digits;
      return v;
    };
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': append_utf8(out, hex(2)); break;
      case 'u': append_utf8(out, hex(4)); break;
      case 'U': {
        uint32_t cp = hex(8);
        if (cp > 0x10FFFF) syntax_error("illegal Unicode character in a string literal", line);
        append_utf8(out, cp);
        break;
      }
      case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
        uint32_t v = static_cast<uint32_t>(e - '0');
        for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
          v = v * 8 + static_cast<uint32_t>(body[++i] - '0');
        append_utf8(out, v);
        break;
      }
      default:  // unknown escapes stay as written, as in Python
        out += '\\';
        out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& o) : src_(std::move(src)), opt_(o) {}

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_data(std::string_view(src_).substr(pos_), line_);
        advance_to(n);
        break;
      }
      char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string_view text = std::string_view(src_).substr(pos_, tag - pos_);
      int text_line = line_;
      size_t raw_body = kind == '%' ? match_raw_begin(after) : std::string::npos;
      emit_data(strip_before(text, sign, kind != '{'), text_line);
      advance_to(tag);
      if (raw_body != std::string::npos) {
        lex_raw(raw_body);
      } else if (kind == '#') {
        lex_comment(after);
      } else {
        lex_tag(kind, after);
      }
    }
    toks_.push_back(Token{Tok::End, line_, {}});
    return std::move(toks_);
  }

 private:
  std::string src_;
  LexOptions opt_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the previous tag's match ended with a newline

  void advance_to(size_t p) {
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    pos_ = p;
  }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  void emit_data(std::string_view text, int line) {
    if (!text.empty()) toks_.push_back(Token{Tok::Data, line, std::string(text)});
  }

  // The text before a tag: `-` strips all whitespace; otherwise lstrip_blocks removes the
  // indentation of a block or comment tag that starts its line.
  std::string_view strip_before(std::string_view text, char sign, bool lstrip_kind) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      return text.substr(0, e);
    }
    if (sign != '+' && opt_.lstrip_blocks && lstrip_kind) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
        bool all_ws = true;
        for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
        if (all_ws) return text.substr(0, l_pos);
      }
    }
    return text;
  }

  // After a tag's end marker: `-` eats all whitespace, trim_blocks one newline.
  void finish_tag(size_t end, char end_sign, bool trim) {
    size_t p = end;
    if (end_sign == '-') {
      while (p < src_.size() && is_ws(src_[p])) ++p;
    } else if (trim && opt_.trim_blocks && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    advance_to(p);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  // `{%[-+]? raw [-]?%}` starting after the sign: returns where the raw text begins.
  size_t match_raw_begin(size_t p) {
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p += 3;
    if (p < src_.size() && is_name_char(src_[p])) return std::string::npos;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  void lex_raw(size_t body) {
    advance_to(body);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      emit_data(strip_before(std::string_view(src_).substr(body, p - body), sign, true), line_);
      advance_to(p);
      finish_tag(q + 2, end_sign, end_sign == 0);
      return;
    }
    syntax_error("Missing end of raw directive", line_);
  }

  void lex_comment(size_t after) {
    size_t e = src_.find("#}", after);
    if (e == std::string::npos) syntax_error("Missing end of comment tag", line_);
    char end_sign = (e > after && (src_[e - 1] == '-' || src_[e - 1] == '+')) ? src_[e - 1] : 0;
    finish_tag(e + 2, end_sign, end_sign == 0);
  }

  void lex_tag(char kind, size_t after) {
    const bool block = kind == '%';
    toks_.push_back(Token{block ? Tok::BlockBegin : Tok::VarBegin, line_, {}});
    advance_to(after);
    std::string balance;  // open brackets: end markers only count when balanced
    const size_t n = src_.size();
    while (true) {
      size_t p = pos_;
      while (p < n && is_ws(src_[p])) ++p;
      advance_to(p);
      if (p >= n)
        syntax_error(std::string("unexpected end of template, expected '") + (block ? "end of statement block" : "end of print statement") + "'", line_);
      if (balance.empty()) {
        if (block) {
          if (src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0) {
            toks_.push_back(Token{Tok::BlockEnd, line_, {}});
            finish_tag(p + 3, src_[p], false);
            return;
          }
          if (src_.compare(p, 2, "%}") == 0) {
            toks_.push_back(Token{Tok::BlockEnd, line_, {}});
            finish_tag(p + 2, 0, true);
            return;
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0) {
            toks_.push_back(Token{Tok::VarEnd, line_, {}});
            finish_tag(p + 3, '-', false);
            return;
          }
          if (src_.compare(p, 2, "}}") == 0) {
            toks_.push_back(Token{Tok::VarEnd, line_, {}});
            finish_tag(p + 2, 0, false);
            return;
          }
        }
      }
      char c = src_[p];
      if (c == '\'' || c == '"') {
        lex_string(p);
      } else if (is_digit(c)) {
        lex_number(p);
      } else if (is_name_start(c)) {
        size_t q = p;
        while (q < n && is_name_char(src_[q])) ++q;
        toks_.push_back(Token{Tok::Name, line_, src_.substr(p, q - p)});
        advance_to(q);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                           "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src_.compare(p, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) syntax_error("unexpected char '" + std::string(1, c) + "'", line_);
        if (c == '(' || c == '[' || c == '{') {
          balance += c;
        } else if (c == ')' || c == ']' || c == '}') {
          char open = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (balance.empty()) syntax_error("unexpected '" + std::string(1, c) + "'", line_);
          if (balance.back() != open) {
            char want = balance.back() == '(' ? ')' : balance.back() == '[' ? ']' : '}';
            syntax_error("unexpected '" + std::string(1, c) + "', expected '" + std::string(1, want) + "'", line_);
          }
          balance.pop_back();
        }
        toks_.push_back(Token{Tok::Op, line_, op});
        advance_to(p + std::strlen(op));
      }
    }
  }

  void lex_string(size_t p) {
    char q = src_[p];
    size_t i = p + 1;
    while (i < src_.size() && src_[i] != q) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size()) syntax_error("unterminated string literal", line_);
    int line = line_;
    Token t{Tok::String, line, decode_string_literal(std::string_view(src_).substr(p + 1, i - p - 1), line)};
    toks_.push_back(std::move(t));
    advance_to(i + 1);
  }

  void lex_number(size_t p) {
    const size_t n = src_.size();
    auto digits = [&](size_t q, auto pred) {
      while (q < n && (pred(src_[q]) || (src_[q] == '_' && q + 1 < n && pred(src_[q + 1])))) ++q;
      return q;
    };
    auto dec = [](char c) { return c >= '0' && c <= '9'; };
    auto clean = [](std::string s) {
      std::string o;
      for (char c : s)
        if (c != '_') o += c;
      return o;
    };
    // 0x / 0o / 0b integers
    if (src_[p] == '0' && p + 2 < n && std::strchr("xXoObB", src_[p + 1]) && src_[p + 1] != '\0') {
      char k = static_cast<char>(src_[p + 1] | 0x20);
      int base = k == 'x' ? 16 : k == 'o' ? 8 : 2;
      auto ok = [base](char c) {
        int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') ? (c | 0x20) - 'a' + 10 : 99;
        return d < base;
      };
      size_t q = p + 2;
      if (q < n && src_[q] == '_') ++q;
      size_t e = digits(q, ok);
      if (e > q) {
        std::string d = clean(src_.substr(q, e - q));
        uint64_t v = 0;
        for (char c : d) {
          uint64_t dv = static_cast<uint64_t>((c >= '0' && c <= '9') ? c - '0' : (c | 0x20) - 'a' + 10);
          if (v > (static_cast<uint64_t>(INT64_MAX) - dv) / static_cast<uint64_t>(base))
            syntax_error("integer literal too large", line_);
          v = v * static_cast<uint64_t>(base) + dv;
        }
        toks_.push_back(Token{Tok::Int, line_, src_.substr(p, e - p), static_cast<int64_t>(v)});
        advance_to(e);
        return;
      }
    }
    size_t e = digits(p, dec);
    bool is_float = false;
    bool after_dot = p > 0 && src_[p - 1] == '.';  // `a.0.1` is two subscripts, not a float
    if (!after_dot && e + 1 < n && src_[e] == '.' && dec(src_[e + 1])) {
      e = digits(e + 1, dec);
      is_float = true;
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && dec(src_[q])) {
        e = digits(q, dec);
        is_float = true;
      }
    }
    std::string text = clean(src_.substr(p, e - p));
    Token t{is_float ? Tok::Float : Tok::Int, line_, text};
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      uint64_t v = 0;
      for (char c : text) {
        if (v > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(c - '0')) / 10)
          syntax_error("integer literal too large", line_);
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      t.ival = static_cast<int64_t>(v);
    }
    toks_.push_back(std::move(t));
    advance_to(e);
  }
};

std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options) {
  return Lexer(normalize_newlines(source), options).run();
}

const char* token_description(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::String: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::End: return "end of template";
    case Tok::Name:
    case Tok::Op: return t.text.c_str();
  }
  return "token";
}

}  // namespace tessera::chat_template
