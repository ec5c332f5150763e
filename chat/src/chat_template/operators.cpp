#include "operators.h"

#include <cmath>
#include <cstdio>

#include "interp.h"
#include "utf8.h"

namespace tessera::chat_template {

namespace {

const char* op_symbol(BinaryExpr::Op op) {
  switch (op) {
    case BinaryExpr::Op::Add: return "+";
    case BinaryExpr::Op::Sub: return "-";
    case BinaryExpr::Op::Mul: return "*";
    case BinaryExpr::Op::Div: return "/";
    case BinaryExpr::Op::FloorDiv: return "//";
    case BinaryExpr::Op::Mod: return "%";
    case BinaryExpr::Op::Pow: return "**";
    default: return "?";
  }
}

[[noreturn]] void unsupported(BinaryExpr::Op op, const Value& a, const Value& b) {
  throw_error(std::string("unsupported operand type(s) for ") + op_symbol(op) + ": '" + type_name(a) + "' and '" +
              type_name(b) + "'");
}

[[noreturn]] void overflow() { throw_error("integer overflow (integers are 64-bit here)"); }

bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

Value repeat(Interp& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_str()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<uint64_t>(n) > in.options().max_output_bytes / s.size()) in.check_size(SIZE_MAX);
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    in.charge(out.size() / 256);
    return Value(std::move(out), seq.is_safe());
  }
  const auto& items = seq.as_list().items;
  if (!items.empty() && static_cast<uint64_t>(n) > in.options().max_output_bytes / items.size()) in.check_items(SIZE_MAX);
  in.check_items(items.size() * static_cast<size_t>(n));
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  in.charge(out.size());
  return Value::list(std::move(out), seq.as_list().tuple);
}

int64_t ipow(int64_t base, int64_t exp) {
  int64_t r = 1;
  while (exp > 0) {
    if (exp & 1)
      if (__builtin_mul_overflow(r, base, &r)) overflow();
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return r;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&#34;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

Value binary_op(Interp& in, BinaryExpr::Op op, const Value& a, const Value& b) {
  using Op = BinaryExpr::Op;
  if (op == Op::Concat) {  // `~` is str() of both sides; undefined prints as ""
    std::string s = to_str(a);
    std::string t = to_str(b);
    in.check_size(s.size() + t.size());
    in.charge((s.size() + t.size()) / 256);
    return Value(s + t);
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = is_intlike(a) && is_intlike(b);
  switch (op) {
    case Op::Add:
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.int_value(), b.int_value(), &r)) overflow();
        return Value(r);
      }
      if (nums) return Value(a.number_value() + b.number_value());
      if (a.is_str() && b.is_str()) {
        in.check_size(a.str().size() + b.str().size());
        in.charge((a.str().size() + b.str().size()) / 256);
        if (a.is_safe() == b.is_safe()) return Value(a.str() + b.str(), a.is_safe());
        // Markup + str escapes the plain side (markupsafe's __add__/__radd__).
        return Value(a.is_safe() ? a.str() + html_escape(b.str()) : html_escape(a.str()) + b.str(), true);
      }
      if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
        std::vector<Value> items = a.as_list().items;
        in.check_items(items.size() + b.as_list().items.size());
        in.charge(items.size() + b.as_list().items.size());
        items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
        return Value::list(std::move(items), a.as_list().tuple);
      }
      if (a.is_str() || a.is_list())
        throw_error("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
      unsupported(op, a, b);
    case Op::Sub:
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.int_value(), b.int_value(), &r)) overflow();
        return Value(r);
      }
      if (nums) return Value(a.number_value() - b.number_value());
      unsupported(op, a, b);
    case Op::Mul:
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.int_value(), b.int_value(), &r)) overflow();
        return Value(r);
      }
      if (nums) return Value(a.number_value() * b.number_value());
      if ((a.is_str() || a.is_list()) && is_intlike(b)) return repeat(in, a, b.int_value());
      if ((b.is_str() || b.is_list()) && is_intlike(a)) return repeat(in, b, a.int_value());
      if (a.is_str() || a.is_list() || b.is_str() || b.is_list())
        throw_error("can't multiply sequence by non-int of type '" + type_name(a.is_str() || a.is_list() ? b : a) + "'");
      unsupported(op, a, b);
    case Op::Div:
      if (nums) {
        if (b.number_value() == 0) throw_error("division by zero");
        return Value(a.number_value() / b.number_value());
      }
      unsupported(op, a, b);
    case Op::FloorDiv:
      if (ints) {
        int64_t x = a.int_value(), y = b.int_value();
        if (y == 0) throw_error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) overflow();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      if (nums) {
        if (b.number_value() == 0) throw_error("float floor division by zero");
        return Value(std::floor(a.number_value() / b.number_value()));
      }
      unsupported(op, a, b);
    case Op::Mod:
      if (a.is_str()) return Value(percent_format(in, a.str(), b), a.is_safe());
      if (ints) {
        int64_t x = a.int_value(), y = b.int_value();
        if (y == 0) throw_error("integer modulo by zero");
        if (y == -1) return Value(int64_t{0});
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
      }
      if (nums) {
        double x = a.number_value(), y = b.number_value();
        if (y == 0) throw_error("float modulo");
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
      }
      unsupported(op, a, b);
    case Op::Pow:
      if (ints && b.int_value() >= 0) return Value(ipow(a.int_value(), b.int_value()));
      if (nums) {
        if (a.number_value() == 0 && b.number_value() < 0) throw_error("0.0 cannot be raised to a negative power");
        return Value(std::pow(a.number_value(), b.number_value()));
      }
      unsupported(op, a, b);
    default: break;
  }
  unsupported(op, a, b);
}

