// Values of the template language, with Python's semantics where templates can see
// them: str() and repr() spelling (True, None, ['a', 1]), equality across int/float/bool,
// truthiness, ordering, and json.dumps for tojson. Jinja2's Undefined is a value too:
// printing it gives "", using it in arithmetic or taking its attribute is an error.
//
// Lists and dicts are immutable once built (the sandbox Hugging Face uses forbids
// append/update), so they are shared by pointer; only namespaces change in place.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/chat_template.h"

namespace tessera::chat_template {

class Interp;
class Value;
struct List;
class Dict;
class Object;
struct CallArgs;

// What the interpreter throws below the statement level; it becomes a ChatTemplateError
// with the line of the node being evaluated.
struct EvalError {
  ChatTemplateError::Kind kind;
  std::string message;
};
[[noreturn]] void throw_error(std::string message);  // Kind::Runtime
[[noreturn]] void throw_limit(std::string message);  // Kind::Limit

struct Undefined {
  std::shared_ptr<const std::string> hint;  // the message raised when it is used
};
struct Str {
  std::shared_ptr<const std::string> s;
  bool safe = false;  // markupsafe.Markup (from |safe): `+` escapes the other operand
};
using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;
using ObjPtr = std::shared_ptr<Object>;

class Value {
 public:
  enum class T : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Object };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::make_shared<const std::string>(std::move(hint))}); }
  static Value none() { return Value(nullptr); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s, bool safe = false) : v_(Str{std::make_shared<const std::string>(std::move(s)), safe}) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(Str s) : v_(std::move(s)) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(ObjPtr o) : v_(std::move(o)) {}
  static Value list(std::vector<Value> items, bool tuple = false);

  T type() const { return static_cast<T>(v_.index()); }
  bool is_undefined() const { return type() == T::Undefined; }
  bool is_none() const { return type() == T::None; }
  bool is_bool() const { return type() == T::Bool; }
  bool is_int() const { return type() == T::Int; }
  bool is_float() const { return type() == T::Float; }
  bool is_number() const { return type() == T::Int || type() == T::Float || type() == T::Bool; }
  bool is_str() const { return type() == T::Str; }
  bool is_list() const { return type() == T::List; }
  bool is_dict() const { return type() == T::Dict; }
  bool is_object() const { return type() == T::Object; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Int or Bool as an integer (Python's bool is an int).
  int64_t int_value() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  // Any number as a double.
  double number_value() const { return is_float() ? as_float() : static_cast<double>(int_value()); }
  const std::string& str() const { return *std::get<Str>(v_).s; }
  bool is_safe() const { return is_str() && std::get<Str>(v_).safe; }
  const Str& str_value() const { return std::get<Str>(v_); }
  const List& as_list() const { return *std::get<ListPtr>(v_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(v_); }
  const ObjPtr& as_object() const { return std::get<ObjPtr>(v_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(v_); }

 private:
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, Str, ListPtr, DictPtr, ObjPtr> v_;
};

struct List {
  std::vector<Value> items;
  bool tuple = false;  // only changes how it prints: (1, 2) rather than [1, 2]
};

// An insertion-ordered dict (Python's). String keys are indexed; other keys (rare in
// templates) are found by a scan with Python equality.
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // a new key goes last; an existing one keeps its place
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> str_index_;
};

// Arguments of a call: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Namespaces, loop objects and everything callable.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;         // Python's class name, for messages
  virtual std::string object_type_repr() const = 0;  // as Jinja2 names it in "... has no attribute"
  virtual std::string repr() const;
  virtual Value getattr(Interp& in, std::string_view name);
  virtual bool callable() const { return false; }
  virtual Value call(Interp& in, CallArgs& args);
};

// jinja2.utils.Namespace: the one mutable object ({% set ns.x = ... %}).
class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string object_type_repr() const override { return "jinja2.utils.Namespace object"; }
  std::string repr() const override;
  Value getattr(Interp& in, std::string_view name) override;
  void set(const std::string& name, Value v) { attrs_.set(Value(name), std::move(v)); }
  void clear() { attrs_ = Dict(); }
  const Dict& attrs() const { return attrs_; }

 private:
  Dict attrs_;
};

// --- Python semantics -------------------------------------------------------------
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); Undefined -> ""
std::string repr(const Value& v);    // repr(v)
std::string py_str_repr(std::string_view s);
std::string py_float_repr(double d);
std::string type_name(const Value& v);          // 'int', 'str', 'NoneType', 'list' ...
std::string object_type_repr(const Value& v);   // 'dict object', 'None' ...
std::string undefined_message(const Undefined& u);
[[noreturn]] void fail_undefined(const Value& v);  // raises the undefined value's message
bool equal(const Value& a, const Value& b);
// -1/0/1 for a < b / == / >; throws Python's TypeError message when unorderable.
int compare(const Value& a, const Value& b, const char* op = "<");
// Items of a for loop / list(): list items, dict keys, string characters; Undefined is
// empty; anything else raises "'int' object is not iterable".
std::vector<Value> iterate(const Value& v);
// len(): code points of a string, items of a list or dict; Undefined has 0.
int64_t length(const Value& v);

// Python json.dumps(v, ensure_ascii=, indent=, separators=, sort_keys=).
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& o);

// The longest text str()/repr()/to_json may build on this thread (the interpreter sets
// it to max_output_bytes for the length of a render); past it they raise a Limit error.
class TextLimit {
 public:
  explicit TextLimit(size_t bytes);
  ~TextLimit();

 private:
  size_t saved_;
};

// Variables from JSON (objects keep their order).
Value from_json(const nlohmann::ordered_json& j);

}  // namespace tessera::chat_template
