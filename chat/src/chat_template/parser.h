// Parser: tokens -> Program, following Jinja2's grammar and operator precedence
// (filters and tests bind tighter than arithmetic: `a + b | f` is `a + (b | f)`, and
// `not x is defined` is `not (x is defined)`).
#pragma once
#include <memory>
#include <string_view>

#include "ast.h"

namespace tessera::chat_template {

// Throws ChatTemplateError (Kind::Syntax) with the line of the offending token.
std::unique_ptr<Program> parse(std::string_view source);

}  // namespace tessera::chat_template
