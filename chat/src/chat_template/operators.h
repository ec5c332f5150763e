// Operators with Python's semantics: arithmetic (floor division and modulo round toward
// negative infinity, / is always a float division), sequence concatenation and
// repetition, `in`, slicing with negative steps, and the two string formatting
// mini-languages templates reach (`"%s" % x` and "{}".format(x)).
#pragma once
#include <string>

#include "ast.h"
#include "value.h"

namespace tessera::chat_template {

class Interp;

// Add Sub Mul Div FloorDiv Mod Pow Concat (And/Or short-circuit in the interpreter).
Value binary_op(Interp& in, BinaryExpr::Op op, const Value& a, const Value& b);
Value unary_op(UnaryExpr::Op op, const Value& v);  // Neg, Pos
// `item in container`
bool contains(const Value& container, const Value& item);
// obj[start:stop:step]; missing parts are None.
Value slice(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python's `fmt % args` (args: a tuple for several values, a dict for %(name)s).
std::string percent_format(Interp& in, const std::string& fmt, const Value& args);
// Python's str.format(*args, **kwargs).
std::string str_format(Interp& in, const std::string& fmt, const CallArgs& args);
// Python's format(value, spec) for the common specs: fill, align, sign, width,
// grouping, precision and types s d b o x X c e E f F g G %.
std::string format_spec(const Value& v, const std::string& spec);
// markupsafe.escape()
std::string html_escape(const std::string& s);

}  // namespace tessera::chat_template
