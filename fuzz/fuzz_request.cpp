// libFuzzer target: any bytes as the JSON body of POST /v1/completions, POST
// /v1/chat/completions, /tokenize, /detokenize, Anthropic's /v1/messages and
// /v1/messages/count_tokens, and /v1/responses, through the server's request parsers (sampling parameters,
// stop strings, logprobs, tools, messages rendered by a ChatML template with tools).
// The only allowed failures are a JSON parse error and an ApiError (a 4xx answer);
// an accepted request must be one the engine can run: its prompt and answer fit the
// context, max_tokens is within --max-tokens-limit, the sampling values are in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "server/anthropic_api.h"
#include "server/chat_prompt.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/tokenize_api.h"
#include "tessera/tokenizer.h"

namespace {

// One token per byte (id = byte + 1), id 0 the end of text: prompts as long as
// their text, so the context checks see real lengths.
class ByteTokenizer : public tessera::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(0);
    for (unsigned char c : text) ids.push_back(int32_t(c) + 1);
    return ids;
  }
  std::vector<int32_t> encode_with_special(std::string_view text, bool add_bos) const override {
    return encode(text, add_bos);
  }
  std::string token_to_piece(int32_t id, bool show_special) const override {
    if (id <= 0) return show_special ? "<|endoftext|>" : "";
    return std::string(1, char(id - 1));
  }
  int32_t n_vocab() const override { return 257; }
  int32_t bos() const override { return -1; }
  int32_t eos() const override { return 0; }
  bool add_bos_default() const override { return false; }
  bool is_end_of_generation(int32_t id) const override { return id == 0; }
  std::string model_name() const override { return "bytes"; }
};

// Qwen2.5's way of writing tools and tool calls, shortened.
constexpr const char* kTemplate = R"({%- if tools %}<|im_start|>system
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.content is string %}{% set content = message.content %}{% else %}{% set content = '' %}{% endif %}
<|im_start|>{{ message.role }}
{{ content }}
{%- if message.tool_calls %}{% for call in message.tool_calls %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{%- endfor %}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %})";

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "accepted request breaks an invariant: %s\n", what);
    std::abort();
  }
}

void check_request(const tessera::server::ParsedRequest& r, const tessera::server::ModelContext& m,
                   size_t max_stops = 4) {
  const auto& g = r.gen;
  check(!g.prompt.empty(), "empty prompt");
  for (int32_t id : g.prompt) check(id >= 0 && id < m.n_vocab, "prompt token outside the vocabulary");
  check(g.max_tokens >= 1, "max_tokens < 1");
  check(int64_t(g.prompt.size()) + g.max_tokens <= m.n_ctx, "prompt + max_tokens beyond the context");
  check(g.max_tokens <= m.max_tokens_limit, "max_tokens beyond --max-tokens-limit");
  const auto& s = g.sampling;
  check(s.temperature >= 0 && s.temperature <= 2, "temperature");
  check(s.top_p > 0 && s.top_p <= 1, "top_p");
  check(s.min_p >= 0 && s.min_p <= 1, "min_p");
  check(s.top_k >= 0, "top_k");
  check(s.repeat_penalty > 0, "repeat_penalty");
  for (const auto& [id, bias] : s.logit_bias) check(id >= 0 && id < m.n_vocab && bias >= -100 && bias <= 100, "logit_bias");
  check(g.logprobs >= -1 && g.logprobs <= tessera::server::kMaxTopLogprobs, "logprobs");
  check(r.stop.size() <= max_stops, "more stop strings than allowed");
  if (g.grammar) {
    // A few steps through the grammar: every token its mask allows is accepted. A
    // grammar too ambiguous to follow throws GrammarError, which the generator turns
    // into the end of that request alone (GeneratorGrammar.AGrammarThatCannotGoOn...).
    tessera::GrammarMatcher matcher(g.grammar);
    try {
      for (int step = 0; step < 16 && !matcher.exhausted(); ++step) {
        const auto mask = matcher.allowed();
        int32_t next = -1;
        for (int32_t t = 0; t < m.n_vocab && next < 0; ++t)
          if (tessera::token_allowed(mask, t) && !m.tokenizer->is_end_of_generation(t)) next = t;
        if (next < 0) break;
        check(matcher.accepts(next), "a token the grammar's mask allows is refused");
        matcher.accept(next);
      }
    } catch (const tessera::GrammarError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ByteTokenizer tokenizer;
  static const tessera::server::ModelContext model = [] {
    tessera::server::ModelContext m;
    m.tokenizer = &tokenizer;
    m.n_vocab = tokenizer.n_vocab();
    m.n_ctx = 4096;
    m.max_tokens_limit = 1000;
    m.model_id = "fuzz";
    m.render_chat = tessera::server::make_chat_renderer(kTemplate, tokenizer);
    m.tool_format = tessera::server::ToolCallFormat::Hermes;
    m.grammars = std::make_shared<tessera::server::GrammarCache>(std::make_shared<const tessera::TokenVocabulary>(tokenizer));
    return m;
  }();
  const std::string body(reinterpret_cast<const char*>(data), size);
  tessera::server::RequestJson body_json;
  try {
    body_json = tessera::server::RequestJson::parse(body);
  } catch (const nlohmann::json::exception&) {
    return 0;  // the server's 400 invalid_json
  }
  for (int route = 0; route < 7; ++route) {
    try {
      switch (route) {
        case 0: check_request(tessera::server::parse_completion_request(body_json, model), model); break;
        case 1: check_request(tessera::server::parse_chat_request(body_json, model), model); break;
        case 2: (void)tessera::server::tokenize_response(body_json, model); break;
        case 3: (void)tessera::server::detokenize_response(body_json, model); break;
        case 4: check_request(tessera::server::parse_messages_request(body_json, model), model, 64); break;
        case 5: (void)tessera::server::parse_messages_request(body_json, model, true); break;
        default: check_request(tessera::server::parse_responses_request(body_json, model), model); break;
      }
    } catch (const tessera::server::ApiError& e) {
      check(e.status >= 400 && e.status < 500, "an ApiError that is not a 4xx");
    } catch (const nlohmann::json::exception& e) {
      // A field of an unexpected type that the parser read without checking: the
      // handler turns it into a 400 too, but the parser should have said which field.
      std::fprintf(stderr, "unchecked JSON access: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
