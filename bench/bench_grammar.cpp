// Structured output's cost per sampled token on real vocabularies (the fixtures'
// llama-spm, 32,000 tokens, and qwen2, 151,936): the token mask of each grammar state
// along a JSON answer, computed (cold: a fresh constraint, every state new) or taken
// from the constraint's cache (warm: the same schema again, as repeated requests see
// it). The benchmark argument picks the vocabulary.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_map>
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

constexpr const char* kVocabularies[] = {"llama-spm", "qwen2"};

// The text as the longest vocabulary pieces, left to right: a token path the grammar
// accepts whatever the tokenizer's own rules (SentencePiece would add a leading space).
std::vector<int32_t> longest_match(const TokenVocabulary& v, const std::string& text) {
  std::unordered_map<std::string, int32_t> ids;
  size_t longest = 0;
  for (int32_t t = 0; t < v.size(); ++t)
    if (!v.piece(t).empty() && ids.emplace(v.piece(t), t).second) longest = std::max(longest, v.piece(t).size());
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size();) {
    size_t n = std::min(longest, text.size() - i);
    for (; n > 0; --n)
      if (auto it = ids.find(text.substr(i, n)); it != ids.end()) {
        out.push_back(it->second);
        break;
      }
    if (n == 0) throw std::runtime_error("no token for the byte at " + std::to_string(i));
    i += n;
  }
  return out;
}

const Setup* setup(benchmark::State& state) {
  static std::unique_ptr<Setup> cache[2];
  static std::string errors[2];
  const size_t v = size_t(state.range(0));
  std::unique_ptr<Setup>& s = cache[v];
  std::string& error = errors[v];
  state.SetLabel(kVocabularies[v]);
  if (!s && error.empty()) {
    try {
      auto file = gguf::GgufFile::open(std::string(TESSERA_FIXTURES_DIR) + "/vocab/ggml-vocab-" + kVocabularies[v] +
                                       ".gguf");
      auto x = std::make_unique<Setup>();
      x->tok = Tokenizer::from_metadata(file->metadata());
      x->vocab = std::make_shared<const TokenVocabulary>(*x->tok);
      x->grammar = Grammar::parse(json_schema_to_gbnf(kSchema));
      x->answer = longest_match(*x->vocab, kAnswer);
      s = std::move(x);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!s) state.SkipWithError(("needs the vocabulary fixture: " + error).c_str());
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

BENCHMARK(BM_GrammarVocabularyBuild)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GrammarMaskCold)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GrammarMaskWarm)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
