// Structured output's cost per sampled token on a real 151k-token vocabulary (the
// qwen2 fixture): the token mask of each grammar state along a JSON answer, computed
// (cold: a fresh constraint, every state new) or taken from the constraint's cache
// (warm: the same schema again, as repeated requests see it).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "gguf_reader.h"
#include "tessera/grammar.h"
#include "tessera/json_schema_grammar.h"
#include "tessera/tokenizer.h"

namespace {

using namespace tessera;

constexpr const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150},
  "email":{"type":"string"},"tags":{"type":"array","items":{"type":"string"},"maxItems":8},
  "address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
             "required":["street","zip"]}},"required":["name","age","address"]})";
constexpr const char* kAnswer =
    R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry", "engines"], )"
    R"("address": {"street": "12 St James's Square", "zip": "10001"}})";

struct Setup {
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenVocabulary> vocab;
  std::shared_ptr<const Grammar> grammar;
  std::vector<int32_t> answer;
};

const Setup* setup(benchmark::State& state) {
  static std::unique_ptr<Setup> s;
  static std::string error;
  if (!s && error.empty()) {
    try {
      auto file = gguf::GgufFile::open(std::string(TESSERA_FIXTURES_DIR) + "/vocab/ggml-vocab-qwen2.gguf");
      auto x = std::make_unique<Setup>();
      x->tok = Tokenizer::from_metadata(file->metadata());
      x->vocab = std::make_shared<const TokenVocabulary>(*x->tok);
      x->grammar = Grammar::parse(json_schema_to_gbnf(kSchema));
      x->answer = x->tok->encode(kAnswer, false);
      s = std::move(x);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!s) state.SkipWithError(("needs the qwen2 vocabulary fixture: " + error).c_str());
  return s.get();
}

// Walks the answer's tokens, asking for the mask before each.
void walk(const Setup& s, const std::shared_ptr<GrammarConstraint>& c) {
  GrammarMatcher m(c);
  for (int32_t t : s.answer) {
    benchmark::DoNotOptimize(m.allowed().data());
    m.accept(t);
  }
}

void BM_GrammarVocabularyBuild(benchmark::State& state) {
  const Setup* s = setup(state);
  if (!s) return;
  for (auto _ : state) benchmark::DoNotOptimize(TokenVocabulary(*s->tok).size());
  state.counters["tokens"] = double(s->vocab->size());
}

void BM_GrammarMaskCold(benchmark::State& state) {
  const Setup* s = setup(state);
  if (!s) return;
  for (auto _ : state) walk(*s, std::make_shared<GrammarConstraint>(s->grammar, s->vocab));
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(s->answer.size()));
  state.counters["answer_tokens"] = double(s->answer.size());
}

void BM_GrammarMaskWarm(benchmark::State& state) {
  const Setup* s = setup(state);
  if (!s) return;
  auto c = std::make_shared<GrammarConstraint>(s->grammar, s->vocab);
  walk(*s, c);
  for (auto _ : state) walk(*s, c);
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(s->answer.size()));
}

}  // namespace

BENCHMARK(BM_GrammarVocabularyBuild)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GrammarMaskCold)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GrammarMaskWarm)->Unit(benchmark::kMicrosecond);
