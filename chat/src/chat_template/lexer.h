// Lexer: template source -> tokens. All of Jinja2's whitespace control happens here,
// as in Jinja2 itself: `{%-`/`-%}` (and the `{{`/`{#` forms) strip whitespace around a
// tag, trim_blocks drops the newline after a block or comment tag, lstrip_blocks drops
// the indentation before one, `{%+`/`+%}` opt out. Comments and {% raw %} are resolved
// here too, so the parser sees only text, expressions and statements.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::chat_template {

enum class Tok : uint8_t {
  Data,        // template text, already whitespace-controlled
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // text holds the decoded value
  Int,
  Float,
  Op,          // text holds the operator: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  End,
};

struct Token {
  Tok type;
  int line;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws ChatTemplateError (Kind::Syntax) on an unterminated tag, string or comment, or
// an unexpected character. Newlines are normalised to "\n" and one trailing newline is
// dropped, as Jinja2 does by default (keep_trailing_newline=False).
std::vector<Token> lex(std::string_view source, const LexOptions& options = {});

const char* token_description(const Token& t);  // for error messages: "end of print statement", ...

}  // namespace tessera::chat_template