Value unary_op(UnaryExpr::Op op, const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  const char* sym = op == UnaryExpr::Op::Neg ? "-" : "+";
  if (v.is_float()) return Value(op == UnaryExpr::Op::Neg ? -v.as_float() : v.as_float());
  if (is_intlike(v)) {
    int64_t x = v.int_value();
    if (op == UnaryExpr::Op::Pos) return Value(x);
    if (x == INT64_MIN) overflow();
    return Value(-x);
  }
  throw_error(std::string("bad operand type for unary ") + sym + ": '" + type_name(v) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::T::Undefined: return false;  // iterating an undefined value yields nothing
    case Value::T::Str:
      if (!item.is_str())
        throw_error("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str().find(item.str()) != std::string::npos;
    case Value::T::List:
      for (const Value& v : container.as_list().items)
        if (equal(v, item)) return true;
      return false;
    case Value::T::Dict:
      if (item.is_list() && !item.as_list().tuple) throw_error("unhashable type: 'list'");
      if (item.is_dict()) throw_error("unhashable type: 'dict'");
      return container.as_dict().find(item) != nullptr;
    default: throw_error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

Value slice(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto index = [](const Value& v, bool& given) -> int64_t {
    given = !v.is_none();
    if (!given) return 0;
    if (!is_intlike(v)) throw_error("slice indices must be integers or None or have an __index__ method");
    return v.int_value();
  };
  bool has_start, has_stop, has_step;
  int64_t st = index(step, has_step);
  if (!has_step) st = 1;
  if (st == 0) throw_error("slice step cannot be zero");
  int64_t a = index(start, has_start);
  int64_t b = index(stop, has_stop);

  std::vector<size_t> offsets;
  int64_t n;
  if (obj.is_str()) {
    offsets = code_point_offsets(obj.str());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().items.size());
  } else {
    return Value::undefined(object_type_repr(obj) + " has no element slice");
  }
  // Python's slice.indices()
  int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
  auto clamp = [&](int64_t v, bool given, int64_t dflt) {
    if (!given) return dflt;
    if (v < 0) {
      v += n;
      if (v < lower) v = lower;
    } else if (v > upper) {
      v = upper;
    }
    return v;
  };
  a = clamp(a, has_start, st > 0 ? lower : upper);
  b = clamp(b, has_stop, st > 0 ? upper : lower);
  std::vector<int64_t> idx;
  for (int64_t i = a; st > 0 ? i < b : i > b; i += st) idx.push_back(i);
  in.charge(idx.size());
  if (obj.is_str()) {
    const std::string& s = obj.str();
    std::string out;
    if (st == 1 && !idx.empty()) {
      out = s.substr(offsets[static_cast<size_t>(a)], offsets[static_cast<size_t>(b)] - offsets[static_cast<size_t>(a)]);
    } else {
      for (int64_t i : idx) {
        size_t k = static_cast<size_t>(i);
        out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
      }
    }
    return Value(std::move(out), obj.is_safe());
  }
  std::vector<Value> out;
  out.reserve(idx.size());
  for (int64_t i : idx) out.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.as_list().tuple);
}

// --- format() -------------------------------------------------------------------------

namespace {

struct Spec {
  char fill = ' ';
  std::string fill_utf8 = " ";
  char align = 0;  // < > ^ =
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  // [[fill]align]: the fill may be any (UTF-8) character
  if (!s.empty()) {
    size_t j = 0;
    next_code_point(s, j);
    if (j < s.size() && is_align(s[j])) {
      sp.fill_utf8 = s.substr(0, j);
      sp.align = s[j];
      i = j + 1;
    } else if (is_align(s[0])) {
      sp.align = s[0];
      i = 1;
    }
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    sp.zero = true;
    ++i;
  }
  auto digits = [&](int64_t& out) {
    if (i >= s.size() || !(s[i] >= '0' && s[i] <= '9')) return false;
    out = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      out = out * 10 + (s[i++] - '0');
      if (out > 100000) throw_error("format width or precision too large");
    }
    return true;
  };
  digits(sp.width);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) sp.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits(sp.precision)) throw_error("Format specifier missing precision");
  }
  if (i < s.size()) sp.type = s[i++];
  if (i != s.size()) throw_error("Invalid format specifier '" + s + "'");
  return sp;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  size_t n = digits.size();
  for (size_t k = 0; k < n; ++k) {
    out += digits[k];
    size_t rest = n - k - 1;
    if (rest > 0 && rest % 3 == 0) out += sep;
  }
  return out;
}

