// Built-ins: Jinja2's filters and tests (plus Hugging Face's tojson), the global
// functions templates call, and the methods of str, list and dict values.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "value.h"

namespace tessera::chat_template {

using FilterFn = Value (*)(Interp& in, const Value& v, CallArgs& args);
using TestFn = bool (*)(Interp& in, const Value& v, CallArgs& args);

FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// range, namespace, dict, raise_exception, strftime_now, joiner.
std::optional<Value> find_global(std::string_view name);
// A method of a str, list or dict value, bound to it. The sandbox's forbidden mutators
// (list.append, dict.update ...) come back as an undefined value that raises
// "access to attribute 'append' of 'list' object is unsafe." when used.
std::optional<Value> find_method(const Value& v, std::string_view name);

// A built-in function or bound method as a callable value.
class Function : public Object {
 public:
  using Fn = Value (*)(Interp& in, const Value& self, CallArgs& args);
  Function(std::string name, Fn fn, Value self = Value(), bool method = false)
      : name_(std::move(name)), fn_(fn), self_(std::move(self)), method_(method) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string object_type_repr() const override { return "builtin_function_or_method object"; }
  std::string repr() const override {
    return method_ ? "<built-in method " + name_ + " of " + chat_template::type_name(self_) + " object>"
                   : "<built-in function " + name_ + ">";
  }
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override { return fn_(in, self_, args); }

 private:
  std::string name_;
  Fn fn_;
  Value self_;
  bool method_;
};

// Binds call arguments to a Python-style parameter list and raises Python's messages
// for extra, unknown or repeated arguments.
class Bind {
 public:
  Bind(std::string_view fn, const CallArgs& args, std::initializer_list<const char*> params);
  bool has(size_t i) const { return slots_[i] != nullptr; }
  const Value& operator[](size_t i) const;  // an undefined value when not given
  Value get(size_t i, Value fallback) const { return has(i) ? *slots_[i] : std::move(fallback); }
  // An optional parameter given as None counts as missing.
  bool given(size_t i) const { return has(i) && !slots_[i]->is_none(); }

 private:
  std::vector<const Value*> slots_;
};

// Python's int()/str conversions used by several built-ins.
int64_t require_int(const Value& v, std::string_view what);
std::string require_str(const Value& v, std::string_view what);

}  // namespace tessera::chat_template
