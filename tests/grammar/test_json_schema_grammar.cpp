// JSON Schema as grammar: texts that satisfy the schema match, texts that break one
// of its rules do not, and unsupported keywords are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/grammar_test_util.h"
#include "tessera/json_schema_grammar.h"

using namespace tessera;
using tessera::test::byte_vocabulary;

namespace {

std::shared_ptr<const Grammar> schema(const std::string& s) { return Grammar::parse(json_schema_to_gbnf(s)); }
bool ok(const std::shared_ptr<const Grammar>& g, const std::string& text) { return tessera::test::matches(g, text); }

std::string refusal(const std::string& s) {
  try {
    json_schema_to_gbnf(s);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(JsonSchemaGrammar, AnyJsonObject) {
  auto g = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(ok(g, R"({})"));
  EXPECT_TRUE(ok(g, R"({"a": [1, 2.5e-3, {"b": null}], "c": "x\"y\u00e9"})"));
  EXPECT_TRUE(ok(g, "{\n  \"a\": true\n}"));
  EXPECT_FALSE(ok(g, R"([1])"));
  EXPECT_FALSE(ok(g, R"({"a": 01})"));
  EXPECT_FALSE(ok(g, R"({"a": "tab	inside"})"));  // a raw control character
  EXPECT_FALSE(ok(g, R"({"a": 1,})"));
  EXPECT_FALSE(ok(g, R"( {})"));  // the value comes first
}

TEST(JsonSchemaGrammar, RequiredOptionalAndOrderOfProperties) {
  auto g = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},
                      "c":{"type":"string"}},"required":["a","c"],"additionalProperties":false})");
  EXPECT_TRUE(ok(g, R"({"a": 1, "c": "x"})"));
  EXPECT_TRUE(ok(g, R"({"a":1,"b":false,"c":""})"));
  EXPECT_FALSE(ok(g, R"({"a": 1})"));                 // c is required
  EXPECT_FALSE(ok(g, R"({"c": "x", "a": 1})"));       // the schema's order
  EXPECT_FALSE(ok(g, R"({"a": 1, "c": "x", "d": 2})"));
  EXPECT_FALSE(ok(g, R"({"a": "1", "c": "x"})"));     // a is an integer
  auto all_optional = schema(R"({"type":"object","properties":{"x":{"type":"null"},"y":{"type":"null"}}})");
  EXPECT_TRUE(ok(all_optional, "{}"));
  EXPECT_TRUE(ok(all_optional, R"({"y": null})"));
  EXPECT_TRUE(ok(all_optional, R"({"x": null, "y": null})"));
  EXPECT_FALSE(ok(all_optional, R"({"x": null,})"));
  EXPECT_FALSE(ok(all_optional, R"({, "y": null})"));
  EXPECT_FALSE(ok(all_optional, R"({"z": null})"));  // no additionalProperties: none
}

TEST(JsonSchemaGrammar, AdditionalProperties) {
  auto g = schema(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
                      "additionalProperties":{"type":"string"}})");
  EXPECT_TRUE(ok(g, R"({"id": 3})"));
  EXPECT_TRUE(ok(g, R"({"id": 3, "k": "v", "k2": "w"})"));
  EXPECT_FALSE(ok(g, R"({"id": 3, "k": 4})"));
  auto none = schema(R"({"type":"object","properties":{}})");
  EXPECT_TRUE(ok(none, "{}"));
  EXPECT_FALSE(ok(none, R"({"a": 1})"));
  auto map = schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(ok(map, R"({})"));
  EXPECT_TRUE(ok(map, R"({"a": 1, "b": -2})"));
  EXPECT_FALSE(ok(map, R"({"a": true})"));
}