std::string pad(const std::string& sign_prefix, const std::string& body, const Spec& sp, char default_align) {
  int64_t len = static_cast<int64_t>(code_point_count(sign_prefix) + code_point_count(body));
  char align = sp.align ? sp.align : default_align;
  std::string fill = sp.fill_utf8;
  if (sp.zero && !sp.align) {
    fill = "0";
    align = '=';
  }
  if (sp.width <= len) return sign_prefix + body;
  int64_t n = sp.width - len;
  auto rep = [&](int64_t k) {
    std::string s;
    for (int64_t i = 0; i < k; ++i) s += fill;
    return s;
  };
  switch (align) {
    case '<': return sign_prefix + body + rep(n);
    case '^': return rep(n / 2) + sign_prefix + body + rep(n - n / 2);
    case '=': return sign_prefix + rep(n) + body;
    default: return rep(n) + sign_prefix + body;
  }
}

std::string format_float_body(double d, char type, int64_t precision, bool alt) {
  if (std::isnan(d)) return type >= 'A' && type <= 'Z' ? "NAN" : "nan";
  if (std::isinf(d)) return type >= 'A' && type <= 'Z' ? "INF" : "inf";
  char fmt[48], buf[512];
  if (type == 0) {
    if (precision < 0) return py_float_repr(d);
    std::snprintf(fmt, sizeof fmt, "%%%s.%lldg", alt ? "#" : "", static_cast<long long>(precision == 0 ? 1 : precision));
    std::snprintf(buf, sizeof buf, fmt, d);
    std::string s = buf;
    if (s.find_first_of(".eni") == std::string::npos) s += ".0";
    return s;
  }
  char t = type == '%' ? 'f' : type;
  if (type == '%') d *= 100;
  int64_t p = precision < 0 ? 6 : precision;
  std::snprintf(fmt, sizeof fmt, "%%%s.%lld%c", alt ? "#" : "", static_cast<long long>(p), t);
  int n = std::snprintf(buf, sizeof buf, fmt, d);
  std::string s;
  if (n >= static_cast<int>(sizeof buf)) {
    s.resize(static_cast<size_t>(n) + 1);
    std::snprintf(s.data(), s.size(), fmt, d);
    s.resize(static_cast<size_t>(n));
  } else {
    s = buf;
  }
  if (type == '%') s += '%';
  return s;
}

}  // namespace

