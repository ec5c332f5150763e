#include "interp.h"

#include <ctime>
#include <new>
#include <stdexcept>

#include "builtins.h"
#include "operators.h"

namespace tessera::chat_template {

namespace {
// Nested evaluation (expressions, statements, macro bodies) beyond this would risk the
// C++ stack; templates never come close.
constexpr int kMaxEvalDepth = 1000;
}  // namespace

struct DepthGuard {
  DepthGuard(int& d, int limit, const char* what) : d_(d) {
    if (++d_ > limit) {
      --d_;
      throw_limit(std::string(what));
    }
  }
  ~DepthGuard() { --d_; }
  int& d_;
};

// --- Macro and loop objects ------------------------------------------------------------

Value Macro::getattr(Interp& in, std::string_view name) {
  if (name == "name") return Value(def_->name);
  return Object::getattr(in, name);
}

Value Macro::call(Interp& in, CallArgs& args) { return in.call_macro(*this, args); }

std::string LoopObj::repr() const {
  return "<LoopContext " + std::to_string(index_ + 1) + "/" + std::to_string(items_->size()) + ">";
}

Value LoopObj::changed(const Value& v) {
  if (has_last_ && equal(v, last_changed_)) return Value(false);
  has_last_ = true;
  last_changed_ = v;
  return Value(true);
}

namespace {
class LoopMethod : public Object {
 public:
  LoopMethod(std::shared_ptr<LoopObj> loop, bool cycle, size_t index) : loop_(std::move(loop)), cycle_(cycle), index_(index) {}
  std::string type_name() const override { return "method"; }
  std::string object_type_repr() const override { return "method object"; }
  bool callable() const override { return true; }
  Value call(Interp&, CallArgs& args) override {
    if (cycle_) {
      if (args.pos.empty()) throw_error("no items for cycling given");
      return args.pos[index_ % args.pos.size()];
    }
    return loop_->changed(Value::list(args.pos, true));
  }

