// The parsed template: expression and statement nodes. Each node keeps its source line
// so that a run-time error can say where it happened. Nodes are plain structs tagged by
// kind; the interpreter switches on the kind (no virtual dispatch, no visitor).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace tessera::chat_template {

// --- expressions ----------------------------------------------------------------------

struct Expr {
  enum class K { Const, Name, List, Dict, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Compare, Cond };
  Expr(K k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  K kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Args {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(K::Const, l), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(K::Name, l), name(std::move(n)) {}
  std::string name;
};
struct ListExpr : Expr {  // [a, b] or (a, b)
  ListExpr(bool t, int l) : Expr(K::List, l), tuple(t) {}
  std::vector<ExprPtr> items;
  bool tuple;
};
struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(K::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct AttrExpr : Expr {  // obj.name: attribute first, then item (Jinja2's getattr)
  AttrExpr(ExprPtr o, std::string n, int l) : Expr(K::Attr, l), obj(std::move(o)), name(std::move(n)) {}
  ExprPtr obj;
  std::string name;
};
struct ItemExpr : Expr {  // obj[index]: item first, then attribute (Jinja2's getitem)
  ItemExpr(ExprPtr o, ExprPtr i, int l) : Expr(K::Item, l), obj(std::move(o)), index(std::move(i)) {}
  ExprPtr obj, index;
};
struct SliceExpr : Expr {  // obj[start:stop:step], any part may be missing
  SliceExpr(ExprPtr o, int l) : Expr(K::Slice, l), obj(std::move(o)) {}
  ExprPtr obj, start, stop, step;
};
struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(K::Call, l), callee(std::move(c)) {}
  ExprPtr callee;
  Args args;
};
struct FilterExpr : Expr {  // base | name(args); base is null in {% filter %} and {% set x | f %}
  FilterExpr(ExprPtr b, std::string n, int l) : Expr(K::Filter, l), base(std::move(b)), name(std::move(n)) {}
  ExprPtr base;
  std::string name;
  Args args;
};
struct TestExpr : Expr {  // base is [not] name(args)
  TestExpr(ExprPtr b, std::string n, bool neg, int l)
      : Expr(K::Test, l), base(std::move(b)), name(std::move(n)), negated(neg) {}
  ExprPtr base;
  std::string name;
  bool negated;
  Args args;
};
struct UnaryExpr : Expr {
  enum class Op { Neg, Pos, Not };
  UnaryExpr(Op o, ExprPtr e, int l) : Expr(K::Unary, l), op(o), operand(std::move(e)) {}
  Op op;
  ExprPtr operand;
};
struct BinaryExpr : Expr {
  enum class Op { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat, And, Or };
  BinaryExpr(Op o, ExprPtr a, ExprPtr b, int l) : Expr(K::Binary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  Op op;
  ExprPtr left, right;
};
enum class CmpOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
struct CompareExpr : Expr {  // a < b <= c chains as in Python
  CompareExpr(ExprPtr f, int l) : Expr(K::Compare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> rest;
};
struct CondExpr : Expr {  // then if cond else otherwise (otherwise may be missing: undefined)
  CondExpr(ExprPtr c, ExprPtr t, ExprPtr o, int l)
      : Expr(K::Cond, l), cond(std::move(c)), then(std::move(t)), otherwise(std::move(o)) {}
  ExprPtr cond, then, otherwise;
};

// --- statements -------------------------------------------------------------------------

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class K { Text, Print, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Break, Continue, Generation };
  Stmt(K k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  K kind;
  int line;
};

// An assignment target: a name, ns.attr, or names to unpack (a, b).
struct Target {
  enum class K { Name, Attr, Tuple } kind = K::Name;
  std::string name;                // Name, and the namespace of Attr
  std::string attr;                // Attr
  std::vector<std::string> names;  // Tuple
};

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(K::Text, l), text(std::move(t)) {}
  std::string text;
};
struct PrintStmt : Stmt {
  PrintStmt(ExprPtr e, int l) : Stmt(K::Print, l), expr(std::move(e)) {}
  ExprPtr expr;
};
struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(K::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};
struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(K::For, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // for x in xs if cond
  Body body;
  Body otherwise;  // runs when no item was iterated
  bool recursive = false;
};
struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(K::Set, l) {}
  Target target;
  ExprPtr value;
};
struct SetBlockStmt : Stmt {  // {% set x | filter %}body{% endset %}
  explicit SetBlockStmt(int l) : Stmt(K::SetBlock, l) {}
  Target target;
  ExprPtr filter;  // may be null
  Body body;
};
struct Param {
  std::string name;
  ExprPtr default_value;  // may be null
};
struct MacroDef {
  std::string name;
  std::vector<Param> params;
  Body body;
  int line = 0;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};
struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(K::Macro, l) {}
  MacroDef def;
};
struct CallBlockStmt : Stmt {  // {% call(args) macro(...) %}body{% endcall %}: body is `caller`
  explicit CallBlockStmt(int l) : Stmt(K::CallBlock, l) {}
  ExprPtr call;  // a CallExpr
  MacroDef caller;
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(K::FilterBlock, l) {}
  ExprPtr filter;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(K::With, l) {}
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body;
};
struct SimpleStmt : Stmt {  // break, continue
  SimpleStmt(K k, int l) : Stmt(k, l) {}
};
struct GenerationStmt : Stmt {  // Hugging Face's {% generation %}: renders its body unchanged
  explicit GenerationStmt(int l) : Stmt(K::Generation, l) {}
  Body body;
};

}  // namespace tessera::chat_template

namespace tessera::chat_template {
struct Program {
  Body body;
};
}  // namespace tessera::chat_template