std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  Spec sp = parse_spec(spec);
  if (v.is_str()) {
    if (sp.type != 0 && sp.type != 's')
      throw_error(std::string("Unknown format code '") + sp.type + "' for object of type 'str'");
    std::string body = v.str();
    if (sp.precision >= 0) {
      auto off = code_point_offsets(body);
      if (static_cast<size_t>(sp.precision) + 1 < off.size()) body = body.substr(0, off[static_cast<size_t>(sp.precision)]);
    }
    return pad("", body, sp, '<');
  }
  if (!v.is_number()) throw_error("unsupported format string passed to " + type_name(v) + ".__format__");
  bool as_int = (v.is_int() || v.is_bool()) && (sp.type == 0 || std::string("dbcoxXn").find(sp.type) != std::string::npos);
  std::string sign, body;
  if (as_int) {
    int64_t x = v.int_value();
    bool neg = x < 0;
    uint64_t u = neg ? static_cast<uint64_t>(0) - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
    if (sp.type == 'c') {
      std::string c;
      append_utf8(c, static_cast<uint32_t>(u));
      return pad("", c, sp, '<');
    }
    int base = sp.type == 'b' ? 2 : sp.type == 'o' ? 8 : (sp.type == 'x' || sp.type == 'X') ? 16 : 10;
    const char* dig = sp.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
    do {
      body.insert(body.begin(), dig[u % static_cast<uint64_t>(base)]);
      u /= static_cast<uint64_t>(base);
    } while (u);
    if (sp.grouping && base == 10) body = group_digits(body, sp.grouping);
    sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
    if (sp.alt && base != 10) sign += base == 2 ? "0b" : base == 8 ? "0o" : sp.type == 'X' ? "0X" : "0x";
  } else {
    if (sp.type != 0 && std::string("eEfFgG%").find(sp.type) == std::string::npos)
      throw_error(std::string("Unknown format code '") + sp.type + "' for object of type '" + type_name(v) + "'");
    double d = v.number_value();
    bool neg = std::signbit(d) && !std::isnan(d);
    body = format_float_body(std::fabs(d), sp.type, sp.precision, sp.alt);
    if (sp.grouping) {
      size_t end = body.find_first_not_of("0123456789");
      body = group_digits(body.substr(0, end), sp.grouping) + (end == std::string::npos ? "" : body.substr(end));
    }
    sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
  }
  return pad(sign, body, sp, '>');
}

std::string str_format(Interp& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // {field!conv:spec}, the spec may hold one level of nested {fields}
    size_t j = i + 1;
    int nest = 1;
    while (j < fmt.size() && nest > 0) {
      if (fmt[j] == '{') ++nest;
      if (fmt[j] == '}') --nest;
      if (nest > 0) ++j;
    }
    if (j >= fmt.size()) throw_error("expected '}' before end of string");
    std::string field = fmt.substr(i + 1, j - i - 1);
    i = j;
    std::string spec;
    char conv = 0;
    size_t colon = std::string::npos, bang = std::string::npos;
    int depth = 0;
    for (size_t k = 0; k < field.size(); ++k) {
      if (field[k] == '[') ++depth;
      if (field[k] == ']') --depth;
      if (depth == 0 && field[k] == '!' && bang == std::string::npos && colon == std::string::npos) bang = k;
      if (depth == 0 && field[k] == ':' && colon == std::string::npos) {
        colon = k;
        break;
      }
    }
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) throw_error("expected ':' after conversion specifier");
      conv = field[bang + 1];
      field = field.substr(0, bang);
    }
    if (spec.find('{') != std::string::npos) spec = str_format(in, spec, args);
    // the first part of the field: an index, a name, or nothing (automatic numbering)
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    std::string head = field.substr(0, k);
    Value v;
    if (head.empty() || std::isdigit(static_cast<unsigned char>(head[0]))) {
      size_t idx;
      if (head.empty()) {
        if (used_manual) throw_error("cannot switch from manual field specification to automatic field numbering");
        used_auto = true;
        idx = auto_index++;
      } else {
        if (used_auto) throw_error("cannot switch from automatic field numbering to manual field specification");
        used_manual = true;
        idx = std::stoul(head);
      }
      if (idx >= args.pos.size()) throw_error("Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
      v = args.pos[idx];
    } else {
      bool found = false;
      for (const auto& [name, val] : args.kw)
        if (name == head) {
          v = val;
          found = true;
        }
      if (!found) throw_error("'" + head + "'");
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        size_t e = field.find(']', k);
        if (e == std::string::npos) throw_error("Missing ']' in format string");
        std::string key = field.substr(k + 1, e - k - 1);
        bool numeric = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
        v = in.getitem(v, numeric ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        k = e + 1;
      }
      if (v.is_undefined()) fail_undefined(v);
    }
    if (conv == 'r' || conv == 'a')
      v = Value(repr(v));
    else if (conv == 's')
      v = Value(to_str(v));
    else if (conv != 0)
      throw_error(std::string("Unknown conversion specifier ") + conv);
    out += format_spec(v, spec);
    in.check_size(out.size());
  }
  return out;
}

