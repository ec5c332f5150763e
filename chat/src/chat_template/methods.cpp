// Methods of str, list and dict values ("a".strip(), d.items(), l.index(x)), as the
// ImmutableSandboxedEnvironment exposes them: everything that reads, nothing that
// mutates.
#include <unordered_map>

#include "builtins.h"
#include "interp.h"
#include "operators.h"
#include "pystr.h"
#include "utf8.h"

namespace tessera::chat_template {

namespace {

std::optional<int64_t> opt_index(const Bind& b, size_t i, const char* fn) {
  if (!b.given(i)) return std::nullopt;
  return require_int(b[i], fn);
}

std::optional<std::string> opt_str(const Bind& b, size_t i, const char* fn) {
  if (!b.given(i)) return std::nullopt;
  return require_str(b[i], fn);
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

// Markup's methods return Markup.
Value like(const Value& self, std::string s) { return Value(std::move(s), self.is_safe()); }

// --- str ----------------------------------------------------------------------------------

Value affix_test(const Value& self, CallArgs& a, const char* fn, bool prefix) {
  Bind b(fn, a, {"affix", "start", "end"});
  std::string s = (b.given(1) || b.given(2)) ? pystr::substr(self.str(), opt_index(b, 1, fn), opt_index(b, 2, fn)) : self.str();
  auto test = [&](const Value& x) {
    if (!x.is_str())
      throw_error(std::string(fn) + " first arg must be str or a tuple of str, not " + type_name(x));
    const std::string& f = x.str();
    if (f.size() > s.size()) return false;
    return prefix ? s.compare(0, f.size(), f) == 0 : s.compare(s.size() - f.size(), f.size(), f) == 0;
  };
  if (b[0].is_list() && b[0].as_list().tuple) {
    for (const Value& x : b[0].as_list().items)
      if (test(x)) return Value(true);
    return Value(false);
  }
  return Value(test(b[0]));
}
Value m_startswith(Interp&, const Value& self, CallArgs& a) { return affix_test(self, a, "startswith", true); }
Value m_endswith(Interp&, const Value& self, CallArgs& a) { return affix_test(self, a, "endswith", false); }

Value strip_impl(const Value& self, CallArgs& a, const char* fn, bool l, bool r) {
  Bind b(fn, a, {"chars"});
  return like(self, pystr::strip(self.str(), opt_str(b, 0, fn), l, r));
}
Value m_strip(Interp&, const Value& self, CallArgs& a) { return strip_impl(self, a, "strip", true, true); }
Value m_lstrip(Interp&, const Value& self, CallArgs& a) { return strip_impl(self, a, "lstrip", true, false); }
Value m_rstrip(Interp&, const Value& self, CallArgs& a) { return strip_impl(self, a, "rstrip", false, true); }

Value m_split(Interp& in, const Value& self, CallArgs& a) {
  Bind b("split", a, {"sep", "maxsplit"});
  auto parts = pystr::split(self.str(), opt_str(b, 0, "split"), b.has(1) ? require_int(b[1], "split") : -1);
  in.charge(parts.size());
  return str_list(std::move(parts));
}
Value m_rsplit(Interp& in, const Value& self, CallArgs& a) {
  Bind b("rsplit", a, {"sep", "maxsplit"});
  auto parts = pystr::rsplit(self.str(), opt_str(b, 0, "rsplit"), b.has(1) ? require_int(b[1], "rsplit") : -1);
  in.charge(parts.size());
  return str_list(std::move(parts));
}
Value m_splitlines(Interp& in, const Value& self, CallArgs& a) {
  Bind b("splitlines", a, {"keepends"});
  auto parts = pystr::splitlines(self.str(), truthy(b[0]));
  in.charge(parts.size());
  return str_list(std::move(parts));
}

Value m_replace(Interp& in, const Value& self, CallArgs& a) {
  Bind b("replace", a, {"old", "new", "count"});
  std::string r = pystr::replace(self.str(), require_str(b[0], "replace() argument 1"), require_str(b[1], "replace() argument 2"),
                                 b.has(2) ? require_int(b[2], "replace") : -1);
  in.check_size(r.size());
  return like(self, std::move(r));
}

Value m_upper(Interp&, const Value& self, CallArgs& a) { Bind("upper", a, {}); return like(self, pystr::upper(self.str())); }
Value m_lower(Interp&, const Value& self, CallArgs& a) { Bind("lower", a, {}); return like(self, pystr::lower(self.str())); }
Value m_casefold(Interp&, const Value& self, CallArgs& a) { Bind("casefold", a, {}); return Value(pystr::lower(self.str())); }
Value m_swapcase(Interp&, const Value& self, CallArgs& a) { Bind("swapcase", a, {}); return like(self, pystr::swapcase(self.str())); }
Value m_title(Interp&, const Value& self, CallArgs& a) { Bind("title", a, {}); return like(self, pystr::title(self.str())); }
Value m_capitalize(Interp&, const Value& self, CallArgs& a) {
  Bind("capitalize", a, {});
  return like(self, pystr::capitalize(self.str()));
}

Value find_impl(const Value& self, CallArgs& a, const char* fn, bool reverse, bool raise) {
  Bind b(fn, a, {"sub", "start", "end"});
  int64_t r = pystr::find(self.str(), require_str(b[0], std::string(fn) + "() argument"), opt_index(b, 1, fn), opt_index(b, 2, fn), reverse);
  if (r < 0 && raise) throw_error("substring not found");
  return Value(r);
}
Value m_find(Interp&, const Value& self, CallArgs& a) { return find_impl(self, a, "find", false, false); }
Value m_rfind(Interp&, const Value& self, CallArgs& a) { return find_impl(self, a, "rfind", true, false); }
Value m_index(Interp&, const Value& self, CallArgs& a) { return find_impl(self, a, "index", false, true); }
Value m_rindex(Interp&, const Value& self, CallArgs& a) { return find_impl(self, a, "rindex", true, true); }

Value m_count(Interp&, const Value& self, CallArgs& a) {
  Bind b("count", a, {"sub", "start", "end"});
  return Value(pystr::count(self.str(), require_str(b[0], "count() argument"), opt_index(b, 1, "count"), opt_index(b, 2, "count")));
}

Value m_join(Interp& in, const Value& self, CallArgs& a) {
  Bind b("join", a, {"iterable"});
  std::vector<Value> items = iterate(b[0]);
  in.charge(items.size());
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_str())
      throw_error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) + " found");
    if (i) out += self.str();
    out += items[i].str();
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value m_format(Interp& in, const Value& self, CallArgs& a) { return like(self, str_format(in, self.str(), a)); }

Value pad_impl(Interp& in, const Value& self, CallArgs& a, const char* fn, char align) {
  Bind b(fn, a, {"width", "fillchar"});
  int64_t width = require_int(b[0], fn);
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, width)));
  std::string fill = b.has(1) ? require_str(b[1], "fillchar") : " ";
  if (code_point_count(fill) != 1) throw_error("The fill character must be exactly one character long");
  return like(self, pystr::pad(self.str(), width, fill, align));
}
Value m_center(Interp& in, const Value& self, CallArgs& a) { return pad_impl(in, self, a, "center", '^'); }
Value m_ljust(Interp& in, const Value& self, CallArgs& a) { return pad_impl(in, self, a, "ljust", '<'); }
Value m_rjust(Interp& in, const Value& self, CallArgs& a) { return pad_impl(in, self, a, "rjust", '>'); }
Value m_zfill(Interp& in, const Value& self, CallArgs& a) {
  Bind b("zfill", a, {"width"});
  int64_t width = require_int(b[0], "zfill");
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, width)));
  return like(self, pystr::zfill(self.str(), width));
}

