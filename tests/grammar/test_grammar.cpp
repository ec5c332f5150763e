// GBNF grammars: what they match, how they fail, and the token masks the matcher
// derives from them (checked token by token against a walk of each token's bytes).
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "grammar/grammar_test_util.h"
#include "gguf_reader.h"
#include "tessera/json_schema_grammar.h"
#include "tessera/sampler.h"
#include "tessera/tokenizer.h"

using namespace tessera;
using tessera::test::byte_vocabulary;
using tessera::test::matches;

namespace {

std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(parsed)";
}

}  // namespace

TEST(Gbnf, LiteralsClassesAndAlternatives) {
  const std::string g = "root ::= \"ab\" [0-9] | [^a-z] \"!\"\n";
  EXPECT_TRUE(matches(g, "ab7"));
  EXPECT_TRUE(matches(g, "Q!"));
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_FALSE(matches(g, "q!"));
  EXPECT_FALSE(matches(g, "ab77"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(Gbnf, Repetitions) {
  const std::string g = "root ::= \"x\"* \"-\" [ab]+ \"-\" \"c\"? \"-\" \"d\"{2} \"-\" \"e\"{1,3} \"-\" \"f\"{2,}\n";
  EXPECT_TRUE(matches(g, "-a-c-dd-e-ff"));
  EXPECT_TRUE(matches(g, "xxx-abba--dd-eee-ffff"));
  EXPECT_FALSE(matches(g, "--c-dd-e-ff"));       // + needs one
  EXPECT_FALSE(matches(g, "-a-cc-dd-e-ff"));     // ? at most one
  EXPECT_FALSE(matches(g, "-a-c-d-e-ff"));       // {2} exactly two
  EXPECT_FALSE(matches(g, "-a-c-dd-eeee-ff"));   // {1,3}
  EXPECT_FALSE(matches(g, "-a-c-dd-e-f"));       // {2,}
  EXPECT_TRUE(matches("root ::= (\"ab\" | \"c\"){0,2} \".\"\n", "abc."));
  EXPECT_FALSE(matches("root ::= (\"ab\" | \"c\"){0,2} \".\"\n", "abcab."));
}

TEST(Gbnf, RulesRecursionCommentsAndLines) {
  const std::string g = R"G(# balanced parentheses
root ::= item*   # any number
item ::= "(" root ")"
       | "x"
)G";
  EXPECT_TRUE(matches(g, "(x(x))x()"));
  EXPECT_TRUE(matches(g, ""));
  EXPECT_FALSE(matches(g, "(x"));
  EXPECT_FALSE(matches(g, "x)"));
}

TEST(Gbnf, EscapesAnyCharAndUtf8) {
  EXPECT_TRUE(matches("root ::= \"\\n\\t\\\"\\\\\\x41\\u00e9\"\n", "\n\t\"\\A\xC3\xA9"));
  EXPECT_TRUE(matches("root ::= . . .\n", "a\xE2\x82\xAC\xF0\x9F\x98\x80"));  // a, €, 😀: three code points
  EXPECT_FALSE(matches("root ::= . .\n", "a\xE2\x82\xAC\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches("root ::= [\\u00e0-\\u00ff]+\n", "\xC3\xA9\xC3\xA0"));
  EXPECT_FALSE(matches("root ::= [\\u00e0-\\u00ff]+\n", "\xC3\x89"));  // É is below the range
  EXPECT_FALSE(matches("root ::= .\n", "\xC3"));                      // half a code point
  EXPECT_FALSE(matches("root ::= .+\n", "\xC0\x80"));                 // overlong
  EXPECT_FALSE(matches("root ::= .+\n", "\xED\xA0\x80"));             // surrogate
}

TEST(Gbnf, ErrorsNameTheProblem) {
  EXPECT_NE(parse_error("root ::= foo\n").find("undefined rule 'foo'"), std::string::npos);
  EXPECT_NE(parse_error("start ::= \"a\"\n").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= x \"a\"\nx ::= \"\" | root\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"abc\n").find("unterminated string"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [a-\n").find("line 1"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"\n").find("defined twice"), std::string::npos);
  EXPECT_NE(parse_error("root := \"a\"\n").find("expected '::='"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{3,1}\n").find("below the minimum"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"\\q\"\n").find("unknown escape"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\n\nx ::= ( \"b\"\n").find("expected ')'"), std::string::npos);
}

TEST(GrammarMatcher, CompleteExhaustedAndEndOfGeneration) {
  auto c = std::make_shared<GrammarConstraint>(Grammar::parse("root ::= \"ab\" \"c\"?\n"), byte_vocabulary());
  GrammarMatcher m(c);
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(token_allowed(m.allowed(), 256));  // no end before "ab"
  EXPECT_TRUE(token_allowed(m.allowed(), 'a'));
  EXPECT_FALSE(token_allowed(m.allowed(), 'b'));
  m.accept('a');
  m.accept('b');
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.exhausted());  // "c" may follow
  EXPECT_TRUE(token_allowed(m.allowed(), 256));
  EXPECT_TRUE(token_allowed(m.allowed(), 'c'));
  EXPECT_THROW(m.accept('d'), GrammarError);
  m.accept('c');
  EXPECT_TRUE(m.exhausted());
  const auto mask = m.allowed();
  for (int32_t t = 0; t < 256; ++t) EXPECT_FALSE(token_allowed(mask, t)) << t;
  EXPECT_TRUE(token_allowed(mask, 256));
}

TEST(GrammarMatcher, TokensSpanningAndSplittingCodePoints) {
  // "é" is C3 A9; "€" is E2 82 AC. Tokens cut them anywhere.
  auto vocab = std::make_shared<const TokenVocabulary>(
      std::vector<std::string>{"\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC", "a\xC3", "\xA9\xE2", "x", ""},
      std::vector<int32_t>{8});
  auto c = std::make_shared<GrammarConstraint>(Grammar::parse("root ::= \"a\"? [\\u00e9\\u20ac]+\n"), vocab);
  GrammarMatcher m(c);
  auto allowed = [&] {
    std::vector<int32_t> ids;
    const auto mask = m.allowed();
    for (int32_t t = 0; t < vocab->size(); ++t)
      if (token_allowed(mask, t)) ids.push_back(t);
    return ids;
  };
  EXPECT_EQ(allowed(), (std::vector<int32_t>{0, 2, 3, 5}));  // starts of é or €, or "a" + start of é
  m.accept(5);                                              // "a\xC3"
  EXPECT_EQ(allowed(), (std::vector<int32_t>{1, 6}));       // only the end of é (then maybe €'s start)
  m.accept(6);                                              // "\xA9\xE2"
  EXPECT_FALSE(m.complete());
  EXPECT_EQ(allowed(), (std::vector<int32_t>{}));           // E2 then 82 AC: no single token here is "\x82\xAC"
  EXPECT_FALSE(m.accepts(4));
}

// A grammar whose parses double with every "(" (two alternatives share the prefix,
// and an empty one lets the nesting go on) reaches the automaton's limit: a
// GrammarError that names it, and the matcher keeps the state it had.
TEST(GrammarMatcher, TooAmbiguousGrammarThrowsAndKeepsItsState) {
  auto c = std::make_shared<GrammarConstraint>(
      Grammar::parse("root ::= item (\",\" item)*\n"
                     "item ::= [a-z]+ | \"(\" root \")\" || \"(\" root \")\"  [^\\x00-\\x1f]{1,3}\n"),
      byte_vocabulary());
  GrammarMatcher m(c);
  std::string error;
  int opened = 0;
  try {
    for (; opened < 64; ++opened) {
      ASSERT_TRUE(token_allowed(m.allowed(), '('));
      m.accept('(');
    }
  } catch (const GrammarError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("too ambiguous"), std::string::npos) << "opened " << opened << ": " << error;
  EXPECT_GT(opened, 4);
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accepts(')') || opened == 0);
}

// A prefix that can only end in a surrogate (ED A0-BF) is refused at once: no byte
// could finish it as a character, so allowing it would leave the sequence stuck.
TEST(GrammarMatcher, NoPrefixThatOnlySurrogatesComplete) {
  auto c = std::make_shared<GrammarConstraint>(Grammar::parse("root ::= [^a]+\n"), byte_vocabulary());
  GrammarMatcher m(c);
  m.accept(0xED);
  EXPECT_TRUE(token_allowed(m.allowed(), 0x9F));   // U+D7C0-U+D7FF
  EXPECT_FALSE(token_allowed(m.allowed(), 0xA0));  // U+D800-: surrogates only
  EXPECT_FALSE(token_allowed(m.allowed(), 0xBF));
  m.accept(0x9F);
  EXPECT_TRUE(token_allowed(m.allowed(), 0xBF));
}

// The mask of a real 151k-token vocabulary equals a token-by-token walk of each
// token's bytes, in states inside and outside JSON strings.
TEST(GrammarMatcher, MaskEqualsEachTokensWalkOnQwen2Vocabulary) {
  auto file = gguf::GgufFile::open(std::string(TESSERA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf");
  auto tok = Tokenizer::from_metadata(file->metadata());
  auto vocab = std::make_shared<const TokenVocabulary>(*tok);
  auto grammar = Grammar::parse(json_schema_to_gbnf(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"enum":["a","b"]}}},"required":["name","age"]})"));
  auto c = std::make_shared<GrammarConstraint>(grammar, vocab);
  GrammarMatcher m(c);
  const std::string text = R"({"name": "Ann \"Lee\"", "age": 42, "tags": ["a"]})";
  // Check at several points: the start, inside the string, in the number, at the end.
  const std::vector<size_t> checks = {0, 1, 10, 15, 29, text.size()};
  GrammarMatcher probe(c);
  size_t at = 0;
  for (size_t point : checks) {
    for (; at < point; ++at) m.accept(int32_t(tok->encode(std::string(1, text[at]), false).at(0)));
    const auto mask_span = m.allowed();
    const TokenMask mask(mask_span.begin(), mask_span.end());
    int64_t n_allowed = 0;
    for (int32_t t = 0; t < vocab->size(); ++t) {
      const bool walk = m.accepts(t);
      ASSERT_EQ(token_allowed(mask, t), walk) << "at " << point << ", token " << t << " '" << vocab->piece(t) << "'";
      n_allowed += walk;
    }
    EXPECT_GT(n_allowed, 0) << "at " << point;
  }
  EXPECT_TRUE(m.exhausted());
  EXPECT_GT(c->stats().mask_misses, 0u);
}

