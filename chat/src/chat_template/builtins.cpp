// Jinja2's built-in filters and tests, Hugging Face's tojson, and the globals.
#include "builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "interp.h"
#include "operators.h"
#include "pystr.h"
#include "utf8.h"

namespace tessera::chat_template {

// --- argument binding ---------------------------------------------------------------------

namespace {
const Value kMissing;
}

Bind::Bind(std::string_view fn, const CallArgs& args, std::initializer_list<const char*> params)
    : slots_(params.size(), nullptr) {
  std::vector<const char*> names(params);
  if (args.pos.size() > names.size())
    throw_error(std::string(fn) + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                std::to_string(args.pos.size()) + " given)");
  for (size_t i = 0; i < args.pos.size(); ++i) slots_[i] = &args.pos[i];
  for (const auto& [key, value] : args.kw) {
    size_t i = 0;
    while (i < names.size() && key != names[i]) ++i;
    if (i == names.size()) throw_error(std::string(fn) + "() got an unexpected keyword argument '" + key + "'");
    if (slots_[i]) throw_error(std::string(fn) + "() got multiple values for argument '" + key + "'");
    slots_[i] = &value;
  }
}

const Value& Bind::operator[](size_t i) const { return slots_[i] ? *slots_[i] : kMissing; }

int64_t require_int(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.int_value();
  if (v.is_undefined()) fail_undefined(v);
  throw_error(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
}

std::string require_str(const Value& v, std::string_view what) {
  if (v.is_str()) return v.str();
  if (v.is_undefined()) fail_undefined(v);
  throw_error(std::string(what) + " must be str, not " + type_name(v));
}

namespace {

Value str_result(std::string s, const Value& like) { return Value(std::move(s), like.is_safe()); }

// Jinja2's make_attrgetter: "a.b.0" looks up item a, then b, then 0.
Value get_attribute_path(Interp& in, Value v, const std::string& path) {
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = in.getitem(v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return v;
}

Value attribute_or_self(Interp& in, const Value& item, const Bind& b, size_t attr_index) {
  if (!b.given(attr_index)) return item;
  const Value& a = b[attr_index];
  if (a.is_int()) return in.getitem(item, a);
  return get_attribute_path(in, item, to_str(a));
}

Value ignore_case(const Value& v) { return v.is_str() ? Value(pystr::lower(v.str())) : v; }

std::vector<Value> items_of(Interp& in, const Value& v) {
  std::vector<Value> items = iterate(v);
  in.charge(items.size());
  return items;
}

// --- filters ------------------------------------------------------------------------------

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  Bind("abs", a, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    int64_t x = v.int_value();
    if (x == INT64_MIN) throw_error("integer overflow (integers are 64-bit here)");
    return Value(x < 0 ? -x : x);
  }
  if (v.is_undefined()) fail_undefined(v);
  throw_error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  Bind b("attr", a, {"name"});
  std::string name = to_str(b[0]);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_object()) return v.as_object()->getattr(in, name);
  if (auto m = find_method(v, name)) return *m;
  return Value::undefined("'" + object_type_repr(v) + "' has no attribute '" + name + "'");
}

Value f_batch(Interp& in, const Value& v, CallArgs& a) {
  Bind b("batch", a, {"linecount", "fill_with"});
  int64_t n = require_int(b[0], "batch");
  if (n <= 0) throw_error("batch: linecount must be positive");
  std::vector<Value> out, cur;
  for (const Value& item : items_of(in, v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (b.given(1))
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(b[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  Bind("capitalize", a, {});
  return str_result(pystr::capitalize(to_str(v)), v);
}

Value f_center(Interp&, const Value& v, CallArgs& a) {
  Bind b("center", a, {"width"});
  return str_result(pystr::pad(to_str(v), b.has(0) ? require_int(b[0], "center") : 80, " ", '^'), v);
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  Bind b("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (truthy(b[1]) && !truthy(v))) return b.get(0, Value(""));
  return v;
}

Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  Bind b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw_error("dictsort: can only sort a mapping, not " + type_name(v));
  std::string by = b.has(1) ? to_str(b[1]) : "key";
  if (by != "key" && by != "value") throw_error("You can only sort by either \"key\" or \"value\"");
  size_t pos = by == "key" ? 0 : 1;
  bool cs = truthy(b[0]), rev = truthy(b[2]);
  std::vector<std::pair<Value, Value>> entries = v.as_dict().entries();
  in.charge(entries.size() * 4);
  auto key = [&](const std::pair<Value, Value>& e) { return cs ? (pos ? e.second : e.first) : ignore_case(pos ? e.second : e.first); };
  std::stable_sort(entries.begin(), entries.end(), [&](const auto& x, const auto& y) {
    return rev ? compare(key(y), key(x)) < 0 : compare(key(x), key(y)) < 0;
  });
  std::vector<Value> out;
  for (auto& e : entries) out.push_back(Value::list({e.first, e.second}, true));
  return Value::list(std::move(out));
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  Bind("escape", a, {});
  if (v.is_safe()) return v;
  return Value(html_escape(to_str(v)), true);
}

Value f_forceescape(Interp&, const Value& v, CallArgs& a) {
  Bind("forceescape", a, {});
  return Value(html_escape(to_str(v)), true);
}

Value f_first(Interp& in, const Value& v, CallArgs& a) {
  Bind("first", a, {});
  if (v.is_list()) {
    if (!v.as_list().items.empty()) return v.as_list().items.front();
  } else {
    std::vector<Value> items = items_of(in, v);
    if (!items.empty()) return items.front();
  }
  return Value::undefined("No first item, sequence was empty.");
}

Value f_last(Interp& in, const Value& v, CallArgs& a) {
  Bind("last", a, {});
  if (v.is_list()) {
    if (!v.as_list().items.empty()) return v.as_list().items.back();
  } else {
    std::vector<Value> items = items_of(in, v);
    if (!items.empty()) return items.back();
  }
  return Value::undefined("No last item, sequence was empty.");
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> parse_float(const std::string& text) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    clean += s[i];
  }
  if (clean.empty() || clean.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python's int(str, base).
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      char p = static_cast<char>(s[i + 1] | 0x20);
      int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::isalpha(static_cast<unsigned char>(c)) ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (v > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) return std::nullopt;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  Bind b("float", a, {"default"});
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.number_value());
  if (v.is_str())
    if (auto d = parse_float(v.str())) return Value(*d);
  return b.get(0, Value(0.0));
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  Bind b("int", a, {"default", "base"});
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return Value(v.int_value());
  if (v.is_float()) {
    double d = v.as_float();
    if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(std::trunc(d)));
  } else if (v.is_str()) {
    if (auto i = parse_int(v.str(), b.has(1) ? require_int(b[1], "int") : 10)) return Value(*i);
    if (auto d = parse_float(v.str()))  // "42.23"|int is 42, as in Jinja2
      if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value(static_cast<int64_t>(std::trunc(*d)));
  }
  return b.get(0, Value(int64_t{0}));
}

Value f_format(Interp& in, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) throw_error("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<Dict>();
    for (auto& [k, val] : a.kw) d->set(Value(k), val);
    args = Value(DictPtr(std::move(d)));
  } else {
    args = Value::list(a.pos, true);
  }
  return str_result(percent_format(in, to_str(v), args), v);
}

Value f_indent(Interp& in, const Value& v, CallArgs& a) {
  Bind b("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) fail_undefined(v);
  std::string indention = b.has(0) && b[0].is_str() ? b[0].str() : std::string(static_cast<size_t>(std::max<int64_t>(0, b.has(0) ? require_int(b[0], "indent") : 4)), ' ');
  std::string s = to_str(v) + "\n";  // Jinja2's quirk for splitlines
  std::vector<std::string> lines = pystr::splitlines(s, false);
  in.charge(lines.size());
  std::string rv;
  if (truthy(b[2])) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : indention + lines[i];
      }
    }
  }
  if (truthy(b[1])) rv = indention + rv;
  in.check_size(rv.size());
  return str_result(std::move(rv), v);
}

Value f_items(Interp& in, const Value& v, CallArgs& a) {
  Bind("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::list({k, val}, true));
  in.charge(out.size());
  return Value::list(std::move(out));
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  Bind b("join", a, {"d", "attribute"});
  std::string sep = b.has(0) ? to_str(b[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : items_of(in, v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute_or_self(in, item, b, 1));
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  Bind("length", a, {});
  return Value(length(v));
}

Value f_list(Interp& in, const Value& v, CallArgs& a) {
  Bind("list", a, {});
  return Value::list(items_of(in, v));
}

Value f_lower(Interp&, const Value& v, CallArgs& a) {
  Bind("lower", a, {});
  return str_result(pystr::lower(to_str(v)), v);
}

Value f_upper(Interp&, const Value& v, CallArgs& a) {
  Bind("upper", a, {});
  return str_result(pystr::upper(to_str(v)), v);
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (a.pos.empty()) {
    Bind b("map", a, {"attribute", "default"});
    if (!b.has(0)) throw_error("map requires a filter argument");
    for (const Value& item : items_of(in, v)) {
      Value r = attribute_or_self(in, item, b, 0);
      if (r.is_undefined() && b.has(1)) r = b[1];
      out.push_back(std::move(r));
    }
    return Value::list(std::move(out));
  }
  std::string name = to_str(a.pos[0]);
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& item : items_of(in, v)) {
    CallArgs call = rest;
    out.push_back(in.apply_filter(name, item, call));
  }
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr
Value select_impl(Interp& in, const Value& v, CallArgs& a, bool attr, bool keep) {
  size_t off = 0;
  std::string attribute;
  if (attr) {
    if (a.pos.empty()) throw_error("Missing parameter for attribute name");
    attribute = to_str(a.pos[0]);
    off = 1;
  }
  std::optional<std::string> test;
  if (a.pos.size() > off) test = to_str(a.pos[off]);
  CallArgs rest;
  if (a.pos.size() > off + 1) rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
  rest.kw = a.kw;
  std::vector<Value> out;
  for (const Value& item : items_of(in, v)) {
    Value subject = attr ? get_attribute_path(in, item, attribute) : item;
    bool ok;
    if (test) {
      CallArgs call = rest;
      ok = in.apply_test(*test, subject, call);
    } else {
      ok = truthy(subject);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  Bind b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = items_of(in, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    Value k = attribute_or_self(in, x, b, 1);
    return truthy(b[0]) ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    int c = compare(k, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value f_replace(Interp& in, const Value& v, CallArgs& a) {
  Bind b("replace", a, {"old", "new", "count"});
  if (!b.has(0) || !b.has(1)) throw_error("replace() missing required argument");
  int64_t count = b.given(2) ? require_int(b[2], "replace") : -1;
  std::string r = pystr::replace(to_str(v), to_str(b[0]), to_str(b[1]), count);
  in.check_size(r.size());
  return str_result(std::move(r), v);
}

Value f_reverse(Interp& in, const Value& v, CallArgs& a) {
  Bind("reverse", a, {});
  if (v.is_str()) {
    std::vector<uint32_t> cps = decode_utf8(v.str());
    std::reverse(cps.begin(), cps.end());
    return str_result(encode_utf8(cps), v);
  }
  std::vector<Value> items = items_of(in, v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  Bind b("round", a, {"precision", "method"});
  int64_t precision = b.has(0) ? require_int(b[0], "round") : 0;
  std::string method = b.has(1) ? to_str(b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") throw_error("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) throw_error("type " + type_name(v) + " doesn't define __round__ method");
  if (precision > 300) precision = 300;
  if (precision < -300) precision = -300;
  if (method == "common") {
    if (!v.is_float()) {  // round(int, n) stays an int
      int64_t x = v.int_value();
      if (precision >= 0) return Value(x);
      double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value(static_cast<int64_t>(std::nearbyint(static_cast<double>(x) / scale) * scale));
    }
    double d = v.as_float();
    if (!std::isfinite(d)) return Value(d);
    if (precision >= 0) {  // printf rounds the exact binary value, as Python's round does
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return Value(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(d / scale) * scale);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.number_value() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  Bind("safe", a, {});
  return Value(to_str(v), true);
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  Bind b("sort", a, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = items_of(in, v);
  std::vector<Value> keys;
  for (const Value& x : items) {
    Value k = attribute_or_self(in, x, b, 2);
    keys.push_back(truthy(b[1]) ? k : ignore_case(k));
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  bool rev = truthy(b[0]);
  in.charge(items.size() * 4);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return rev ? compare(keys[y], keys[x]) < 0 : compare(keys[x], keys[y]) < 0;
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  Bind("string", a, {});
  if (v.is_str()) return v;
  return Value(to_str(v));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  Bind b("sum", a, {"attribute", "start"});
  Value total = b.get(1, Value(int64_t{0}));
  for (const Value& item : items_of(in, v)) {
    Value x = attribute_or_self(in, item, b, 0);
    if (total.is_str()) throw_error("sum() can't sum strings [use ''.join(seq) instead]");
    total = binary_op(in, BinaryExpr::Op::Add, total, x);
  }
  return total;
}

Value f_title(Interp&, const Value& v, CallArgs& a) {
  Bind("title", a, {});
  // Jinja2's title: a word starts after whitespace, '-', or an opening bracket.
  std::string s = to_str(v), out;
  bool at_start = true;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_code_point(s, i);
    bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    append_utf8(out, sep ? c : at_start ? to_upper(c) : to_lower(c));
    at_start = sep;
  }
  return str_result(std::move(out), v);
}

Value f_tojson(Interp& in, const Value& v, CallArgs& a) {
  Bind b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = truthy(b[0]);
  if (b.given(1)) {
    const Value& ind = b[1];
    if (ind.is_str())
      o.indent = ind.str();
    else
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(require_int(ind, "indent"), 0, 1000)), ' ');
  }
  if (o.indent) o.item_sep = ",";
  if (b.given(2)) {
    const Value& sep = b[2];
    if (!sep.is_list() || sep.as_list().items.size() != 2) throw_error("separators must be a (item_separator, key_separator) pair");
    o.item_sep = require_str(sep.as_list().items[0], "separator");
    o.key_sep = require_str(sep.as_list().items[1], "separator");
  }
  o.sort_keys = truthy(b[3]);
  std::string s = to_json(v, o);
  in.check_size(s.size());
  in.charge(s.size() / 256);
  return Value(std::move(s));
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  Bind b("trim", a, {"chars"});
  std::optional<std::string> chars;
  if (b.given(0)) chars = to_str(b[0]);
  return str_result(pystr::strip(to_str(v), chars, true, true), v);
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  Bind b("unique", a, {"case_sensitive", "attribute"});
  std::vector<Value> out, seen;
  std::vector<Value> items = items_of(in, v);
  for (const Value& item : items) {
    Value k = attribute_or_self(in, item, b, 1);
    if (!truthy(b[0])) k = ignore_case(k);
    if (k.is_list() && !k.as_list().tuple) throw_error("unhashable type: 'list'");
    if (k.is_dict()) throw_error("unhashable type: 'dict'");
    in.charge(seen.size());
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  Bind("wordcount", a, {});
  std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_code_point(s, i);
    bool w = is_alpha(c) || is_numeric(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> m = {
      {"abs", f_abs},         {"attr", f_attr},           {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},       {"default", f_default},     {"dictsort", f_dictsort},
      {"e", f_escape},        {"escape", f_escape},       {"first", f_first},
      {"float", f_float},     {"forceescape", f_forceescape}, {"format", f_format},
      {"indent", f_indent},   {"int", f_int},             {"items", f_items},
      {"join", f_join},       {"last", f_last},           {"length", f_length},
      {"list", f_list},       {"lower", f_lower},         {"map", f_map},
      {"max", f_max},         {"min", f_min},             {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round},     {"safe", f_safe},           {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},
      {"sum", f_sum},         {"title", f_title},         {"tojson", f_tojson},
      {"trim", f_trim},       {"unique", f_unique},       {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return m;
}

// --- tests --------------------------------------------------------------------------------

#define SIMPLE_TEST(fname, expr)                          \
  bool fname(Interp&, const Value& v, CallArgs& a) {      \
    Bind(&(#fname)[2], a, {}); /* the name without t_ */  \
    return (expr);                                        \
  }

SIMPLE_TEST(t_defined, !v.is_undefined())
SIMPLE_TEST(t_undefined, v.is_undefined())
SIMPLE_TEST(t_none, v.is_none())
SIMPLE_TEST(t_boolean, v.is_bool())
SIMPLE_TEST(t_false, v.is_bool() && !v.as_bool())
SIMPLE_TEST(t_true, v.is_bool() && v.as_bool())
SIMPLE_TEST(t_integer, v.is_int())
SIMPLE_TEST(t_float, v.is_float())
SIMPLE_TEST(t_number, v.is_number())
SIMPLE_TEST(t_string, v.is_str())
SIMPLE_TEST(t_mapping, v.is_dict())
SIMPLE_TEST(t_iterable, v.is_str() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(t_sequence, v.is_str() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(t_callable, v.is_object() && v.as_object()->callable())
SIMPLE_TEST(t_escaped, v.is_safe())
SIMPLE_TEST(t_lower, pystr::islower(to_str(v)))
SIMPLE_TEST(t_upper, pystr::isupper(to_str(v)))
#undef SIMPLE_TEST

int64_t int_mod(Interp& in, const Value& v, const Value& m) {
  Value r = binary_op(in, BinaryExpr::Op::Mod, v, m);
  return r.is_float() ? (r.as_float() == 0 ? 0 : 1) : r.int_value();
}

bool t_odd(Interp& in, const Value& v, CallArgs& a) {
  Bind("odd", a, {});
  return int_mod(in, v, Value(int64_t{2})) == 1;
}
bool t_even(Interp& in, const Value& v, CallArgs& a) {
  Bind("even", a, {});
  return int_mod(in, v, Value(int64_t{2})) == 0;
}
bool t_divisibleby(Interp& in, const Value& v, CallArgs& a) {
  Bind b("divisibleby", a, {"num"});
  return int_mod(in, v, b[0]) == 0;
}

bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  Bind b("sameas", a, {"other"});
  const Value& o = b[0];
  if (v.type() != o.type()) return false;
  switch (v.type()) {
    case Value::T::List: return v.list_ptr() == o.list_ptr();
    case Value::T::Dict: return &v.as_dict() == &o.as_dict();
    case Value::T::Object: return v.as_object() == o.as_object();
    default: return equal(v, o);
  }
}

bool t_in(Interp&, const Value& v, CallArgs& a) {
  Bind b("in", a, {"seq"});
  return contains(b[0], v);
}

template <CmpOp op>
bool t_cmp(Interp&, const Value& v, CallArgs& a) {
  Bind b("compare", a, {"other"});
  switch (op) {
    case CmpOp::Eq: return equal(v, b[0]);
    case CmpOp::Ne: return !equal(v, b[0]);
    case CmpOp::Lt: return compare(v, b[0], "<") < 0;
    case CmpOp::Le: return compare(v, b[0], "<=") <= 0;
    case CmpOp::Gt: return compare(v, b[0], ">") > 0;
    case CmpOp::Ge: return compare(v, b[0], ">=") >= 0;
    default: return false;
  }
}

bool t_filter(Interp&, const Value& v, CallArgs& a) {
  Bind("filter", a, {});
  return v.is_str() && find_filter(v.str()) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs& a) {
  Bind("test", a, {});
  return v.is_str() && find_test(v.str()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> m = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},
      {"boolean", t_boolean},   {"false", t_false},         {"true", t_true},
      {"integer", t_integer},   {"float", t_float},         {"number", t_number},
      {"string", t_string},     {"mapping", t_mapping},     {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable},   {"escaped", t_escaped},
      {"lower", t_lower},       {"upper", t_upper},         {"odd", t_odd},
      {"even", t_even},         {"divisibleby", t_divisibleby}, {"sameas", t_sameas},
      {"in", t_in},             {"eq", t_cmp<CmpOp::Eq>},   {"equalto", t_cmp<CmpOp::Eq>},
      {"==", t_cmp<CmpOp::Eq>}, {"ne", t_cmp<CmpOp::Ne>},   {"!=", t_cmp<CmpOp::Ne>},
      {"lt", t_cmp<CmpOp::Lt>}, {"lessthan", t_cmp<CmpOp::Lt>}, {"<", t_cmp<CmpOp::Lt>},
      {"le", t_cmp<CmpOp::Le>}, {"<=", t_cmp<CmpOp::Le>},   {"gt", t_cmp<CmpOp::Gt>},
      {"greaterthan", t_cmp<CmpOp::Gt>}, {">", t_cmp<CmpOp::Gt>}, {"ge", t_cmp<CmpOp::Ge>},
      {">=", t_cmp<CmpOp::Ge>}, {"filter", t_filter},       {"test", t_test},
  };
  return m;
}

// --- globals ------------------------------------------------------------------------------

// The sandbox's MAX_RANGE: range(10**9) is an error, not a hang.
constexpr int64_t kMaxRange = 100000;

Value g_range(Interp& in, const Value&, CallArgs& a) {
  if (!a.kw.empty()) throw_error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) throw_error("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = require_int(a.pos[0], "range");
  } else {
    start = require_int(a.pos[0], "range");
    stop = require_int(a.pos[1], "range");
    if (a.pos.size() == 3) step = require_int(a.pos[2], "range");
  }
  if (step == 0) throw_error("range() arg 3 must not be zero");
  long double n = step > 0 ? (static_cast<long double>(stop) - start + step - 1) / step
                           : (static_cast<long double>(start) - stop - step - 1) / -step;
  int64_t count = n <= 0 ? 0 : static_cast<int64_t>(n);
  if (count > kMaxRange)
    throw_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(kMaxRange) + ").");
  in.charge(static_cast<uint64_t>(count));
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.emplace_back(start + i * step);
  return Value::list(std::move(out));
}

// dict(*args, **kwargs) into an existing Dict
void fill_dict(Interp& in, Dict& d, const CallArgs& a, const char* fn) {
  if (a.pos.size() > 1) throw_error(std::string(fn) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.as_dict().entries()) d.set(k, v);
    } else {
      for (const Value& pair : items_of(in, src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) throw_error("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value(k), v);
}

Value g_dict(Interp& in, const Value&, CallArgs& a) {
  auto d = std::make_shared<Dict>();
  fill_dict(in, *d, a, "dict");
  return Value(DictPtr(std::move(d)));
}

Value g_namespace(Interp& in, const Value&, CallArgs& a) {
  Dict d;
  fill_dict(in, d, a, "namespace");
  auto ns = in.new_namespace();
  for (const auto& [k, v] : d.entries()) ns->set(to_str(k), v);
  return Value(ObjPtr(ns));
}

Value g_raise_exception(Interp&, const Value&, CallArgs& a) {
  Bind b("raise_exception", a, {"message"});
  throw EvalError{ChatTemplateError::Kind::Raised, to_str(b[0])};
}

Value g_strftime_now(Interp& in, const Value&, CallArgs& a) {
  Bind b("strftime_now", a, {"format"});
  std::string fmt = require_str(b[0], "strftime_now() format");
  if (fmt.empty()) return Value("");
  if (fmt.size() > 4096) throw_error("strftime_now() format too long");
  std::tm t = in.now();
  std::string buf(fmt.size() * 8 + 64, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
  buf.resize(n);
  return Value(std::move(buf));
}

class Joiner : public Object {
 public:
  explicit Joiner(std::string sep) : sep_(std::move(sep)) {}
  std::string type_name() const override { return "Joiner"; }
  std::string object_type_repr() const override { return "jinja2.utils.Joiner object"; }
  bool callable() const override { return true; }
  Value call(Interp&, CallArgs& a) override {
    Bind("joiner", a, {});
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(sep_);
  }

 private:
  std::string sep_;
  bool used_ = false;
};

Value g_joiner(Interp&, const Value&, CallArgs& a) {
  Bind b("joiner", a, {"sep"});
  return Value(ObjPtr(std::make_shared<Joiner>(b.has(0) ? to_str(b[0]) : ", ")));
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

std::optional<Value> find_global(std::string_view name) {
  static const std::pair<const char*, Function::Fn> kGlobals[] = {
      {"range", g_range},
      {"dict", g_dict},
      {"namespace", g_namespace},
      {"raise_exception", g_raise_exception},
      {"strftime_now", g_strftime_now},
      {"joiner", g_joiner},
  };
  for (const auto& [n, fn] : kGlobals)
    if (name == n) return Value(ObjPtr(std::make_shared<Function>(n, fn)));
  return std::nullopt;
}

}  // namespace tessera::chat_template