TEST(JsonSchemaGrammar, ArraysWithBoundsAndPrefixItems) {
  auto g = schema(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(ok(g, "[1]"));
  EXPECT_TRUE(ok(g, "[1, 2]"));
  EXPECT_TRUE(ok(g, "[1,2,3]"));
  EXPECT_FALSE(ok(g, "[1,2,3,4]"));
  EXPECT_FALSE(ok(g, "[1,\"2\"]"));
  auto any = schema(R"({"type":"array"})");
  EXPECT_TRUE(ok(any, "[]"));
  EXPECT_TRUE(ok(any, "[1, \"a\", [null]]"));
  auto tuple = schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"number"}],"items":false})");
  EXPECT_TRUE(ok(tuple, R"(["a", 1.5])"));
  EXPECT_TRUE(ok(tuple, R"(["a"])"));
  EXPECT_FALSE(ok(tuple, R"(["a", 1.5, 2])"));
  EXPECT_FALSE(ok(tuple, R"([1.5])"));
  auto at_most_one = schema(R"({"type":"array","maxItems":1})");
  EXPECT_TRUE(ok(at_most_one, "[]"));
  EXPECT_TRUE(ok(at_most_one, "[true]"));
  EXPECT_FALSE(ok(at_most_one, "[true, false]"));
}

// Every integer around the bounds, exhaustively, against the bounds themselves.
TEST(JsonSchemaGrammar, IntegerBoundsExactly) {
  struct Case {
    const char* schema;
    int64_t lo, hi;  // the allowed range; INT64 extremes mean unbounded
  };
  const Case cases[] = {
      {R"({"type":"integer","minimum":0,"maximum":150})", 0, 150},
      {R"({"type":"integer","minimum":-37,"maximum":1234})", -37, 1234},
      {R"({"type":"integer","minimum":-500,"maximum":-20})", -500, -20},
      {R"({"type":"integer","minimum":7,"maximum":7})", 7, 7},
      {R"({"type":"integer","exclusiveMinimum":9,"exclusiveMaximum":1001})", 10, 1000},
      {R"({"type":"integer","minimum":95})", 95, INT64_MAX},
      {R"({"type":"integer","maximum":-3})", INT64_MIN, -3},
      {R"({"type":"integer","minimum":1.5,"maximum":20.5})", 2, 20},
  };
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    for (int64_t v = -2000; v <= 2000; ++v) {
      const bool in = v >= c.lo && v <= c.hi;
      ASSERT_EQ(ok(g, std::to_string(v)), in) << c.schema << " value " << v;
    }
    EXPECT_FALSE(ok(g, "-0")) << c.schema;
    EXPECT_FALSE(ok(g, "0" + std::to_string(c.lo > 0 && c.lo < 2000 ? c.lo : 1))) << c.schema;  // leading zero
    EXPECT_FALSE(ok(g, "1.0")) << c.schema;
    if (c.hi == INT64_MAX) {
      EXPECT_TRUE(ok(g, "123456789012345")) << c.schema;
    }
    if (c.lo == INT64_MIN) {
      EXPECT_TRUE(ok(g, "-123456789012345")) << c.schema;
    }
  }
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":4})").find("no value"), std::string::npos);
}

// Bounds past what an int64 holds (found by fuzzing): no bound on their open side,
// nothing left on the other, and never an out-of-range conversion.
TEST(JsonSchemaGrammar, IntegerBoundsBeyondSixteenDigits) {
  auto open_below = schema(R"({"type":"integer","minimum":-1.25e102,"maximum":3})");
  EXPECT_TRUE(ok(open_below, "-1234567890123456"));
  EXPECT_TRUE(ok(open_below, "3"));
  EXPECT_FALSE(ok(open_below, "4"));
  auto open_above = schema(R"({"type":"integer","exclusiveMinimum":-1,"exclusiveMaximum":1e300})");
  EXPECT_TRUE(ok(open_above, "0"));
  EXPECT_TRUE(ok(open_above, "9999999999999999"));
  EXPECT_FALSE(ok(open_above, "-1"));
  for (const char* s : {R"({"type":"integer","minimum":1.25e102})", R"({"type":"integer","maximum":-1e20})",
                        R"({"type":"integer","exclusiveMinimum":1e16})", R"({"type":"integer","exclusiveMaximum":-9.3e18})"})
    EXPECT_NE(refusal(s).find("no value"), std::string::npos) << s;
}