 private:
  std::shared_ptr<LoopObj> loop_;
  bool cycle_;
  size_t index_;
};
}  // namespace

Value LoopObj::getattr(Interp& in, std::string_view name) {
  const int64_t n = static_cast<int64_t>(items_->size());
  const int64_t i = static_cast<int64_t>(index_);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(static_cast<int64_t>(depth_));
  if (name == "depth0") return Value(static_cast<int64_t>(depth_ - 1));
  if (name == "previtem") return i > 0 ? (*items_)[index_ - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? (*items_)[index_ + 1] : Value::undefined("there is no next item");
  if (name == "cycle" || name == "changed") {
    auto self = shared_from_this();
    return Value(ObjPtr(std::make_shared<LoopMethod>(self, name == "cycle", index_)));
  }
  return Object::getattr(in, name);
}

Value LoopObj::call(Interp& in, CallArgs& args) {
  if (!stmt_->recursive)
    throw_error("The loop must have the 'recursive' marker to be called recursively.");
  if (args.pos.size() != 1 || !args.kw.empty()) throw_error("loop() takes exactly one argument (the items to loop over)");
  return in.run_recursive_loop(*stmt_, scope_, args.pos[0], depth_ + 1);
}

// --- Interp -------------------------------------------------------------------------------

Interp::Interp(const Program& program, const nlohmann::ordered_json& variables, const RenderOptions& options)
    : program_(program), opt_(options), root_(std::make_shared<Scope>()) {
  if (!variables.is_object() && !variables.is_null())
    throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "the template variables must be a JSON object", 0);
  try {
    vars_ = variables.is_null() ? Value(DictPtr(std::make_shared<Dict>())) : from_json(variables);
  } catch (const EvalError& e) {
    throw ChatTemplateError(e.kind, e.message, 0);
  }
}

Interp::~Interp() {
  // Break the cycles a render can build (a scope holding a macro that holds the scope;
  // namespaces holding themselves) so that everything is freed.
  for (auto& w : macro_scopes_)
    if (auto s = w.lock()) s->vars.clear();
  for (auto& w : namespaces_)
    if (auto n = w.lock()) n->clear();
  root_->vars.clear();
}

std::string Interp::render() {
  std::string out;
  TextLimit text_limit(opt_.max_output_bytes);
  try {
    exec_body(program_.body, root_, out);
  } catch (const EvalError& e) {
    throw ChatTemplateError(e.kind, e.message, line_);
  } catch (const std::bad_alloc&) {
    throw ChatTemplateError(ChatTemplateError::Kind::Limit, "out of memory", line_);
  } catch (const std::length_error&) {
    throw ChatTemplateError(ChatTemplateError::Kind::Limit, "string or list too large", line_);
  }
  return out;
}

void Interp::charge(uint64_t steps) {
  steps_ += steps;
  if (steps_ > opt_.max_steps)
    throw_limit("the template ran more than " + std::to_string(opt_.max_steps) +
                " steps (statements, loop iterations, calls, items processed)");
}

void Interp::check_size(size_t size) const {
  if (size > opt_.max_output_bytes)
    throw_limit("a string would exceed the limit of " + std::to_string(opt_.max_output_bytes) + " bytes");
}

void Interp::check_items(size_t n) const {
  // An item costs about 32 bytes: lists are held to the same memory as strings.
  if (n > opt_.max_output_bytes / 32)
    throw_limit("a list would exceed the limit of " + std::to_string(opt_.max_output_bytes / 32) + " items");
}

void Interp::emit(std::string& out, std::string_view text) {
  if (out.size() + text.size() > opt_.max_output_bytes)
    throw_limit("the output would exceed the limit of " + std::to_string(opt_.max_output_bytes) + " bytes");
  charge(text.size() / 256);
  out.append(text);
}

std::shared_ptr<Namespace> Interp::new_namespace() {
  auto ns = std::make_shared<Namespace>();
  namespaces_.push_back(ns);
  return ns;
}

std::tm Interp::now() const {
  std::tm out{};
  if (opt_.now) {
    std::tm t = *opt_.now;
    t.tm_isdst = 0;
    std::time_t tt = timegm(&t);  // normalises the fields and derives the weekday
    gmtime_r(&tt, &out);
  } else {
    std::time_t tt = std::time(nullptr);
    localtime_r(&tt, &out);
  }
  return out;
}

// --- statements ---------------------------------------------------------------------------

Interp::Flow Interp::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  DepthGuard guard(depth_, kMaxEvalDepth, "the template nests too deeply at run time");
  charge(1);
  line_ = s.line;
  switch (s.kind) {
    case Stmt::K::Text: emit(out, static_cast<const TextStmt&>(s).text); return Flow::Normal;
    case Stmt::K::Print: {
      Value v = eval(*static_cast<const PrintStmt&>(s).expr, scope);
      line_ = s.line;
      if (v.is_str()) {
        emit(out, v.str());
      } else {
        emit(out, to_str(v));
      }
      return Flow::Normal;
    }
    case Stmt::K::If: {
      const auto& st = static_cast<const IfStmt&>(s);
      for (const auto& [cond, body] : st.branches)
        if (truthy(eval(*cond, scope))) return exec_body(body, scope, out);
      return exec_body(st.otherwise, scope, out);
    }
    case Stmt::K::For: {
      const auto& st = static_cast<const ForStmt&>(s);
      Value it = eval(*st.iter, scope);
      line_ = s.line;
      return exec_for(st, scope, out, it, 1);
    }
    case Stmt::K::Set: {
      const auto& st = static_cast<const SetStmt&>(s);
      Value v = eval(*st.value, scope);
      line_ = s.line;
      assign(st.target, std::move(v), scope);
      return Flow::Normal;
    }
    case Stmt::K::SetBlock: {
      const auto& st = static_cast<const SetBlockStmt&>(s);
      auto child = std::make_shared<Scope>();
      child->parent = scope;
      std::string buf;
      exec_body(st.body, child, buf);
      Value v(std::move(buf));
      if (st.filter) v = apply_filter_chain(*st.filter, v, scope);
      line_ = s.line;
      assign(st.target, std::move(v), scope);
      return Flow::Normal;
    }
    case Stmt::K::Macro: {
      const auto& st = static_cast<const MacroStmt&>(s);
      scope->vars[st.def.name] = Value(ObjPtr(std::make_shared<Macro>(&st.def, scope)));
      macro_scopes_.push_back(scope);
      return Flow::Normal;
    }
    case Stmt::K::CallBlock: {
      const auto& st = static_cast<const CallBlockStmt&>(s);
      const auto& call = static_cast<const CallExpr&>(*st.call);
      Value callee = eval(*call.callee, scope);
      CallArgs args = eval_args(call.args, scope);
      args.kw.emplace_back("caller", Value(ObjPtr(std::make_shared<Macro>(&st.caller, scope))));
      macro_scopes_.push_back(scope);
      line_ = s.line;
      Value r = this->call(callee, args);
      emit(out, to_str(r));
      return Flow::Normal;
    }
    case Stmt::K::FilterBlock: {
      const auto& st = static_cast<const FilterBlockStmt&>(s);
      auto child = std::make_shared<Scope>();
      child->parent = scope;
      std::string buf;
      exec_body(st.body, child, buf);
      Value v = apply_filter_chain(*st.filter, Value(std::move(buf)), scope);
      emit(out, to_str(v));
      return Flow::Normal;
    }
    case Stmt::K::With: {
      const auto& st = static_cast<const WithStmt&>(s);
      auto child = std::make_shared<Scope>();
      child->parent = scope;
      for (const auto& [target, expr] : st.assigns) {
        Value v = eval(*expr, scope);  // values see the outer scope, as in Jinja2
        assign(target, std::move(v), child);
      }
      return exec_body(st.body, child, out);
    }
    case Stmt::K::Break: return Flow::Break;
    case Stmt::K::Continue: return Flow::Continue;
    case Stmt::K::Generation: {
      auto child = std::make_shared<Scope>();
      child->parent = scope;
      return exec_body(static_cast<const GenerationStmt&>(s).body, child, out);
    }
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec_for(const ForStmt& s, const ScopePtr& scope, std::string& out, const Value& iterable, int depth) {
  std::vector<Value> items = iterate(iterable);
  if (s.filter) {  // `for x in xs if cond`: loop.length and loop.index count the kept items
    std::vector<Value> kept;
    for (Value& item : items) {
      charge(1);
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(s.target, item, probe);
      if (truthy(eval(*s.filter, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
  auto loop = std::make_shared<LoopObj>(shared, depth, &s, s.recursive ? scope : nullptr);
  Value loop_value{ObjPtr(loop)};
  for (size_t i = 0; i < shared->size(); ++i) {
    charge(1);
    auto iter_scope = std::make_shared<Scope>();
    iter_scope->parent = scope;
    line_ = s.line;
    assign(s.target, (*shared)[i], iter_scope);
    iter_scope->vars["loop"] = loop_value;
    loop->set_index(i);
    if (exec_body(s.body, iter_scope, out) == Flow::Break) break;
  }
  if (shared->empty() && !s.otherwise.empty()) {
    auto child = std::make_shared<Scope>();
    child->parent = scope;
    return exec_body(s.otherwise, child, out);  // a break here belongs to an outer loop
  }
  return Flow::Normal;
}

Value Interp::run_recursive_loop(const ForStmt& s, const ScopePtr& scope, const Value& iterable, int depth) {
  DepthGuard guard(call_depth_, opt_.max_call_depth,
                   ("recursive loop deeper than " + std::to_string(opt_.max_call_depth) + " levels").c_str());
  std::string buf;
  int saved = line_;
  exec_for(s, scope, buf, iterable, depth);
  line_ = saved;
  return Value(std::move(buf));
}

void Interp::assign(const Target& t, Value v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::K::Name: scope->vars[t.name] = std::move(v); return;
    case Target::K::Attr: {
      Value ns = lookup(t.name, scope);
      auto* obj = ns.is_object() ? dynamic_cast<Namespace*>(ns.as_object().get()) : nullptr;
      if (!obj) throw_error("cannot assign attribute on non-namespace object");
      obj->set(t.attr, std::move(v));
      return;
    }
    case Target::K::Tuple: {
      std::vector<Value> items = iterate(v);
      if (items.size() > t.names.size())
        throw_error("too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
      if (items.size() < t.names.size())
        throw_error("not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                    std::to_string(items.size()) + ")");
      for (size_t i = 0; i < items.size(); ++i) scope->vars[t.names[i]] = std::move(items[i]);
      return;
    }
  }
}

Value Interp::apply_filter_chain(const Expr& chain, const Value& input, const ScopePtr& scope) {
  const auto& f = static_cast<const FilterExpr&>(chain);
  Value base = f.base ? apply_filter_chain(*f.base, input, scope) : input;
  CallArgs args = eval_args(f.args, scope);
  line_ = f.line;
  return apply_filter(f.name, base, args);
}

// --- calls --------------------------------------------------------------------------------

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.is_object() && callee.as_object()->callable()) return callee.as_object()->call(*this, args);
  throw_error("'" + type_name(callee) + "' object is not callable");
}

Value Interp::call_macro(const Macro& m, CallArgs& args) {
  DepthGuard guard(call_depth_, opt_.max_call_depth,
                   ("macro calls nested deeper than " + std::to_string(opt_.max_call_depth) + " levels").c_str());
  charge(1);
  const MacroDef& d = *m.def();
  auto sc = std::make_shared<Scope>();
  sc->parent = m.closure();
  std::vector<bool> given(d.params.size(), false);
  std::vector<Value> extra_pos;
  for (size_t i = 0; i < args.pos.size(); ++i) {
    if (i < d.params.size()) {
      sc->vars[d.params[i].name] = args.pos[i];
      given[i] = true;
    } else {
      extra_pos.push_back(args.pos[i]);
    }
  }
  if (!extra_pos.empty() && !d.uses_varargs)
    throw_error("macro '" + d.name + "' takes not more than " + std::to_string(d.params.size()) + " argument(s)");
  auto extra_kw = std::make_shared<Dict>();
  bool caller_given = false;
  for (auto& [key, value] : args.kw) {
    size_t i = 0;
    while (i < d.params.size() && d.params[i].name != key) ++i;
    if (i < d.params.size()) {
      if (given[i]) throw_error("macro '" + d.name + "' got multiple values for argument '" + key + "'");
      sc->vars[key] = value;
      given[i] = true;
    } else if (key == "caller" && d.uses_caller) {
      sc->vars["caller"] = value;
      caller_given = true;
    } else if (d.uses_kwargs) {
      extra_kw->set(Value(key), value);
    } else {
      throw_error("macro '" + d.name + "' takes no keyword argument '" + key + "'");
    }
  }
  if (d.uses_varargs) sc->vars["varargs"] = Value::list(std::move(extra_pos), true);
  if (d.uses_kwargs) sc->vars["kwargs"] = Value(DictPtr(std::move(extra_kw)));
  if (d.uses_caller && !caller_given) sc->vars["caller"] = Value::undefined("No caller defined");
  for (size_t i = 0; i < d.params.size(); ++i) {
    if (given[i]) continue;
    const Param& p = d.params[i];
    sc->vars[p.name] = p.default_value ? eval(*p.default_value, sc)
                                       : Value::undefined("parameter '" + p.name + "' was not provided");
  }
  std::string buf;
  int saved = line_;
  exec_body(d.body, sc, buf);
  line_ = saved;
  return Value(std::move(buf));
}

Value Interp::apply_filter(const std::string& name, const Value& v, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (!fn) throw_error("No filter named '" + name + "'.");
  charge(1);
  return fn(*this, v, args);
}

bool Interp::apply_test(const std::string& name, const Value& v, CallArgs& args) {
  TestFn fn = find_test(name);
  if (!fn) throw_error("No test named '" + name + "'.");
  charge(1);
  return fn(*this, v, args);
}

// --- attribute and item access ---------------------------------------------------------------

Value Interp::getattr(const Value& obj, std::string_view name) {
  switch (obj.type()) {
    case Value::T::Undefined: fail_undefined(obj);
    case Value::T::Object: return obj.as_object()->getattr(*this, name);
    default: break;
  }
  if (auto m = find_method(obj, name)) return *m;
  if (obj.is_dict())
    if (const Value* v = obj.as_dict().find(name)) return *v;
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + std::string(name) + "'");
}

Value Interp::getitem(const Value& obj, const Value& key) {
  auto missing = [&]() {
    if (key.is_str())
      return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + key.str() + "'");
    return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
  };
  switch (obj.type()) {
    case Value::T::Undefined: fail_undefined(obj);
    case Value::T::Dict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Value::T::List:
    case Value::T::Str:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.int_value();
        if (obj.is_list()) {
          const auto& items = obj.as_list().items;
          int64_t n = static_cast<int64_t>(items.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return missing();
          return items[static_cast<size_t>(i)];
        }
        Value s = slice(*this, obj, Value(i), i == -1 ? Value::none() : Value(i + 1), Value::none());
        if (s.str().empty()) return missing();
        return s;
      }
      break;
    case Value::T::Object:
      if (key.is_str()) return obj.as_object()->getattr(*this, key.str());
      return missing();
    default: break;
  }
  if (key.is_str())
    if (auto m = find_method(obj, key.str())) return *m;
  return missing();
}

// --- expressions ----------------------------------------------------------------------------

Value Interp::lookup(const std::string& name, const ScopePtr& scope) {
  for (const Scope* s = scope.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* v = vars_.as_dict().find(std::string_view(name))) return *v;
  if (auto g = find_global(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

CallArgs Interp::eval_args(const Args& a, const ScopePtr& scope) {
  CallArgs out;
  out.pos.reserve(a.pos.size());
  for (const auto& e : a.pos) out.pos.push_back(eval(*e, scope));
  for (const auto& [k, e] : a.kw) out.kw.emplace_back(k, eval(*e, scope));
  return out;
}

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(depth_, kMaxEvalDepth, "the template nests too deeply at run time");
  line_ = e.line;
  switch (e.kind) {
    case Expr::K::Const: return static_cast<const ConstExpr&>(e).value;
    case Expr::K::Name: return lookup(static_cast<const NameExpr&>(e).name, scope);
    case Expr::K::List: {
      const auto& x = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      items.reserve(x.items.size());
      for (const auto& i : x.items) items.push_back(eval(*i, scope));
      return Value::list(std::move(items), x.tuple);
    }
    case Expr::K::Dict: {
      const auto& x = static_cast<const DictExpr&>(e);
      auto d = std::make_shared<Dict>();
      for (const auto& [k, v] : x.items) {
        Value key = eval(*k, scope);
        if ((key.is_list() && !key.as_list().tuple) || key.is_dict()) {
          line_ = e.line;
          throw_error("unhashable type: '" + type_name(key) + "'");
        }
        d->set(std::move(key), eval(*v, scope));
      }
      return Value(DictPtr(std::move(d)));
    }
    case Expr::K::Attr: {
      const auto& x = static_cast<const AttrExpr&>(e);
      Value obj = eval(*x.obj, scope);
      line_ = e.line;
      return getattr(obj, x.name);
    }
    case Expr::K::Item: {
      const auto& x = static_cast<const ItemExpr&>(e);
      Value obj = eval(*x.obj, scope);
      Value key = eval(*x.index, scope);
      line_ = e.line;
      return getitem(obj, key);
    }
    case Expr::K::Slice: return eval_slice(static_cast<const SliceExpr&>(e), scope);
    case Expr::K::Call: {
      const auto& x = static_cast<const CallExpr&>(e);
      Value callee = eval(*x.callee, scope);
      CallArgs args = eval_args(x.args, scope);
      line_ = e.line;
      return call(callee, args);
    }
    case Expr::K::Filter: {
      const auto& x = static_cast<const FilterExpr&>(e);
      Value base = eval(*x.base, scope);
      CallArgs args = eval_args(x.args, scope);
      line_ = e.line;
      return apply_filter(x.name, base, args);
    }
    case Expr::K::Test: {
      const auto& x = static_cast<const TestExpr&>(e);
      Value base = eval(*x.base, scope);
      CallArgs args = eval_args(x.args, scope);
      line_ = e.line;
      bool r = apply_test(x.name, base, args);
      return Value(x.negated ? !r : r);
    }
    case Expr::K::Unary: {
      const auto& x = static_cast<const UnaryExpr&>(e);
      Value v = eval(*x.operand, scope);
      line_ = e.line;
      if (x.op == UnaryExpr::Op::Not) return Value(!truthy(v));
      return unary_op(x.op, v);
    }
    case Expr::K::Binary: return eval_binary(static_cast<const BinaryExpr&>(e), scope);
    case Expr::K::Compare: return eval_compare(static_cast<const CompareExpr&>(e), scope);
    case Expr::K::Cond: {
      const auto& x = static_cast<const CondExpr&>(e);
      if (truthy(eval(*x.cond, scope))) return eval(*x.then, scope);
      if (x.otherwise) return eval(*x.otherwise, scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

Value Interp::eval_binary(const BinaryExpr& e, const ScopePtr& scope) {
  Value l = eval(*e.left, scope);
  if (e.op == BinaryExpr::Op::And) return truthy(l) ? eval(*e.right, scope) : l;
  if (e.op == BinaryExpr::Op::Or) return truthy(l) ? l : eval(*e.right, scope);
  Value r = eval(*e.right, scope);
  line_ = e.line;
  return binary_op(*this, e.op, l, r);
}

Value Interp::eval_compare(const CompareExpr& e, const ScopePtr& scope) {
  Value left = eval(*e.first, scope);
  for (const auto& [op, expr] : e.rest) {
    Value right = eval(*expr, scope);
    line_ = e.line;
    bool ok;
    switch (op) {
      case CmpOp::Eq: ok = equal(left, right); break;
      case CmpOp::Ne: ok = !equal(left, right); break;
      case CmpOp::Lt: ok = compare(left, right, "<") < 0; break;
      case CmpOp::Le: ok = compare(left, right, "<=") <= 0; break;
      case CmpOp::Gt: ok = compare(left, right, ">") > 0; break;
      case CmpOp::Ge: ok = compare(left, right, ">=") >= 0; break;
      case CmpOp::In: ok = contains(right, left); break;
      case CmpOp::NotIn: ok = !contains(right, left); break;
      default: ok = false;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interp::eval_slice(const SliceExpr& e, const ScopePtr& scope) {
  Value obj = eval(*e.obj, scope);
  Value a = e.start ? eval(*e.start, scope) : Value::none();
  Value b = e.stop ? eval(*e.stop, scope) : Value::none();
  Value c = e.step ? eval(*e.step, scope) : Value::none();
  line_ = e.line;
  return slice(*this, obj, a, b, c);
}

}  // namespace tessera::chat_template