TEST(GrammarMatcher, MasksAreCachedAcrossSequencesOfOneConstraint) {
  auto c = std::make_shared<GrammarConstraint>(Grammar::parse("root ::= [a-c]+ \".\"\n"), byte_vocabulary());
  GrammarMatcher a(c), b(c);
  a.allowed();
  b.allowed();
  a.accept('a');
  a.allowed();
  b.accept('b');
  b.allowed();  // the same state as a's after one letter
  const auto s = c->stats();
  EXPECT_EQ(s.mask_misses, 2u);
  EXPECT_EQ(s.mask_hits, 2u);
}

TEST(Sampler, GrammarMaskComesFirst) {
  // Token 2 has the best logit but is not allowed; with a logit bias pushing token 0
  // up, the allowed tokens are 0 and 3.
  std::vector<float> logits = {1.0f, 5.0f, 9.0f, 2.0f};
  TokenMask mask(1, 0);
  mask[0] = (1u << 0) | (1u << 3);
  SamplerParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(Sampler(greedy).sample(logits, mask), 3);
  greedy.logit_bias = {{0, 5.0f}, {2, 100.0f}};
  EXPECT_EQ(Sampler(greedy).sample(logits, mask), 0);
  SamplerParams hot;
  hot.temperature = 1.5f;
  hot.top_k = 0;
  hot.top_p = 1.0f;
  hot.min_p = 0.0f;
  Sampler s(hot);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.sample(logits, mask);
    EXPECT_TRUE(t == 0 || t == 3) << t;
  }
  TokenMask none(1, 0);
  EXPECT_THROW(Sampler(greedy).sample(logits, none), Error);
}
