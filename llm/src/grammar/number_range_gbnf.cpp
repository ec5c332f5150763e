// gbnf::number_range: the decimal text (no exponent) of every number between two
// bounds with fractions, inclusive or not. A number is split by sign into a magnitude;
// a magnitude's integer part takes integer_range, and its fraction digits are walked
// one position at a time while they still equal a bound's digits.
#include <string>
#include <vector>

#include "grammar/gbnf_pieces.h"
#include "tessera/grammar.h"

namespace tessera::gbnf {
namespace {

constexpr size_t kFractionDigits = 16;  // as json-frac

struct MagnitudeBound {
  uint64_t whole = 0;
  std::string frac;  // digits, no trailing zeros
  bool exclusive = false;
};

std::string join(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

// Fraction digits f, 0 <= 0.f < 1, with 0.f >= 0.lo (> when exclusive) where lo is set
// and 0.f <= 0.hi (< when exclusive) where hi is set.
class FractionRange {
 public:
  FractionRange(const MagnitudeBound* lo, const MagnitudeBound* hi) : lo_(lo), hi_(hi) {}

  // The fraction part: nothing, or "." and 1..16 digits. Empty when nothing fits.
  std::optional<std::string> expression() const {
    const auto d = digits(0, lo_ != nullptr, hi_ != nullptr);
    if (!d) return can_stop(0, lo_ != nullptr, hi_ != nullptr) ? std::optional<std::string>("") : std::nullopt;
    const std::string dot = "\".\" " + *d;
    return can_stop(0, lo_ != nullptr, hi_ != nullptr) ? "(" + dot + ")?" : dot;
  }

 private:
  // Ending after i digits that equal lo's first i (tight_lo) and hi's (tight_hi): the
  // value is that prefix followed by zeros.
  bool can_stop(size_t i, bool tight_lo, bool tight_hi) const {
    if (tight_lo && (i < lo_->frac.size() || lo_->exclusive)) return false;  // below lo, or equal and excluded
    if (tight_hi && i >= hi_->frac.size() && hi_->exclusive) return false;  // equal to hi and excluded
    return true;
  }
  static char digit_of(const std::string& s, size_t i) { return i < s.size() ? s[i] : '0'; }

  // One or more digits from position i on.
  std::optional<std::string> digits(size_t i, bool tight_lo, bool tight_hi) const {
    if (i >= kFractionDigits) return std::nullopt;
    const char lo_d = tight_lo ? digit_of(lo_->frac, i) : '0';
    const char hi_d = tight_hi ? digit_of(hi_->frac, i) : '9';
    if (lo_d > hi_d) return std::nullopt;
    std::vector<std::string> alts;
    auto edge = [&](char d, bool lo, bool hi) {
      if (auto r = rest(i + 1, lo, hi)) alts.push_back(std::string("\"") + d + "\"" + (r->empty() ? "" : " " + *r));
    };
    if (tight_lo && tight_hi && lo_d == hi_d) {
      edge(lo_d, true, true);
    } else {
      char first = lo_d, last = hi_d;
      if (tight_lo) edge(lo_d, true, false), ++first;
      if (tight_hi) edge(hi_d, false, true), --last;
      if (first <= last) {
        const size_t more = kFractionDigits - i - 1;
        std::string cls = first == last ? std::string("\"") + first + "\"" : std::string("[") + first + "-" + last + "]";
        if (more > 0) cls += " [0-9]{0," + std::to_string(more) + "}";
        alts.push_back(cls);
      }
    }
    if (alts.empty()) return std::nullopt;
    return join(alts);
  }

  // What may follow i digits: nothing (where the value fits) or more digits. "" for
  // nothing alone; empty optional when neither fits.
  std::optional<std::string> rest(size_t i, bool tight_lo, bool tight_hi) const {
    const bool stop = can_stop(i, tight_lo, tight_hi);
    const auto more = digits(i, tight_lo, tight_hi);
    if (!more) return stop ? std::optional<std::string>("") : std::nullopt;
    return stop ? "(" + *more + ")?" : *more;
  }

  const MagnitudeBound* lo_;
  const MagnitudeBound* hi_;
};

void add(std::vector<std::string>& alts, const std::string& whole, const std::optional<std::string>& frac) {
  if (frac) alts.push_back(frac->empty() ? whole : whole + " " + *frac);
}

// Magnitudes m with m >= lo (> when exclusive) and m <= hi (< when exclusive) if set.
void magnitudes(const MagnitudeBound& lo, const std::optional<MagnitudeBound>& hi, std::vector<std::string>& alts) {
  if (hi && lo.whole > hi->whole) return;
  const std::string lo_whole = "\"" + std::to_string(lo.whole) + "\"";
  if (hi && lo.whole == hi->whole) {
    add(alts, lo_whole, FractionRange(&lo, &*hi).expression());
    return;
  }
  add(alts, lo_whole, FractionRange(&lo, nullptr).expression());
  const std::string any_fraction = "(\".\" [0-9]{1," + std::to_string(kFractionDigits) + "})?";
  if (!hi) {
    alts.push_back(integer_range(int64_t(lo.whole) + 1, std::nullopt) + " " + any_fraction);
    return;
  }
  if (hi->whole - lo.whole >= 2)
    alts.push_back(integer_range(int64_t(lo.whole) + 1, int64_t(hi->whole) - 1) + " " + any_fraction);
  add(alts, "\"" + std::to_string(hi->whole) + "\"", FractionRange(nullptr, &*hi).expression());
}

MagnitudeBound magnitude_of(const DecimalBound& b) {
  std::string frac = b.frac;
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return {b.whole, frac, b.exclusive};
}

bool is_zero(const DecimalBound& b) { return b.whole == 0 && b.frac.find_first_not_of('0') == std::string::npos; }

}  // namespace

std::string number_range(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi) {
  std::vector<std::string> alts;
  const bool lo_negative = lo && lo->negative && !is_zero(*lo);
  const bool hi_negative = hi && hi->negative && !is_zero(*hi);
  // Zero and above.
  if (!hi_negative) {
    const MagnitudeBound m_lo = lo && !lo_negative ? magnitude_of(*lo) : MagnitudeBound{};
    std::optional<MagnitudeBound> m_hi;
    if (hi) m_hi = magnitude_of(*hi);
    magnitudes(m_lo, m_hi, alts);
  }
  // Below zero: "-" then a magnitude above zero.
  if (!lo || lo_negative) {
    MagnitudeBound m_lo{0, "", true};
    if (hi_negative) m_lo = magnitude_of(*hi);
    std::optional<MagnitudeBound> m_hi;
    if (lo) m_hi = magnitude_of(*lo);
    std::vector<std::string> neg;
    magnitudes(m_lo, m_hi, neg);
    if (!neg.empty()) alts.push_back("\"-\" " + join(neg));
  }
  if (alts.empty()) throw GrammarError("JSON schema: the number bounds leave no value");
  return join(alts);
}

}  // namespace tessera::gbnf