TEST(JsonSchemaGrammar, NumberBounds) {
  auto g = schema(R"({"type":"number","minimum":-2,"maximum":3})");
  for (const char* yes : {"0", "3", "3.0", "3.000", "2.999", "-2", "-2.00", "-1.5", "0.25", "1"}) EXPECT_TRUE(ok(g, yes)) << yes;
  for (const char* no : {"3.01", "4", "-2.5", "-3", "10", "1e2", "-0.5e1"}) EXPECT_FALSE(ok(g, no)) << no;
  auto non_negative = schema(R"({"type":"number","minimum":0})");
  EXPECT_TRUE(ok(non_negative, "12.75"));
  EXPECT_FALSE(ok(non_negative, "-0.1"));
  EXPECT_NE(refusal(R"({"type":"number","minimum":3,"maximum":2})").find("no value"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","exclusiveMinimum":2,"exclusiveMaximum":2})").find("no value"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","minimum":"1"})").find("must be a number"), std::string::npos);
}

namespace {

// The decimal texts of numbers around the bounds under test: every value of 0..3 digits
// and 0..3 fraction digits in [-25, 25] would be too many; these are the integers -25..25
// with fractions .0 .00 .05 .1 .25 .249 .251 .5 .75 .9 .99 .999 and .0001, both signs,
// and the "-0" forms.
std::vector<std::string> number_texts() {
  std::vector<std::string> out{"-0", "-0.0", "-0.00", "0", "0.0"};
  const char* fracs[] = {"", ".0", ".00", ".05", ".1", ".25", ".249", ".251", ".5", ".75", ".9", ".99", ".999", ".0001"};
  for (int w = 0; w <= 25; ++w)
    for (const char* f : fracs) {
      const std::string t = std::to_string(w) + f;
      out.push_back(t);
      if (w != 0 || std::string(f).find_first_not_of(".0") != std::string::npos) out.push_back("-" + t);
    }
  return out;
}

}  // namespace

// Bounds with fractions, inclusive and exclusive, on either side of zero: a text
// matches exactly when its value lies within them (values compared as doubles; the
// texts have few digits, so no two of them round to the same double).
TEST(JsonSchemaGrammar, NumberBoundsWithFractionsExactly) {
  struct Case {
    const char* schema;
    double lo, hi;
    bool lo_excl, hi_excl;
  };
  const double inf = INFINITY;
  const Case cases[] = {
      {R"({"type":"number","minimum":0.5})", 0.5, inf, false, false},
      {R"({"type":"number","minimum":0.25,"maximum":2.75})", 0.25, 2.75, false, false},
      {R"({"type":"number","exclusiveMinimum":0.25,"exclusiveMaximum":2.75})", 0.25, 2.75, true, true},
      {R"({"type":"number","minimum":-2.5,"maximum":3.25})", -2.5, 3.25, false, false},
      {R"({"type":"number","exclusiveMinimum":-2.5,"maximum":-0.25})", -2.5, -0.25, true, false},
      {R"({"type":"number","minimum":-20.75,"exclusiveMaximum":-3})", -20.75, -3, false, true},
      {R"({"type":"number","exclusiveMinimum":0})", 0, inf, true, false},
      {R"({"type":"number","exclusiveMaximum":0})", -inf, 0, false, true},
      {R"({"type":"number","maximum":0.999})", -inf, 0.999, false, false},
      {R"({"type":"number","minimum":1.25,"maximum":1.25})", 1.25, 1.25, false, false},
      {R"({"type":"number","minimum":1.249,"exclusiveMaximum":1.251})", 1.249, 1.251, false, true},
      {R"({"type":"number","minimum":0.0001,"maximum":0.05})", 0.0001, 0.05, false, false},
      {R"({"type":"number","minimum":-0.999,"maximum":-0.0001})", -0.999, -0.0001, false, false},
      {R"({"type":"number","minimum":-1,"exclusiveMinimum":-1,"maximum":5,"exclusiveMaximum":4.5})", -1, 4.5, true, true},
      {R"({"type":"number","minimum":-7.5,"maximum":1e300})", -7.5, inf, false, false},
  };
  const auto texts = number_texts();
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    int inside = 0;
    for (const std::string& t : texts) {
      const double v = std::stod(t);
      const bool want = (c.lo_excl ? v > c.lo : v >= c.lo) && (c.hi_excl ? v < c.hi : v <= c.hi) &&
                        !(t[0] == '-' && v == 0);  // "-0" is written "0"
      inside += want;
      EXPECT_EQ(ok(g, t), want) << c.schema << " on " << t;
    }
    EXPECT_GT(inside, 0) << c.schema;
  }
  // Beyond the texts above: long fractions right at a bound.
  auto g = schema(R"({"type":"number","exclusiveMinimum":0.1,"maximum":0.3})");
  for (const char* yes : {"0.1000000000000001", "0.2999999999999999", "0.3", "0.3000000000000000", "0.11"})
    EXPECT_TRUE(ok(g, yes)) << yes;
  for (const char* no : {"0.1", "0.10", "0.1000000000000000", "0.3000000000000001", "0.31", "0.09999", "0.10000000000000001", "0.20000000000000001"})
    EXPECT_FALSE(ok(g, no)) << no;
}

