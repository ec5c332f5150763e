#include "parser.h"

#include <initializer_list>

#include "lexer.h"

namespace tessera::chat_template {

namespace {

// Nesting beyond this is hostile, not a chat template; it would otherwise exhaust the
// stack of this recursive-descent parser (and of the interpreter walking the tree).
constexpr int kMaxNesting = 200;

std::string quote_list(const std::vector<std::string>& tags) {
  std::string s;
  for (size_t i = 0; i < tags.size(); ++i) s += (i ? " or '" : "'") + tags[i] + "'";
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->body = parse_body({}, "");
    return prog;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<MacroDef*> open_macros_;
  // Blocks being parsed, innermost last, with the tags that may end or continue them.
  std::vector<std::pair<std::string, std::vector<std::string>>> open_blocks_;

  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.fail("template nested too deeply (more than " + std::to_string(kMaxNesting) + " levels)");
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  int line() const { return cur().line; }

  [[noreturn]] void fail(const std::string& msg) const {
    throw ChatTemplateError(ChatTemplateError::Kind::Syntax, msg, cur().line);
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got '" + token_description(cur()) + "'");
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(std::string("expected token '") + what + "', got '" + token_description(cur()) + "'");
    next();
  }
  void expect_block_end() { expect(Tok::BlockEnd, "end of statement block"); }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(std::string("expected token 'name', got '") + token_description(cur()) + "'");
    std::string n = cur().text;
    next();
    return n;
  }

  // --- template structure ---------------------------------------------------------------

