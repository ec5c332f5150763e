// The interpreter: walks the parsed template with Jinja2's scoping rules and counts
// what it does against the render limits.
//
// Scoping, as in Jinja2: `if` shares its scope; each for-loop iteration, macro call,
// {% set %} block, {% filter %} and {% with %} get a child scope, so a plain
// {% set %} inside a loop is gone at the next iteration (namespaces exist to carry
// values out). Names resolve through the scope chain, then the render variables, then
// the globals (range, namespace, dict, raise_exception, strftime_now, joiner).
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ast.h"
#include "value.h"

namespace tessera::chat_template {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interp;

// A macro (or the `caller` of a call block): its definition and the scope it was
// defined in, which its body sees (a closure, as Jinja2's macros are).
class Macro : public Object {
 public:
  Macro(const MacroDef* def, ScopePtr closure) : def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string object_type_repr() const override { return "jinja2.runtime.Macro object"; }
  std::string repr() const override { return "<Macro '" + def_->name + "'>"; }
  Value getattr(Interp& in, std::string_view name) override;
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override;
  const MacroDef* def() const { return def_; }
  const ScopePtr& closure() const { return closure_; }

 private:
  const MacroDef* def_;
  ScopePtr closure_;
};

// The `loop` variable of a for loop.
class LoopObj : public Object, public std::enable_shared_from_this<LoopObj> {
 public:
  LoopObj(std::shared_ptr<const std::vector<Value>> items, int depth, const ForStmt* stmt, ScopePtr scope)
      : items_(std::move(items)), depth_(depth), stmt_(stmt), scope_(std::move(scope)) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string object_type_repr() const override { return "jinja2.runtime.LoopContext object"; }
  std::string repr() const override;
  Value getattr(Interp& in, std::string_view name) override;
  bool callable() const override { return stmt_->recursive; }
  Value call(Interp& in, CallArgs& args) override;  // loop(children) in a recursive loop
  void set_index(size_t i) { index_ = i; }
  Value changed(const Value& v);

 private:
  std::shared_ptr<const std::vector<Value>> items_;
  size_t index_ = 0;
  int depth_;
  const ForStmt* stmt_;
  ScopePtr scope_;
  bool has_last_ = false;
  Value last_changed_;
};

class Interp {
 public:
  Interp(const Program& program, const nlohmann::ordered_json& variables, const RenderOptions& options);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render();

  // --- services for built-ins ---------------------------------------------------------
  const RenderOptions& options() const { return opt_; }
  // Counts work against max_steps (statements, iterations, calls, items processed).
  void charge(uint64_t steps);
  // Refuses a string about to exceed max_output_bytes, or a list of more than
  // max_output_bytes / 32 items.
  void check_size(size_t size) const;
  void check_items(size_t n) const;
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& v, CallArgs& args);
  bool apply_test(const std::string& name, const Value& v, CallArgs& args);
  Value getattr(const Value& obj, std::string_view name);  // obj.name: attribute, then item
  Value getitem(const Value& obj, const Value& key);       // obj[key]: item, then attribute
  std::shared_ptr<Namespace> new_namespace();
  std::tm now() const;

  // --- used by Macro and LoopObj ------------------------------------------------------
  Value call_macro(const Macro& m, CallArgs& args);
  Value run_recursive_loop(const ForStmt& s, const ScopePtr& scope, const Value& iterable, int depth);

 private:
  enum class Flow { Normal, Break, Continue };

  const Program& program_;
  RenderOptions opt_;
  Value vars_;  // the render variables (a dict)
  ScopePtr root_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;  // nested eval/exec frames
  int line_ = 0;  // line of the node being evaluated, for error messages
  // Scopes that hold macros and the namespaces created: cleared at the end of a render
  // so that macro<->scope and namespace cycles do not leak.
  std::vector<std::weak_ptr<Scope>> macro_scopes_;
  std::vector<std::weak_ptr<Namespace>> namespaces_;

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const ForStmt& s, const ScopePtr& scope, std::string& out, const Value& iterable, int depth);
  void assign(const Target& t, Value v, const ScopePtr& scope);
  Value apply_filter_chain(const Expr& chain, const Value& input, const ScopePtr& scope);
  void emit(std::string& out, std::string_view text);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value lookup(const std::string& name, const ScopePtr& scope);
  CallArgs eval_args(const Args& a, const ScopePtr& scope);
  Value eval_binary(const BinaryExpr& e, const ScopePtr& scope);
  Value eval_compare(const CompareExpr& e, const ScopePtr& scope);
  Value eval_slice(const SliceExpr& e, const ScopePtr& scope);
};

}  // namespace tessera::chat_template