TEST(JsonSchemaGrammar, StringsPatternsFormatsAndLengths) {
  auto code = schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})");
  EXPECT_TRUE(ok(code, R"("AB-123")"));
  EXPECT_FALSE(ok(code, R"("AB-12")"));
  EXPECT_FALSE(ok(code, R"("xAB-123")"));
  auto contains = schema(R"({"type":"string","pattern":"ab|cd"})");  // unanchored
  EXPECT_TRUE(ok(contains, R"("xxcdyy")"));
  EXPECT_FALSE(ok(contains, R"("xxyy")"));
  auto quote = schema(R"({"type":"string","pattern":"^a\"b.$"})");
  EXPECT_TRUE(ok(quote, R"("a\"bz")"));
  EXPECT_TRUE(ok(quote, R"("a\"b\n")"));  // "." is any JSON string character, escapes included
  EXPECT_FALSE(ok(quote, R"("a"bz")"));
  auto date = schema(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(ok(date, R"("2026-11-28")"));
  EXPECT_FALSE(ok(date, R"("2026-13-01")"));
  auto uuid = schema(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(ok(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(ok(uuid, R"("123e4567-e89b-12d3-a456-42661417400")"));
  auto dt = schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(ok(dt, R"("2026-11-28T13:45:00Z")"));
  EXPECT_TRUE(ok(dt, R"("2026-11-28T13:45:00.123+01:00")"));
  auto len = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(ok(len, R"("a")"));
  EXPECT_TRUE(ok(len, R"("ab")"));
  EXPECT_TRUE(ok(len, R"("a\u00e9c")"));  // an escape is one character
  EXPECT_FALSE(ok(len, R"("abcd")"));
}

TEST(JsonSchemaGrammar, EnumConstAnyOfAndTypeLists) {
  auto e = schema(R"({"enum":["red", 3, null, {"k":[1]}]})");
  EXPECT_TRUE(ok(e, R"("red")"));
  EXPECT_TRUE(ok(e, "3"));
  EXPECT_TRUE(ok(e, "null"));
  EXPECT_TRUE(ok(e, R"({"k":[1]})"));
  EXPECT_FALSE(ok(e, R"("blue")"));
  auto c = schema(R"({"const":"yes"})");
  EXPECT_TRUE(ok(c, R"("yes")"));
  EXPECT_FALSE(ok(c, R"("no")"));
  auto a = schema(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"boolean"}}]})");
  EXPECT_TRUE(ok(a, "12"));
  EXPECT_TRUE(ok(a, "[true]"));
  EXPECT_FALSE(ok(a, "\"12\""));
  auto t = schema(R"({"type":["string","null"]})");
  EXPECT_TRUE(ok(t, "null"));
  EXPECT_TRUE(ok(t, R"("s")"));
  EXPECT_FALSE(ok(t, "1"));
}

TEST(JsonSchemaGrammar, RecursiveReferences) {
  auto tree = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}},
      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(ok(tree, R"({"v": 1, "kids": []})"));
  EXPECT_TRUE(ok(tree, R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": []}]}, {"v": 4, "kids": []}]})"));
  EXPECT_FALSE(ok(tree, R"({"v": 1, "kids": [{"v": 2}]})"));
  auto self = schema(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
                         "required":["next"]})");
  EXPECT_TRUE(ok(self, R"({"next": {"next": null}})"));
  EXPECT_FALSE(ok(self, R"({"next": {}})"));
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(refusal(R"({"type":"integer","multipleOf":3})").find("'multipleOf'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","patternProperties":{}})").find("'patternProperties'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"email"})").find("'email'"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"http://example.com/s.json"})").find("'$ref'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","pattern":"(a)\\1"})").find("back-references"), std::string::npos);
  EXPECT_NE(refusal(R"J({"type":"string","pattern":"a(?=b)"})J").find("look-around"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"thing"})").find("'thing'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","required":["x"]})").find("'x'"), std::string::npos);
  EXPECT_NE(refusal("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("false").find("matches nothing"), std::string::npos);
}

// Random walks through the masks of a schema's grammar end in JSON the schema accepts.
TEST(JsonSchemaGrammar, RandomConstrainedTextsAreValid) {
  const std::string s = R"({"type":"object","properties":{"n":{"type":"integer","minimum":-5,"maximum":5},
      "s":{"enum":["x","y"]},"l":{"type":"array","items":{"type":"boolean"},"maxItems":2}},
      "required":["n","l"],"additionalProperties":false})";
  // Multi-byte tokens beside the bytes, so that walks also cross token boundaries.
  std::vector<std::string> pieces;
  for (int b = 32; b < 127; ++b) pieces.push_back(std::string(1, char(b)));
  for (const char* p : {"{\"", "\": ", "\"n\"", "true", "false", ", ", "[]", "\"x\"", "}"}) pieces.push_back(p);
  pieces.push_back("");
  const int32_t eog = int32_t(pieces.size() - 1);
  auto vocab = std::make_shared<const TokenVocabulary>(pieces, std::vector<int32_t>{eog});
  auto c = std::make_shared<GrammarConstraint>(Grammar::parse(json_schema_to_gbnf(s)), vocab);
  std::mt19937 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 300; ++walk) {
    GrammarMatcher m(c);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 200 && !ended; ++step) {
      std::vector<int32_t> allowed;
      const auto mask = m.allowed();
      for (int32_t t = 0; t < vocab->size(); ++t)
        if (token_allowed(mask, t)) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << text;
      // Prefer ending, and closing tokens, so that walks finish.
      int32_t pick = allowed[rng() % allowed.size()];
      if (token_allowed(mask, eog)) pick = eog;
      if (pick == eog || m.exhausted()) {
        ended = true;
        break;
      }
      m.accept(pick);
      text += vocab->piece(pick);
      if (m.exhausted()) ended = true;
    }
    if (!ended) continue;
    ++finished;
    const auto j = nlohmann::json::parse(text);  // throws if not JSON
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("n") && j["n"].is_number_integer()) << text;
    EXPECT_GE(j["n"].get<int>(), -5) << text;
    EXPECT_LE(j["n"].get<int>(), 5) << text;
    ASSERT_TRUE(j.contains("l") && j["l"].is_array() && j["l"].size() <= 2) << text;
    for (const auto& b : j["l"]) EXPECT_TRUE(b.is_boolean()) << text;
    if (j.contains("s")) {
      EXPECT_TRUE(j["s"] == "x" || j["s"] == "y") << text;
    }
    for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "n" || k == "s" || k == "l") << text;
  }
  EXPECT_GT(finished, 100);
}
