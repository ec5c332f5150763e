// Pieces of GBNF text that the JSON Schema converter puts together.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::gbnf {

// An expression matching the decimal text of every integer in [lo, hi] (absent: no
// bound), without leading zeros or "-0". Throws GrammarError when the range is empty.
std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A bound of a JSON number as decimal text: sign, integer part and fraction digits
// (any number of them).
struct DecimalBound {
  bool negative = false;
  uint64_t whole = 0;
  std::string frac;
  bool exclusive = false;
};

// An expression matching the decimal text of every number in [lo, hi] (absent: no
// bound; an exclusive bound leaves its value out): integer part without leading zeros,
// then up to 16 fraction digits, no exponent, no "-0". Throws GrammarError when the
// range holds no such number. Wholes must be below 2^63.
std::string number_range(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi);

// An expression matching the inside of a JSON string (between the quotes) whose
// decoded text matches the ECMA-262 regular expression `pattern` (unanchored unless it
// starts with ^ / ends with $, as JSON Schema says). `any_char` names the rule of one
// JSON string character. Throws GrammarError for what is not regular (back-references,
// look-around) or not supported, naming it.
std::string regex(std::string_view pattern, const std::string& any_char);

}  // namespace tessera::gbnf
