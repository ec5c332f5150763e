// Integer bounds as grammar: [lo, hi] split into ranges of equal digit count, each
// written digit by digit (the way range-to-regex tools do it), so that a bounded
// integer field can only be sampled inside its bounds.
#include <string>
#include <vector>

#include "grammar/gbnf_pieces.h"
#include "tessera/grammar.h"

namespace tessera::gbnf {

namespace {

constexpr int kMaxDigits = 19;  // uint64 values up to 10^19 - 1 are written out

std::string digit_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  if (a == '0' && b == '9') return "[0-9]";
  return std::string("[") + a + "-" + b + "]";
}

// Strings x..y of equal length (leading zeros allowed), as alternatives.
void same_length(const std::string& x, const std::string& y, std::vector<std::string>& out, const std::string& prefix) {
  const size_t n = x.size();
  if (n == 0) {
    out.push_back(prefix);
    return;
  }
  if (n == 1) {
    out.push_back(prefix + (prefix.empty() ? "" : " ") + digit_class(x[0], y[0]));
    return;
  }
  const std::string rx = x.substr(1), ry = y.substr(1);
  const std::string sep = prefix.empty() ? "" : " ";
  if (x[0] == y[0]) {
    same_length(rx, ry, out, prefix + sep + digit_class(x[0], x[0]));
    return;
  }
  const std::string nines(n - 1, '9'), zeros(n - 1, '0');
  // A full tail: x[0] followed by anything at least rx, and so on.
  if (rx == zeros) {
    // x[0]..(y[0]-1) or x[0]..y[0] with full tails
    const char top = ry == nines ? y[0] : char(y[0] - 1);
    out.push_back(prefix + sep + digit_class(x[0], top) + " [0-9]{" + std::to_string(n - 1) + "}");
    if (top != y[0]) same_length(zeros, ry, out, prefix + sep + digit_class(y[0], y[0]));
    return;
  }
  same_length(rx, nines, out, prefix + sep + digit_class(x[0], x[0]));
  const char lo = char(x[0] + 1);
  const char hi = ry == nines ? y[0] : char(y[0] - 1);
  if (lo <= hi) out.push_back(prefix + sep + digit_class(lo, hi) + " [0-9]{" + std::to_string(n - 1) + "}");
  if (hi != y[0]) same_length(zeros, ry, out, prefix + sep + digit_class(y[0], y[0]));
}

// Non-negative integers in [a, b] (b absent: unbounded), as alternatives.
void non_negative(uint64_t a, std::optional<uint64_t> b, std::vector<std::string>& out) {
  const std::string sa = std::to_string(a);
  const int da = int(sa.size());
  const int db = b ? int(std::to_string(*b).size()) : kMaxDigits;
  for (int d = da; d <= db; ++d) {
    // [lo, hi] among the d-digit numbers
    std::string lo = d == da ? sa : (d == 1 ? "0" : "1" + std::string(size_t(d - 1), '0'));
    std::string hi = b && d == db ? std::to_string(*b) : std::string(size_t(d), '9');
    if (!b && d == da + 1 && d < kMaxDigits) {  // every longer number at once
      out.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + "," + std::to_string(kMaxDigits - 2) + "}");
      return;
    }
    same_length(lo, hi, out, "");
  }
}

std::string join(const std::vector<std::string>& alts) {
  std::string s;
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return alts.size() > 1 ? "(" + s + ")" : s;
}

}  // namespace

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi)
    throw GrammarError("JSON schema: the integer bounds leave no value (" + std::to_string(*lo) + " > " +
                       std::to_string(*hi) + ")");
  std::vector<std::string> alts;
  // Negative values: "-" then their magnitude in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? uint64_t(-(*hi + 1)) + 1 : 1;
    std::optional<uint64_t> m_hi;
    if (lo) m_hi = uint64_t(-(*lo + 1)) + 1;
    std::vector<std::string> neg;
    non_negative(m_lo, m_hi, neg);
    alts.push_back("\"-\" " + join(neg));
  }
  if (!hi || *hi >= 0) non_negative(lo && *lo > 0 ? uint64_t(*lo) : 0, hi ? std::optional<uint64_t>(uint64_t(*hi)) : std::nullopt, alts);
  return join(alts);
}

}  // namespace tessera::gbnf