  // Parses until a block tag named in `ends` (left unconsumed after its name, which is
  // returned in *which) or the end of the template (only when ends is empty).
  Body parse_body(std::vector<std::string> ends, const std::string& block, std::string* which = nullptr) {
    Nest nest(*this);
    if (!ends.empty()) open_blocks_.emplace_back(block, ends);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Data) {
        body.push_back(std::make_unique<TextStmt>(tk.text, tk.line));
        next();
      } else if (tk.type == Tok::VarBegin) {
        int l = tk.line;
        next();
        auto e = parse_tuple(true, false, {});
        expect(Tok::VarEnd, "end of print statement");
        body.push_back(std::make_unique<PrintStmt>(std::move(e), l));
      } else if (tk.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail("tag name expected");
        const std::string& tag = cur().text;
        for (const auto& e : ends)
          if (tag == e) {
            if (which) *which = tag;
            next();
            open_blocks_.pop_back();
            return body;
          }
        body.push_back(parse_statement());
      } else if (tk.type == Tok::End) {
        if (!ends.empty())
          fail("Unexpected end of template. Jinja was looking for the following tags: " + quote_list(ends) +
               ". The innermost block that needs to be closed is '" + block + "'.");
        return body;
      } else {
        fail(std::string("unexpected '") + token_description(tk) + "'");
      }
    }
  }

  StmtPtr parse_statement() {
    const std::string tag = cur().text;
    int l = line();
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") {
      next();
      expect_block_end();
      auto s = std::make_unique<GenerationStmt>(l);
      s->body = parse_body({"endgeneration"}, "generation");
      expect_block_end();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside loop");
      next();
      expect_block_end();
      return std::make_unique<SimpleStmt>(tag == "break" ? Stmt::K::Break : Stmt::K::Continue, l);
    }
    std::string msg = "Encountered unknown tag '" + tag + "'.";
    if (!open_blocks_.empty())
      msg += " Jinja was looking for the following tags: " + quote_list(open_blocks_.back().second) +
             ". The innermost block that needs to be closed is '" + open_blocks_.back().first + "'.";
    fail(msg);
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(line());
    next();  // if
    while (true) {
      auto cond = parse_tuple(false, false, {});
      expect_block_end();
      std::string which;
      Body body = parse_body({"elif", "else", "endif"}, "if", &which);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        s->otherwise = parse_body({"endif"}, "if");
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(line());
    next();  // for
    s->target = parse_assign_target(false, "in");
    if (!skip_name("in")) fail(std::string("expected token 'in', got '") + token_description(cur()) + "'");
    s->iter = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->filter = parse_expression(true);
    s->recursive = skip_name("recursive");
    expect_block_end();
    std::string which;
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"}, "for", &which);
    --loop_depth_;
    if (which == "else") {
      expect_block_end();
      s->otherwise = parse_body({"endfor"}, "for");
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    int l = line();
    next();  // set
    Target target = parse_assign_target(true, "");
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>(l);
      s->target = std::move(target);
      s->value = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    if (target.kind == Target::K::Tuple) fail("expected token '=', got '" + std::string(token_description(cur())) + "'");
    auto s = std::make_unique<SetBlockStmt>(l);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter_chain(nullptr, false);
    expect_block_end();
    s->body = parse_body({"endset"}, "set");
    expect_block_end();
    return s;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      def.params.push_back(std::move(p));
    }
    expect_op(")");
  }

  void parse_macro_body(MacroDef& def, const char* end, const char* block) {
    int saved_loops = loop_depth_;
    loop_depth_ = 0;  // a macro body cannot break out of the loop it is defined in
    open_macros_.push_back(&def);
    def.body = parse_body({end}, block);
    open_macros_.pop_back();
    loop_depth_ = saved_loops;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>(line());
    next();  // macro
    s->def.line = s->line;
    s->def.name = expect_name();
    open_macros_.push_back(&s->def);  // defaults may mention varargs etc. (harmless)
    parse_signature(s->def);
    open_macros_.pop_back();
    expect_block_end();
    parse_macro_body(s->def, "endmacro", "macro");
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlockStmt>(line());
    next();  // call
    s->caller.name = "caller";
    s->caller.line = s->line;
    if (is_op("(")) parse_signature(s->caller);
    auto call = parse_expression(true);
    if (call->kind != Expr::K::Call) fail("expected call");
    s->call = std::move(call);
    expect_block_end();
    parse_macro_body(s->caller, "endcall", "call");
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<FilterBlockStmt>(line());
    next();  // filter
    s->filter = parse_filter_chain(nullptr, true);
    expect_block_end();
    s->body = parse_body({"endfilter"}, "filter");
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(line());
    next();  // with
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target t = parse_assign_target(false, "");
      expect_op("=");
      s->assigns.emplace_back(std::move(t), parse_expression(true));
    }
    expect_block_end();
    s->body = parse_body({"endwith"}, "with");
    expect_block_end();
    return s;
  }

  // name | name.attr (set only) | a, b | (a, b)
  Target parse_assign_target(bool with_namespace, const char* end_name) {
    Target t;
    bool parens = skip_op("(");
    std::string first = expect_name();
    if (with_namespace && !parens && is_op(".")) {
      next();
      t.kind = Target::K::Attr;
      t.name = first;
      t.attr = expect_name();
      return t;
    }
    t.names.push_back(first);
    bool tuple = parens;
    while (is_op(",")) {
      next();
      tuple = true;
      if (cur().type != Tok::Name || (*end_name && is_name(end_name))) break;
      t.names.push_back(expect_name());
    }
    if (parens) expect_op(")");
    if (tuple) {
      t.kind = Target::K::Tuple;
    } else {
      t.kind = Target::K::Name;
      t.name = first;
    }
    return t;
  }

  // --- expressions ---------------------------------------------------------------------

  bool is_tuple_end(const std::vector<std::string>& extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::End || is_op(")")) return true;
    for (const auto& e : extra)
      if (cur().type == Tok::Name && cur().text == e) return true;
    return false;
  }

  // a, b, c -> tuple; a single expression stays itself.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, const std::vector<std::string>& extra_end) {
    int l = line();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(std::string("Expected an expression, got '") + token_description(cur()) + "'");
    }
    auto t = std::make_unique<ListExpr>(true, l);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    Nest nest(*this);
    int l = line();
    auto e = parse_or();
    while (skip_name("if")) {
      auto cond = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) otherwise = parse_condexpr();
      e = std::make_unique<CondExpr>(std::move(cond), std::move(e), std::move(otherwise), l);
    }
    return e;
  }

  ExprPtr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(BinaryExpr::Op::Or, std::move(e), parse_and(), l);
    }
    return e;
  }

  ExprPtr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(BinaryExpr::Op::And, std::move(e), parse_not(), l);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      int l = line();
      next();
      return std::make_unique<UnaryExpr>(UnaryExpr::Op::Not, parse_not(), l);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int l = line();
    auto first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CmpOp op;
      if (is_op("==")) op = CmpOp::Eq;
      else if (is_op("!=")) op = CmpOp::Ne;
      else if (is_op("<")) op = CmpOp::Lt;
      else if (is_op("<=")) op = CmpOp::Le;
      else if (is_op(">")) op = CmpOp::Gt;
      else if (is_op(">=")) op = CmpOp::Ge;
      else if (is_name("in")) op = CmpOp::In;
      else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        op = CmpOp::NotIn;
      } else {
        break;
      }
      next();
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(first), l);
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto op = is_op("+") ? BinaryExpr::Op::Add : BinaryExpr::Op::Sub;
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(op, std::move(e), parse_concat(), l);
    }
    return e;
  }

  ExprPtr parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) {
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(BinaryExpr::Op::Concat, std::move(e), parse_math2(), l);
    }
    return e;
  }

  ExprPtr parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto op = is_op("*") ? BinaryExpr::Op::Mul : is_op("/") ? BinaryExpr::Op::Div
              : is_op("//") ? BinaryExpr::Op::FloorDiv : BinaryExpr::Op::Mod;
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(op, std::move(e), parse_pow(), l);
    }
    return e;
  }

  ExprPtr parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) {
      int l = line();
      next();
      e = std::make_unique<BinaryExpr>(BinaryExpr::Op::Pow, std::move(e), parse_unary(true), l);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    int l = line();
    ExprPtr e;
    if (is_op("-")) {
      next();
      e = std::make_unique<UnaryExpr>(UnaryExpr::Op::Neg, parse_unary(false), l);
    } else if (is_op("+")) {
      next();
      e = std::make_unique<UnaryExpr>(UnaryExpr::Op::Pos, parse_unary(false), l);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int l = tk.line;
    switch (tk.type) {
      case Tok::Name: {
        std::string n = tk.text;
        next();
        if (n == "true" || n == "True") return std::make_unique<ConstExpr>(Value(true), l);
        if (n == "false" || n == "False") return std::make_unique<ConstExpr>(Value(false), l);
        if (n == "none" || n == "None") return std::make_unique<ConstExpr>(Value::none(), l);
        for (MacroDef* m : open_macros_) {
          if (n == "caller") m->uses_caller = true;
          if (n == "varargs") m->uses_varargs = true;
          if (n == "kwargs") m->uses_kwargs = true;
        }
        return std::make_unique<NameExpr>(std::move(n), l);
      }
      case Tok::String: {
        std::string s = tk.text;
        next();
        while (cur().type == Tok::String) {  // adjacent literals concatenate
          s += cur().text;
          next();
        }
        return std::make_unique<ConstExpr>(Value(std::move(s)), l);
      }
      case Tok::Int: {
        int64_t v = tk.ival;
        next();
        return std::make_unique<ConstExpr>(Value(v), l);
      }
      case Tok::Float: {
        double v = tk.fval;
        next();
        return std::make_unique<ConstExpr>(Value(v), l);
      }
      case Tok::Op:
        if (tk.text == "(") {
          next();
          auto e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          next();
          auto list = std::make_unique<ListExpr>(false, l);
          while (!is_op("]")) {
            if (!list->items.empty()) expect_op(",");
            if (is_op("]")) break;
            list->items.push_back(parse_expression(true));
          }
          expect_op("]");
          return list;
        }
        if (tk.text == "{") {
          next();
          auto dict = std::make_unique<DictExpr>(l);
          while (!is_op("}")) {
            if (!dict->items.empty()) expect_op(",");
            if (is_op("}")) break;
            auto k = parse_expression(true);
            expect_op(":");
            dict->items.emplace_back(std::move(k), parse_expression(true));
          }
          expect_op("}");
          return dict;
        }
        break;
      default: break;
    }
    fail(std::string("unexpected '") + token_description(tk) + "'");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int l = line();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          e = std::make_unique<AttrExpr>(std::move(e), cur().text, l);
          next();
        } else if (cur().type == Tok::Int) {  // x.0 is x[0]
          e = std::make_unique<ItemExpr>(std::move(e), std::make_unique<ConstExpr>(Value(cur().ival), l), l);
          next();
        } else {
          fail(std::string("expected name or number, got '") + token_description(cur()) + "'");
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), l);
        expect_op("]");
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int l) {
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) {
        if (is_op(",")) {  // x[a, b] indexes with a tuple
          auto t = std::make_unique<ListExpr>(true, l);
          t->items.push_back(std::move(start));
          while (skip_op(",")) {
            if (is_op("]")) break;
            t->items.push_back(parse_expression(true));
          }
          return std::make_unique<ItemExpr>(std::move(obj), std::move(t), l);
        }
        return std::make_unique<ItemExpr>(std::move(obj), std::move(start), l);
      }
    }
    auto s = std::make_unique<SliceExpr>(std::move(obj), l);
    s->start = std::move(start);
    expect_op(":");
    if (!is_op(":") && !is_op("]")) s->stop = parse_expression(true);
    if (skip_op(":") && !is_op("]")) s->step = parse_expression(true);
    return s;
  }

  void parse_call_args(Args& args) {
    expect_op("(");
    while (!is_op(")")) {
      if (!args.pos.empty() || !args.kw.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        args.kw.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.kw.empty()) fail("invalid syntax for function call expression (positional argument after a keyword argument)");
        args.pos.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = std::make_unique<CallExpr>(std::move(callee), line());
    parse_call_args(c->args);
    return c;
  }

  std::string parse_dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      n += "." + expect_name();
    }
    return n;
  }

  // `| f(args) | g` applied to base (null: the body of a filter block / set block).
  ExprPtr parse_filter_chain(ExprPtr base, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int l = line();
      auto f = std::make_unique<FilterExpr>(std::move(base), parse_dotted_name(), l);
      if (is_op("(")) parse_call_args(f->args);
      base = std::move(f);
    }
    return base;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e), false);
      } else if (is_name("is")) {
        int l = line();
        next();
        bool negated = skip_name("not");
        auto t = std::make_unique<TestExpr>(std::move(e), parse_dotted_name(), negated, l);
        if (is_op("(")) {
          parse_call_args(t->args);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("You cannot chain multiple tests with is");
          t->args.pos.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

std::unique_ptr<Program> parse(std::string_view source) { return Parser(lex(source)).run(); }

}  // namespace tessera::chat_template