Value partition_impl(const Value& self, CallArgs& a, bool reverse) {
  Bind b(reverse ? "rpartition" : "partition", a, {"sep"});
  std::string sep = require_str(b[0], "partition() argument");
  if (sep.empty()) throw_error("empty separator");
  const std::string& s = self.str();
  size_t f = reverse ? s.rfind(sep) : s.find(sep);
  if (f == std::string::npos)
    return reverse ? Value::list({Value(""), Value(""), Value(s)}, true) : Value::list({Value(s), Value(""), Value("")}, true);
  return Value::list({Value(s.substr(0, f)), Value(sep), Value(s.substr(f + sep.size()))}, true);
}
Value m_partition(Interp&, const Value& self, CallArgs& a) { return partition_impl(self, a, false); }
Value m_rpartition(Interp&, const Value& self, CallArgs& a) { return partition_impl(self, a, true); }

Value m_removeprefix(Interp&, const Value& self, CallArgs& a) {
  Bind b("removeprefix", a, {"prefix"});
  std::string p = require_str(b[0], "removeprefix() argument");
  const std::string& s = self.str();
  return like(self, s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
}
Value m_removesuffix(Interp&, const Value& self, CallArgs& a) {
  Bind b("removesuffix", a, {"suffix"});
  std::string p = require_str(b[0], "removesuffix() argument");
  const std::string& s = self.str();
  bool ends = !p.empty() && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
  return like(self, ends ? s.substr(0, s.size() - p.size()) : s);
}

#define STR_PREDICATE(name)                                          \
  Value m_##name(Interp&, const Value& self, CallArgs& a) {          \
    Bind(#name, a, {});                                              \
    return Value(pystr::name(self.str()));                           \
  }
STR_PREDICATE(isalpha)
STR_PREDICATE(isdigit)
STR_PREDICATE(isnumeric)
STR_PREDICATE(isalnum)
STR_PREDICATE(isspace)
STR_PREDICATE(islower)
STR_PREDICATE(isupper)
STR_PREDICATE(istitle)
#undef STR_PREDICATE

const std::unordered_map<std::string_view, Function::Fn>& str_methods() {
  static const std::unordered_map<std::string_view, Function::Fn> m = {
      {"startswith", m_startswith}, {"endswith", m_endswith},   {"strip", m_strip},
      {"lstrip", m_lstrip},         {"rstrip", m_rstrip},       {"split", m_split},
      {"rsplit", m_rsplit},         {"splitlines", m_splitlines}, {"replace", m_replace},
      {"upper", m_upper},           {"lower", m_lower},         {"casefold", m_casefold},
      {"swapcase", m_swapcase},     {"title", m_title},         {"capitalize", m_capitalize},
      {"find", m_find},             {"rfind", m_rfind},         {"index", m_index},
      {"rindex", m_rindex},         {"count", m_count},         {"join", m_join},
      {"format", m_format},         {"center", m_center},       {"ljust", m_ljust},
      {"rjust", m_rjust},           {"zfill", m_zfill},         {"partition", m_partition},
      {"rpartition", m_rpartition}, {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
      {"isalpha", m_isalpha},       {"isdigit", m_isdigit},     {"isdecimal", m_isdigit},
      {"isnumeric", m_isnumeric},   {"isalnum", m_isalnum},     {"isspace", m_isspace},
      {"islower", m_islower},       {"isupper", m_isupper},     {"istitle", m_istitle},
  };
  return m;
}

// --- list -----------------------------------------------------------------------------------

Value m_list_count(Interp& in, const Value& self, CallArgs& a) {
  Bind b("count", a, {"value"});
  int64_t n = 0;
  in.charge(self.as_list().items.size());
  for (const Value& v : self.as_list().items) n += equal(v, b[0]);
  return Value(n);
}
Value m_list_index(Interp& in, const Value& self, CallArgs& a) {
  Bind b("index", a, {"value"});
  const auto& items = self.as_list().items;
  in.charge(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    if (equal(items[i], b[0])) return Value(static_cast<int64_t>(i));
  throw_error(repr(b[0]) + " is not in list");
}
Value m_list_copy(Interp&, const Value& self, CallArgs& a) {
  Bind("copy", a, {});
  return Value::list(self.as_list().items, self.as_list().tuple);
}

// --- dict -----------------------------------------------------------------------------------

Value m_items(Interp& in, const Value& self, CallArgs& a) {
  Bind("items", a, {});
  std::vector<Value> out;
  for (const auto& [k, v] : self.as_dict().entries()) out.push_back(Value::list({k, v}, true));
  in.charge(out.size());
  return Value::list(std::move(out));
}
Value m_keys(Interp& in, const Value& self, CallArgs& a) {
  Bind("keys", a, {});
  std::vector<Value> out;
  for (const auto& e : self.as_dict().entries()) out.push_back(e.first);
  in.charge(out.size());
  return Value::list(std::move(out));
}
Value m_values(Interp& in, const Value& self, CallArgs& a) {
  Bind("values", a, {});
  std::vector<Value> out;
  for (const auto& e : self.as_dict().entries()) out.push_back(e.second);
  in.charge(out.size());
  return Value::list(std::move(out));
}
Value m_get(Interp&, const Value& self, CallArgs& a) {
  Bind b("get", a, {"key", "default"});
  if (const Value* v = self.as_dict().find(b[0])) return *v;
  return b.get(1, Value::none());
}
Value m_dict_copy(Interp&, const Value& self, CallArgs& a) {
  Bind("copy", a, {});
  return Value(DictPtr(std::make_shared<Dict>(self.as_dict())));
}

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  for (auto n : names)
    if (n == name) return true;
  return false;
}

Value unsafe(std::string_view name, const char* type) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type + "' object is unsafe.");
}

}  // namespace

std::optional<Value> find_method(const Value& v, std::string_view name) {
  Function::Fn fn = nullptr;
  if (v.is_str()) {
    auto it = str_methods().find(name);
    if (it != str_methods().end()) fn = it->second;
  } else if (v.is_list()) {
    if (name == "count") fn = m_list_count;
    else if (name == "index") fn = m_list_index;
    else if (name == "copy" && !v.as_list().tuple) fn = m_list_copy;
    else if (!v.as_list().tuple && is_one_of(name, {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"}))
      return unsafe(name, "list");
  } else if (v.is_dict()) {
    if (name == "items") fn = m_items;
    else if (name == "keys") fn = m_keys;
    else if (name == "values") fn = m_values;
    else if (name == "get") fn = m_get;
    else if (name == "copy") fn = m_dict_copy;
    else if (is_one_of(name, {"clear", "pop", "popitem", "setdefault", "update"})) return unsafe(name, "dict");
  }
  if (!fn) return std::nullopt;
  return Value(ObjPtr(std::make_shared<Function>(std::string(name), fn, v, true)));
}

}  // namespace tessera::chat_template
