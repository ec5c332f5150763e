// The Generator under a grammar (llama-q8_0 fixture on cpu_scalar): every generated
// token is one the grammar allows, the generation stops where the grammar is complete,
// a constrained request beside an unconstrained one leaves the other's tokens as they
// were alone, and a grammar that cannot go on fails its own request only.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "tessera/engine.h"
#include "tessera/generator.h"
#include "tessera/grammar.h"
#include "tessera/plugin_registry.h"
#include "tessera/tokenizer.h"

namespace tessera {
namespace {

class GeneratorGrammar : public testing::Test {
 protected:
  void SetUp() override {
    const std::string gguf = std::string(TESSERA_FIXTURES_DIR) + "/models/llama-q8_0.gguf";
    if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " not found (../shared beside the repository)";
    PluginConfig cfg;
    cfg.paths = {TESSERA_PLUGIN_DIR};
    reg_ = std::make_unique<PluginRegistry>(cfg);
    EngineOptions eo;
    eo.model_path = gguf;
    eo.backends = {"cpu_scalar"};
    eo.threads = 2;
    eo.n_ctx = 256;
    eo.max_sequences = 4;
    engine_ = std::make_unique<Engine>(*reg_, eo);
    vocab_ = std::make_shared<const TokenVocabulary>(engine_->tokenizer());
  }
  GenerationRequest request(uint64_t seed, const std::string& gbnf = "") {
    GenerationRequest r;
    r.prompt = {1, 17, 300, 42, 999, 5};
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.max_tokens = 60;
    if (!gbnf.empty()) r.grammar = std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), vocab_);
    return r;
  }
  // Runs the requests together; the events of each, in order.
  std::vector<std::vector<GenerationEvent>> run(std::vector<GenerationRequest> rs) {
    Generator g(*engine_);
    std::vector<uint64_t> ids;
    for (auto& r : rs) ids.push_back(g.add(std::move(r)));
    std::vector<std::vector<GenerationEvent>> out(ids.size());
    while (!g.idle())
      for (auto& ev : g.step())
        for (size_t i = 0; i < ids.size(); ++i)
          if (ids[i] == ev.id) out[i].push_back(std::move(ev));
    return out;
  }
  std::string text(const std::vector<GenerationEvent>& evs) {
    std::string s;
    for (const auto& e : evs)
      if (e.token >= 0) s += engine_->tokenizer().token_to_piece(e.token);
    return s;
  }
  std::unique_ptr<PluginRegistry> reg_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const TokenVocabulary> vocab_;
};

TEST_F(GeneratorGrammar, AnswersMatchAndStopWhereTheGrammarEnds) {
  const std::string gbnf = "root ::= (\"yes\" | \"no\") \", \" [0-9]{2,3} \" \" [a-z]{1,5} \".\"\n";
  const std::regex re("(yes|no), [0-9]{2,3} [a-z]{1,5}\\.");
  std::vector<GenerationRequest> rs;
  for (uint64_t seed = 1; seed <= 4; ++seed) rs.push_back(request(seed, gbnf));
  const auto out = run(std::move(rs));
  for (const auto& evs : out) {
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().finish, FinishReason::Stop) << text(evs);
    EXPECT_GE(evs.back().token, 0) << "the last token is the grammar's, reported";
    EXPECT_TRUE(std::regex_match(text(evs), re)) << text(evs);
  }
  // The same seed again: the same answer.
  EXPECT_EQ(text(run({request(3, gbnf)})[0]), text(out[2]));
}

TEST_F(GeneratorGrammar, AnUnconstrainedNeighbourIsUnchanged) {
  const auto alone = run({request(9)});
  const auto both = run({request(9), request(2, "root ::= [a-z ]{1,40} \".\"\n")});
  ASSERT_EQ(alone[0].size(), both[0].size());
  for (size_t i = 0; i < alone[0].size(); ++i) EXPECT_EQ(alone[0][i].token, both[0][i].token) << i;
  EXPECT_TRUE(std::regex_match(text(both[1]), std::regex("[a-z ]{1,40}\\."))) << text(both[1]);
}

TEST_F(GeneratorGrammar, AGrammarThatCannotGoOnFailsOnlyItsRequest) {
  // A vocabulary where no token spells anything: nothing the grammar allows exists.
  auto empty = std::make_shared<const TokenVocabulary>(std::vector<std::string>(size_t(engine_->n_vocab()), ""),
                                                       std::vector<int32_t>{});
  GenerationRequest stuck = request(1);
  stuck.grammar = std::make_shared<GrammarConstraint>(Grammar::parse("root ::= \"a\"\n"), empty);
  const auto out = run({request(9), stuck});
  ASSERT_EQ(out[1].size(), 1u);
  EXPECT_EQ(out[1][0].finish, FinishReason::Failed);
  EXPECT_NE(out[1][0].error.find("grammar"), std::string::npos) << out[1][0].error;
  EXPECT_EQ(out[0].size(), run({request(9)})[0].size());
}

// A GBNF literal of UTF-8 text, and a class of its code points; false if the text is
// not valid UTF-8 (which no grammar matches).
bool gbnf_of(const std::string& text, std::string& literal, std::string& chars) {
  literal = "\"";
  chars = "[";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + size_t(n) > text.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; ++k) {
      const unsigned char b = static_cast<unsigned char>(text[i + size_t(k)]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    char esc[16];
    std::snprintf(esc, sizeof esc, "\\U%08X", unsigned(cp));
    literal += esc;
    chars += esc;
    i += size_t(n);
  }
  literal += "\"";
  chars += "]";
  return true;
}

std::vector<int32_t> tokens_of(const std::vector<GenerationEvent>& evs) {
  std::vector<int32_t> t;
  for (const auto& e : evs)
    if (e.token >= 0) t.push_back(e.token);
  return t;
}

// Greedy decoding under a grammar that the unconstrained greedy answer satisfies gives
// that answer: the mask never removes the argmax. Two grammars: the answer's own text
// (which also ends the generation there), and any text of the answer's characters.
TEST_F(GeneratorGrammar, GreedyOutputThatSatisfiesTheGrammarIsUnchanged) {
  int checked = 0;
  for (uint64_t prompt_seed = 1; prompt_seed <= 6; ++prompt_seed) {
    GenerationRequest free = request(0);
    free.sampling.temperature = 0.0f;
    free.max_tokens = 40;
    free.prompt = {1, int32_t(100 + prompt_seed * 37), int32_t(200 + prompt_seed * 11), 42};
    // The fixture's random model favours lone bytes, which no grammar matches: bias
    // every token that is not whole characters away (in both runs).
    std::string l, c;
    for (int32_t t = 0; t < int32_t(engine_->n_vocab()); ++t)
      if (!gbnf_of(engine_->tokenizer().token_to_piece(t), l, c)) free.sampling.logit_bias.emplace_back(t, -100.0f);
    const auto plain = tokens_of(run({free})[0]);
    std::string text;
    for (int32_t t : plain) text += engine_->tokenizer().token_to_piece(t);
    std::string literal, chars;
    if (text.empty() || !gbnf_of(text, literal, chars)) continue;  // no grammar matches invalid UTF-8
    for (const std::string& gbnf : {"root ::= " + literal + "\n", "root ::= " + chars + "*\n"}) {
      GenerationRequest constrained = free;
      constrained.grammar = std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), vocab_);
      EXPECT_EQ(tokens_of(run({constrained})[0]), plain) << gbnf;
    }
    ++checked;
  }
  EXPECT_GE(checked, 3) << "too few greedy answers were valid UTF-8 to check";
}

}  // namespace
}  // namespace tessera
