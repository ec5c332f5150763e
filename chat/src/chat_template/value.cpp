#include "value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "utf8.h"

namespace tessera::chat_template {

namespace {
// Deeper than any real data; values built through namespaces can even be circular.
constexpr int kMaxValueDepth = 512;

void check_depth(int depth) {
  if (depth > kMaxValueDepth) throw_error("value nested too deeply (or circular)");
}

thread_local size_t g_text_limit = SIZE_MAX;

void check_text(const std::string& out) {
  if (out.size() > g_text_limit)
    throw_limit("a string would exceed the limit of " + std::to_string(g_text_limit) + " bytes");
}
}  // namespace

TextLimit::TextLimit(size_t bytes) : saved_(g_text_limit) { g_text_limit = bytes; }
TextLimit::~TextLimit() { g_text_limit = saved_; }

void throw_error(std::string message) { throw EvalError{ChatTemplateError::Kind::Runtime, std::move(message)}; }
void throw_limit(std::string message) { throw EvalError{ChatTemplateError::Kind::Limit, std::move(message)}; }

Value Value::list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(ListPtr(std::move(l)));
}

// --- Dict ---------------------------------------------------------------------------

const Value* Dict::find(std::string_view key) const {
  auto it = str_index_.find(std::string(key));
  return it == str_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_str()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : entries_)
    if (!k.is_str() && equal(k, key)) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  if (key.is_str()) {
    auto it = str_index_.find(key.str());
    if (it != str_index_.end()) {
      entries_[it->second].second = std::move(value);
      return;
    }
    str_index_.emplace(key.str(), entries_.size());
  } else {
    for (auto& [k, v] : entries_)
      if (!k.is_str() && equal(k, key)) {
        v = std::move(value);
        return;
      }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// --- Objects ------------------------------------------------------------------------

std::string Object::repr() const {
  std::string s = "<";  // (built step by step: GCC 12 warns falsely on "lit" + string temporaries)
  s += type_name();
  s += " object>";
  return s;
}

Value Object::getattr(Interp&, std::string_view name) {
  std::string msg = "'";
  msg += object_type_repr();
  msg += "' has no attribute '";
  msg += name;
  msg += "'";
  return Value::undefined(std::move(msg));
}

Value Object::call(Interp&, CallArgs&) {
  std::string msg = "'";
  msg += type_name();
  msg += "' object is not callable";
  throw_error(std::move(msg));
}

std::string Namespace::repr() const {
  // (the free repr() prints namespaces itself, tracking the depth of nesting)
  return chat_template::repr(Value(DictPtr(std::make_shared<Dict>(attrs_)))).insert(0, "<Namespace ") + ">";
}

Value Namespace::getattr(Interp& in, std::string_view name) {
  if (const Value* v = attrs_.find(name)) return *v;
  return Object::getattr(in, name);
}

// --- str / repr ---------------------------------------------------------------------

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);  // shortest round trip
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponent notation outside this range
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
      size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return out;
}

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t c = next_code_point(s, i);
    if (c == static_cast<uint32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!py_isprintable(c)) {
      char b[16];
      if (c < 0x100)
        std::snprintf(b, sizeof b, "\\x%02x", c);
      else if (c < 0x10000)
        std::snprintf(b, sizeof b, "\\u%04x", c);
      else
        std::snprintf(b, sizeof b, "\\U%08x", c);
      out += b;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += q;
  return out;
}

namespace {

void repr_into(const Value& v, std::string& out, int depth);

void seq_repr(const List& l, std::string& out, int depth) {
  out += l.tuple ? '(' : '[';
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (i) out += ", ";
    repr_into(l.items[i], out, depth + 1);
  }
  if (l.tuple && l.items.size() == 1) out += ',';
  out += l.tuple ? ')' : ']';
}

void dict_repr(const Dict& d, std::string& out, int depth) {
  out += '{';
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    repr_into(k, out, depth + 1);
    out += ": ";
    repr_into(v, out, depth + 1);
  }
  out += '}';
}

void repr_into(const Value& v, std::string& out, int depth) {
  check_depth(depth);
  check_text(out);
  switch (v.type()) {
    case Value::T::Undefined: out += "Undefined"; break;
    case Value::T::Str:
      if (v.is_safe()) {
        out += "Markup(" + py_str_repr(v.str()) + ")";
      } else {
        out += py_str_repr(v.str());
      }
      break;
    case Value::T::List: seq_repr(v.as_list(), out, depth); break;
    case Value::T::Dict: dict_repr(v.as_dict(), out, depth); break;
    case Value::T::Object:
      if (const auto* ns = dynamic_cast<const Namespace*>(v.as_object().get())) {  // may hold itself
        out += "<Namespace ";
        dict_repr(ns->attrs(), out, depth + 1);
        out += '>';
      } else {
        out += v.as_object()->repr();
      }
      break;
    default: out += to_str(v);
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Value::T::Undefined: return "";
    case Value::T::None: return "None";
    case Value::T::Bool: return v.as_bool() ? "True" : "False";
    case Value::T::Int: return std::to_string(v.as_int());
    case Value::T::Float: return py_float_repr(v.as_float());
    case Value::T::Str: return v.str();
    case Value::T::List: {
      std::string s;
      seq_repr(v.as_list(), s, 0);
      return s;
    }
    case Value::T::Dict: {
      std::string s;
      dict_repr(v.as_dict(), s, 0);
      return s;
    }
    case Value::T::Object: return repr(v);
  }
  return "";
}

