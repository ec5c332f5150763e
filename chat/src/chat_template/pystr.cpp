#include "pystr.h"

#include <algorithm>

#include "utf8.h"
#include "value.h"

namespace tessera::chat_template::pystr {

namespace {

// Python's slice clamping of [start, end) over n items.
void clamp_range(int64_t n, std::optional<int64_t> start, std::optional<int64_t> end, int64_t& a, int64_t& b) {
  a = start.value_or(0);
  b = end.value_or(n);
  if (a < 0) a = std::max<int64_t>(0, a + n);
  if (b < 0) b = std::max<int64_t>(0, b + n);
  if (b > n) b = n;
}

template <class F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_utf8(out, f(next_code_point(s, i)));
  return out;
}

}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars) set = decode_utf8(*chars);
  auto strip_it = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c); };
  std::vector<size_t> off = code_point_offsets(s);
  size_t n = off.size() - 1, a = 0, b = n;
  auto cp_at = [&](size_t k) {
    size_t i = off[k];
    return next_code_point(s, i);
  };
  if (left)
    while (a < b && strip_it(cp_at(a))) ++a;
  if (right)
    while (b > a && strip_it(cp_at(b - 1))) --b;
  return std::string(s.substr(off[a], off[b] - off[a]));
}

std::string upper(std::string_view s) { return map_chars(s, to_upper); }
std::string lower(std::string_view s) { return map_chars(s, to_lower); }
std::string swapcase(std::string_view s) {
  return map_chars(s, [](uint32_t c) { return is_upper(c) ? to_lower(c) : is_lower(c) ? to_upper(c) : c; });
}

std::string title(std::string_view s) {
  bool prev_cased = false;
  return map_chars(s, [&](uint32_t c) {
    uint32_t r = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = is_cased(c);
    return r;
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_chars(s, [&](uint32_t c) {
    uint32_t r = first ? to_upper(c) : to_lower(c);
    first = false;
    return r;
  });
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw_error("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0;
  auto skip_ws = [&]() {
    while (i < s.size()) {
      size_t j = i;
      if (!py_isspace(next_code_point(s, j))) break;
      i = j;
    }
  };
  skip_ws();
  while (i < s.size()) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(s.substr(i));
      return out;
    }
    size_t start = i;
    while (i < s.size()) {
      size_t j = i;
      if (py_isspace(next_code_point(s, j))) break;
      i = j;
    }
    out.emplace_back(s.substr(start, i - start));
    skip_ws();
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw_error("empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<size_t> off = code_point_offsets(s);
  auto ws = [&](size_t k) {
    size_t i = off[k];
    return py_isspace(next_code_point(s, i));
  };
  int64_t k = static_cast<int64_t>(off.size()) - 1;  // code points left of the cursor
  while (k > 0 && ws(static_cast<size_t>(k - 1))) --k;
  while (k > 0) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(s.substr(0, off[static_cast<size_t>(k)]));
      break;
    }
    int64_t end = k;
    while (k > 0 && !ws(static_cast<size_t>(k - 1))) --k;
    out.emplace_back(s.substr(off[static_cast<size_t>(k)], off[static_cast<size_t>(end)] - off[static_cast<size_t>(k)]));
    while (k > 0 && ws(static_cast<size_t>(k - 1))) --k;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    uint32_t c = next_code_point(s, i);
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.emplace_back(s.substr(start, (keepends ? i : at) - start));
    start = i;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // inserts repl around every character
    int64_t done = 0;
    size_t i = 0;
    while (true) {
      if (count >= 0 && done >= count) break;
      out += repl;
      ++done;
      if (i >= s.size()) break;
      size_t j = i;
      next_code_point(s, j);
      out += s.substr(i, j - i);
      i = j;
    }
    out += s.substr(i);
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out += s.substr(pos, f - pos);
    out += repl;
    pos = f + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse) {
  std::vector<size_t> off = code_point_offsets(s);
  int64_t n = static_cast<int64_t>(off.size()) - 1, a, b;
  clamp_range(n, start, end, a, b);
  if (a > n || b - a < 0) return -1;
  std::string_view range = s.substr(off[static_cast<size_t>(a)], off[static_cast<size_t>(b)] - off[static_cast<size_t>(a)]);
  size_t f = reverse ? range.rfind(sub) : range.find(sub);
  if (f == std::string_view::npos) return -1;
  size_t byte = off[static_cast<size_t>(a)] + f;
  return static_cast<int64_t>(std::lower_bound(off.begin(), off.end(), byte) - off.begin());
}

int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end) {
  std::vector<size_t> off = code_point_offsets(s);
  int64_t n = static_cast<int64_t>(off.size()) - 1, a, b;
  clamp_range(n, start, end, a, b);
  if (a > n || b < a) return 0;
  if (sub.empty()) return b - a + 1;
  std::string_view range = s.substr(off[static_cast<size_t>(a)], off[static_cast<size_t>(b)] - off[static_cast<size_t>(a)]);
  int64_t c = 0;
  for (size_t p = range.find(sub); p != std::string_view::npos; p = range.find(sub, p + sub.size())) ++c;
  return c;
}

std::string substr(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end) {
  std::vector<size_t> off = code_point_offsets(s);
  int64_t n = static_cast<int64_t>(off.size()) - 1, a, b;
  clamp_range(n, start, end, a, b);
  if (a >= b) return "";
  return std::string(s.substr(off[static_cast<size_t>(a)], off[static_cast<size_t>(b)] - off[static_cast<size_t>(a)]));
}

std::string pad(std::string_view s, int64_t width, std::string_view fill, char align) {
  int64_t len = static_cast<int64_t>(code_point_count(s));
  if (width <= len) return std::string(s);
  int64_t marg = width - len;
  int64_t left = align == '<' ? 0 : align == '>' ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

std::string zfill(std::string_view s, int64_t width) {
  int64_t len = static_cast<int64_t>(code_point_count(s));
  if (width <= len) return std::string(s);
  std::string zeros(static_cast<size_t>(width - len), '0');
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) return std::string(1, s[0]) + zeros + std::string(s.substr(1));
  return zeros + std::string(s);
}

namespace {
template <class F>
bool all_of(std::string_view s, F f) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!f(next_code_point(s, i))) return false;
  return true;
}
}  // namespace

bool isalpha(std::string_view s) { return all_of(s, is_alpha); }
bool isdigit(std::string_view s) { return all_of(s, is_digit); }
bool isnumeric(std::string_view s) { return all_of(s, is_numeric); }
bool isalnum(std::string_view s) { return all_of(s, [](uint32_t c) { return is_alpha(c) || is_numeric(c); }); }
bool isspace(std::string_view s) { return all_of(s, py_isspace); }

bool islower(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_code_point(s, i);
    if (is_upper(c)) return false;
    cased = cased || is_lower(c);
  }
  return cased;
}

bool isupper(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_code_point(s, i);
    if (is_lower(c)) return false;
    cased = cased || is_upper(c);
  }
  return cased;
}

bool istitle(std::string_view s) {
  bool cased = false, prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = next_code_point(s, i);
    if (is_upper(c)) {
      if (prev_cased) return false;
      prev_cased = cased = true;
    } else if (is_lower(c)) {
      if (!prev_cased) return false;
      prev_cased = cased = true;
    } else {
      prev_cased = false;
    }
  }
  return cased;
}

}  // namespace tessera::chat_template::pystr