std::string percent_format(Interp& in, const std::string& fmt, const Value& args) {
  std::vector<Value> values;
  const Dict* mapping = nullptr;
  if (args.is_list() && args.as_list().tuple)
    values = args.as_list().items;
  else if (args.is_dict())
    mapping = &args.as_dict();
  else
    values.push_back(args);
  size_t next_arg = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next_arg >= values.size()) throw_error("not enough arguments for format string");
    return values[next_arg++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw_error("incomplete format");
    Value v;
    bool have_v = false;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) throw_error("incomplete format key");
      if (!mapping) throw_error("format requires a mapping");
      const Value* found = mapping->find(std::string_view(fmt).substr(i + 1, e - i - 1));
      if (!found) throw_error("'" + fmt.substr(i + 1, e - i - 1) + "'");
      v = *found;
      have_v = true;
      used_mapping = true;
      i = e + 1;
    }
    Spec sp;
    bool left = false;
    for (; i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos; ++i) {
      if (fmt[i] == '-') left = true;
      if (fmt[i] == '+') sp.sign = '+';
      if (fmt[i] == ' ' && sp.sign != '+') sp.sign = ' ';
      if (fmt[i] == '#') sp.alt = true;
      if (fmt[i] == '0') sp.zero = true;
    }
    auto number = [&](int64_t& out_n) {
      if (i < fmt.size() && fmt[i] == '*') {
        Value w = take();
        if (!is_intlike(w)) throw_error("* wants int");
        out_n = w.int_value();
        ++i;
        return;
      }
      if (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        out_n = 0;
        while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
          out_n = out_n * 10 + (fmt[i++] - '0');
          if (out_n > 100000) throw_error("format width or precision too large");
        }
      }
    };
    number(sp.width);
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = 0;
      number(sp.precision);
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw_error("incomplete format");
    char t = fmt[i];
    if (t == '%') {
      out += '%';
      continue;
    }
    if (!have_v) v = take();
    if (left) sp.align = '<';
    if (left) sp.zero = false;
    std::string piece;
    switch (t) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = t == 's' ? to_str(v) : repr(v);
        if (sp.precision >= 0) {
          auto off = code_point_offsets(s);
          if (static_cast<size_t>(sp.precision) + 1 < off.size()) s = s.substr(0, off[static_cast<size_t>(sp.precision)]);
        }
        sp.zero = false;
        piece = pad("", s, sp, '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        if (!v.is_number())
          throw_error(std::string("%") + t + " format: " + (t == 'd' || t == 'i' || t == 'u' ? "a real number" : "an integer") +
                      " is required, not " + type_name(v));
        if (v.is_float() && (t == 'x' || t == 'X' || t == 'o'))
          throw_error(std::string("%") + t + " format: an integer is required, not float");
        double d = v.number_value();
        Value iv = v.is_float() ? Value(static_cast<int64_t>(std::trunc(d))) : Value(v.int_value());
        Spec s2 = sp;
        s2.type = (t == 'i' || t == 'u') ? 'd' : t;
        s2.precision = -1;
        std::string spec_text;
        piece = format_spec(iv, std::string(1, s2.type));
        // sign, alternate form and width
        bool neg = !piece.empty() && piece[0] == '-';
        std::string digits = neg ? piece.substr(1) : piece;
        if (sp.precision > static_cast<int64_t>(digits.size())) digits.insert(0, static_cast<size_t>(sp.precision) - digits.size(), '0');
        std::string sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
        if (sp.alt && t != 'd' && t != 'i' && t != 'u') sign += t == 'o' ? "0o" : t == 'X' ? "0X" : "0x";
        Spec s3;
        s3.width = sp.width;
        s3.align = sp.align;
        s3.zero = sp.zero;
        piece = pad(sign, digits, s3, '>');
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!v.is_number()) throw_error("must be real number, not " + type_name(v));
        double d = v.number_value();
        bool neg = std::signbit(d) && !std::isnan(d);
        std::string body = format_float_body(std::fabs(d), t, sp.precision, sp.alt);
        std::string sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
        Spec s3;
        s3.width = sp.width;
        s3.align = sp.align;
        s3.zero = sp.zero;
        piece = pad(sign, body, s3, '>');
        break;
      }
      case 'c': {
        std::string ch;
        if (v.is_str() && code_point_count(v.str()) == 1)
          ch = v.str();
        else if (is_intlike(v))
          append_utf8(ch, static_cast<uint32_t>(v.int_value()));
        else
          throw_error("%c requires int or char");
        sp.zero = false;
        piece = pad("", ch, sp, '>');
        break;
      }
      default: throw_error(std::string("unsupported format character '") + t + "'");
    }
    out += piece;
    in.check_size(out.size());
  }
  if (!mapping && next_arg < values.size()) throw_error("not all arguments converted during string formatting");
  (void)used_mapping;
  return out;
}

}  // namespace tessera::chat_template