std::string repr(const Value& v) {
  std::string s;
  repr_into(v, s, 0);
  return s;
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::T::Undefined: return "Undefined";
    case Value::T::None: return "NoneType";
    case Value::T::Bool: return "bool";
    case Value::T::Int: return "int";
    case Value::T::Float: return "float";
    case Value::T::Str: return v.is_safe() ? "Markup" : "str";
    case Value::T::List: return v.as_list().tuple ? "tuple" : "list";
    case Value::T::Dict: return "dict";
    case Value::T::Object: return v.as_object()->type_name();
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_object()) return v.as_object()->object_type_repr();
  if (v.is_safe()) return "markupsafe.Markup object";
  return type_name(v) + " object";
}

std::string undefined_message(const Undefined& u) { return u.hint ? *u.hint : "value is undefined"; }

void fail_undefined(const Value& v) { throw_error(undefined_message(v.as_undefined())); }

// --- truth, equality, order ------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::T::Undefined:
    case Value::T::None: return false;
    case Value::T::Bool: return v.as_bool();
    case Value::T::Int: return v.as_int() != 0;
    case Value::T::Float: return v.as_float() != 0.0;
    case Value::T::Str: return !v.str().empty();
    case Value::T::List: return !v.as_list().items.empty();
    case Value::T::Dict: return v.as_dict().size() != 0;
    case Value::T::Object: return true;
  }
  return false;
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.int_value() == b.int_value();
    return a.number_value() == b.number_value();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::T::Undefined:
    case Value::T::None: return true;
    case Value::T::Str: return a.str() == b.str();
    case Value::T::List: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal_at(x.items[i], y.items[i], depth + 1)) return false;
      return true;
    }
    case Value::T::Dict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* w = y.find(k);
        if (!w || !equal_at(v, *w, depth + 1)) return false;
      }
      return true;
    }
    case Value::T::Object: return a.as_object() == b.as_object();
    default: return false;
  }
}

int compare_at(const Value& a, const Value& b, const char* op, int depth) {
  check_depth(depth);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.int_value(), y = b.int_value();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.number_value(), y = b.number_value();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal_at(x[i], y[i], depth + 1)) continue;
      return compare_at(x[i], y[i], op, depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
              type_name(b) + "'");
}

}  // namespace

bool equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }
int compare(const Value& a, const Value& b, const char* op) { return compare_at(a, b, op, 0); }

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::T::Undefined: return {};
    case Value::T::List: return v.as_list().items;
    case Value::T::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().size());
      for (const auto& e : v.as_dict().entries()) keys.push_back(e.first);
      return keys;
    }
    case Value::T::Str: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        next_code_point(s, i);
        chars.emplace_back(s.substr(start, i - start), v.is_safe());
      }
      return chars;
    }
    default: throw_error("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.type()) {
    case Value::T::Undefined: return 0;
    case Value::T::Str: return static_cast<int64_t>(code_point_count(v.str()));
    case Value::T::List: return static_cast<int64_t>(v.as_list().items.size());
    case Value::T::Dict: return static_cast<int64_t>(v.as_dict().size());
    default: throw_error("object of type '" + type_name(v) + "' has no len()");
  }
}

// --- JSON ---------------------------------------------------------------------------

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t c = next_code_point(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char b[16];
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", c);
      }
      out += b;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.type()) {
    case Value::T::Str: return k.str();
    case Value::T::Bool: return k.as_bool() ? "true" : "false";
    case Value::T::None: return "null";
    case Value::T::Int: return std::to_string(k.as_int());
    case Value::T::Float: return py_float_repr(k.as_float());
    default: throw_error("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void json_into(const Value& v, const JsonOptions& o, std::string& out, int level) {
  check_depth(level);
  check_text(out);
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  switch (v.type()) {
    case Value::T::None: out += "null"; return;
    case Value::T::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::T::Int: out += std::to_string(v.as_int()); return;
    case Value::T::Float: {
      double d = v.as_float();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
      return;
    }
    case Value::T::Str: json_string(v.str(), o.ensure_ascii, out); return;
    case Value::T::List: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.indent) newline(level + 1);
        json_into(items[i], o, out, level + 1);
      }
      if (o.indent) newline(level);
      out += ']';
      return;
    }
    case Value::T::Dict: {
      const Dict& d = v.as_dict();
      if (d.size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : d.entries()) entries.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return compare(a->first, b->first) < 0; });
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += o.item_sep;
        first = false;
        if (o.indent) newline(level + 1);
        json_string(json_key(e->first), o.ensure_ascii, out);
        out += o.key_sep;
        json_into(e->second, o, out, level + 1);
      }
      if (o.indent) newline(level);
      out += '}';
      return;
    }
    default: throw_error("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) throw_error("variables nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(Value(it.key()), from_json_at(it.value(), depth + 1));
      return Value(DictPtr(std::move(d)));
    }
    default: throw_error("unsupported JSON value (binary) in the variables");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& o) {
  std::string out;
  json_into(v, o, out, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

}  // namespace tessera::chat_template
