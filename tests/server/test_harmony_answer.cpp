// gpt-oss's harmony answers: channels into content, reasoning and tool calls, whole and
// streamed at every split; the marker tokens through the answer stream; what the
// gpt-oss template renders for an earlier call parsing back; the forced-call grammar.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fake_tokenizer.h"
#include "server/answer_stream.h"
#include "server/harmony_answer.h"
#include "server/openai_api.h"
#include "server/tool_call_grammar.h"
#include "server/tool_calls.h"
#include "tessera/chat_template.h"
#include "tessera/grammar.h"
#include "tessera/json_schema_grammar.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "description": "The time.",
   "parameters": {"type": "object", "properties": {}}}}
])");

struct Want {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

struct Case {
  const char* what;
  std::string answer;
  Want want;
  json tools = kTools;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"final only", "<|channel|>final<|message|>Paris.", {"Paris.", "", {}}},
      {"analysis and final",
       "<|channel|>analysis<|message|>The user asks for a capital.<|end|><|start|>assistant<|channel|>final<|message|>"
       "Paris is the capital.",
       {"Paris is the capital.", "The user asks for a capital.", {}}},
      {"call, recipient after the channel",
       "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 2}",
       {"", "Need the weather.", {{"get_weather", R"({"city":"Paris","days":2})"}}}},
      {"call, recipient in the role header",
       " to=functions.get_weather<|channel|>commentary json<|message|>{\"days\": 1, \"city\": \"Oslo\"}",
       {"", "", {{"get_weather", R"({"days":1,"city":"Oslo"})"}}}},
      {"analysis, then a call with the recipient in the role header",
       "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary "
       "<|constrain|>json<|message|>{}",
       {"", "Call it.", {{"get_time", "{}"}}}},
      {"recipient right before <|constrain|>",
       "<|channel|>commentary to=functions.get_time<|constrain|>json<|message|> {} ", {"", "", {{"get_time", "{}"}}}},
      {"call ended by <|call|> in the text",
       "<|channel|>commentary to=functions.get_time<|message|>{}<|call|>", {"", "", {{"get_time", "{}"}}}},
      {"preamble, then a call",
       "<|channel|>commentary<|message|>Let me look that up.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}",
       {"Let me look that up.", "", {{"get_weather", R"({"city":"Rome"})"}}}},
      {"unknown function: its text is content",
       "<|channel|>analysis<|message|>Stocks.<|end|><|start|>assistant<|channel|>commentary to=functions.get_stock "
       "<|constrain|>json<|message|>{\"ticker\": \"X\"}",
       {"{\"ticker\": \"X\"}", "Stocks.", {}}},
      {"malformed JSON: its text is content",
       "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": Paris}",
       {"{\"city\": Paris}", "", {}}},
      {"arguments not an object", "<|channel|>commentary to=functions.get_weather<|message|>[\"Paris\"]",
       {"[\"Paris\"]", "", {}}},
      {"a call without request tools is content",
       "<|channel|>commentary to=functions.get_time<|message|>{}",
       {"{}", "", {}},
       json()},
      {"content after a call is held and kept",
       "<|channel|>commentary to=functions.get_time<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>Done.",
       {"Done.", "", {{"get_time", "{}"}}}},
      {"content after an invalid call: all of it in order",
       "<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>commentary to=functions.nope<|message|>{}"
       "<|end|><|start|>assistant<|channel|>final<|message|>B",
       {"A\n{}\nB", "", {}}},
      {"two analysis messages joined",
       "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
       "<|start|>assistant<|channel|>final<|message|>Three.",
       {"Three.", "One.\nTwo.", {}}},
      {"cut off in a header", "<|channel|>analysis<|message|>Hmm<|end|><|start|>assistant<|channel|>fin",
       {"", "Hmm", {}}},
      {"cut off in the analysis", "<|channel|>analysis<|message|>Let me th", {"", "Let me th", {}}},
      {"not harmony: plain text", "Just text, with a <|channel|> in it.", {"Just text, with a <|channel|> in it.", "", {}}},
      {"not harmony: JSON", "{\"a\": 1}", {"{\"a\": 1}", "", {}}},
      {"text shorter than a header start", "to", {"to", "", {}}},
      {"markers and '<' in the text", "<|channel|>final<|message|>a < b and <|x|> too", {"a < b and <|x|> too", "", {}}},
      {"no channel: content", "<|message|>Hello", {"Hello", "", {}}},
      {"final message ended by <|return|>", "<|channel|>final<|message|>Bye<|return|>", {"Bye", "", {}}},
  };
  return c;
}

void expect(const HarmonyDelta& got, const Want& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].first) << what;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].second) << what;
    EXPECT_EQ(got.calls[i].id.rfind("call_", 0), 0u) << what;
  }
}

TEST(Harmony, WholeAnswers) {
  for (const Case& c : cases()) expect(parse_harmony(c.answer, c.tools), c.want, c.what);
}

// Streamed in pieces: what is sent adds up to the whole parse, content and reasoning
// are never taken back, and no marker reaches either.
HarmonyDelta streamed(const std::string& answer, const json& tools, const std::vector<size_t>& cuts) {
  HarmonyParser p(tools);
  HarmonyDelta all;
  size_t at = 0;
  for (size_t cut : cuts) {
    const HarmonyDelta d = p.push(answer.substr(at, cut - at));
    EXPECT_LE(p.consumed(), cut);
    all.content += d.content;
    all.reasoning += d.reasoning;
    EXPECT_TRUE(d.calls.empty());
    at = cut;
  }
  const HarmonyDelta d = p.push(answer.substr(at));
  const HarmonyDelta rest = p.finish();
  all.content += d.content + rest.content;
  all.reasoning += d.reasoning + rest.reasoning;
  all.calls = rest.calls;
  EXPECT_EQ(p.consumed(), answer.size());
  return all;
}

TEST(Harmony, StreamingAtEveryByteBoundaryMatchesTheWholeParse) {
  for (const Case& c : cases()) {
    for (size_t cut = 0; cut <= c.answer.size(); ++cut)
      expect(streamed(c.answer, c.tools, {cut}), c.want, std::string(c.what) + ", cut at " + std::to_string(cut));
    std::vector<size_t> every;
    for (size_t i = 1; i < c.answer.size(); ++i) every.push_back(i);
    expect(streamed(c.answer, c.tools, every), c.want, std::string(c.what) + ", byte by byte");
  }
}

TEST(Harmony, StreamingSendsReasoningAndContentAsTheyCome) {
  HarmonyParser p(kTools);
  HarmonyDelta d = p.push("<|channel|>analysis<|message|>Thinking");
  EXPECT_EQ(d.reasoning, "Thinking");
  EXPECT_EQ(d.content, "");
  d = p.push(" more<|e");  // a marker's start is held
  EXPECT_EQ(d.reasoning, " more");
  d = p.push("nd|><|start|>assistant<|channel|>final<|message|>Hi");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Hi");
  d = p.push(" there<");
  EXPECT_EQ(d.content, " there");
  d = p.push("3");  // not a marker after all
  EXPECT_EQ(d.content, "<3");
  // A call's text is never sent as it comes: it is known to be a call only at the end.
  HarmonyParser q(kTools);
  d = q.push("<|channel|>commentary to=functions.get_time<|message|>{");
  EXPECT_EQ(d.content + d.reasoning, "");
  d = q.push("}");
  EXPECT_EQ(d.content + d.reasoning, "");
  d = q.finish();
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.content, "");
}

TEST(Harmony, TheTemplateDetectsAsHarmony) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/chat_templates/templates/openai-gpt-oss-120b.jinja";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "chat template fixtures not found";
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(detect_tool_call_format(ss.str()), ToolCallFormat::Harmony);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::Harmony), "harmony");
}

// What the gpt-oss template renders for an earlier call (recipient in the role header)
// parses back into that call, and its thinking into the reasoning.
TEST(Harmony, RoundTripThroughTheTemplate) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/chat_templates/templates/openai-gpt-oss-120b.jinja";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "chat template fixtures not found";
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  ojson vars = ojson::parse(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "thinking": "I should call get_weather.", "tool_calls": [{"id": "c1",
       "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}],
      "add_generation_prompt": false})");
  vars["tools"] = ojson::parse(kTools.dump());
  const std::string out = ChatTemplate(ss.str()).render(vars);
  // The answer starts after the user turn's "<|start|>assistant" and ends before <|call|>.
  const std::string begin = "Weather in Paris?<|end|><|start|>assistant";
  const size_t b = out.find(begin);
  ASSERT_NE(b, std::string::npos) << out;
  const size_t e = out.find("<|call|>", b);
  ASSERT_NE(e, std::string::npos) << out;
  const std::string answer = out.substr(b + begin.size(), e - b - begin.size());
  const HarmonyDelta d = parse_harmony(answer, kTools);
  ASSERT_EQ(d.calls.size(), 1u) << answer;
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(d.calls[0].arguments), json::parse(R"({"city": "Paris", "days": 2})"));
  EXPECT_EQ(d.reasoning, "I should call get_weather.");
  EXPECT_EQ(d.content, "");
}

// The markers are control tokens: the answer stream decodes them with their text for
// the parser, and every token is reported once, with the delta that read it.
TEST(Harmony, AnswerStreamReadsTheMarkerTokens) {
  FakeTokenizer tok({"<ctl>"});
  std::vector<int32_t> ids;
  for (const char* p : {"<|channel|>", "analysis", "<|message|>", "Need", " weather", "<|end|>", "<|start|>",
                        "assistant", "<|channel|>", "commentary", " to", "=functions", ".get", "_weather", " ",
                        "<|constrain|>", "json", "<|message|>", "{\"city\"", ": \"Paris\"}"}) {
    const std::string s = p;
    ids.push_back(s.size() > 4 && s.rfind("<|", 0) == 0 && s.find("|>") == s.size() - 2 ? tok.control(s) : tok.id(s));
  }
  const int32_t call = tok.control("<|call|>");
  EXPECT_EQ(harmony_marker_tokens(tok).size(), 7u - 1u);  // all but <|return|>, which this vocabulary lacks
  (void)call;
  AnswerStream a(tok, {}, ToolCallFormat::Harmony, kTools);
  std::string content, reasoning;
  size_t tokens = 0;
  std::vector<ToolCall> calls;
  for (int32_t id : ids) {
    AnswerDelta d = a.push(id, TokenLogprobs{-1.0f, {}});
    content += d.content;
    reasoning += d.reasoning;
    tokens += d.tokens.size();
  }
  AnswerDelta d = a.finish();
  content += d.content;
  reasoning += d.reasoning;
  tokens += d.tokens.size();
  calls = d.tool_calls;
  EXPECT_EQ(content, "");
  EXPECT_EQ(reasoning, "Need weather");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(tokens, ids.size());
  // The analysis message's tokens, from its header to its <|end|>, are reasoning tokens.
  EXPECT_EQ(a.reasoning_tokens(), 6);
  // Without the format the markers are nothing, as before.
  AnswerStream plain(tok, {}, ToolCallFormat::None);
  std::string text;
  for (int32_t id : ids) text += plain.push(id, std::nullopt).content;
  text += plain.finish().content;
  EXPECT_EQ(text.find("<|"), std::string::npos) << text;
}

TEST(Harmony, ResponsesCarryReasoningContent) {
  const ResponseIds ids{"chatcmpl-1", 7, "m"};
  json r = completion_response(ids, true, "Paris.", "stop", 3, 4, nullptr, {}, "Thinking.");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Thinking.");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Paris.");
  r = completion_response(ids, true, "Paris.", "stop", 3, 4);
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_FALSE(usage_json(3, 4).contains("completion_tokens_details"));
  EXPECT_EQ(usage_json(3, 4, 2)["completion_tokens_details"], json::parse(R"({"reasoning_tokens": 2})"));
  json c = stream_chunk(ids, true, "", nullptr, false, nullptr, {}, "Hmm");
  EXPECT_EQ(c["choices"][0]["delta"], json::parse(R"({"reasoning_content": "Hmm"})"));
}

// ---- the forced-call grammar ----

// A vocabulary of the 256 bytes, the markers as tokens of their own (as the server's
// vocabulary shows them) and an end of generation (<|call|>).
struct HarmonyVocabulary {
  std::vector<std::string> pieces;
  int32_t eog = 0;
  std::shared_ptr<const TokenVocabulary> vocab;
  HarmonyVocabulary() {
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
    for (const char* m : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"}) pieces.push_back(m);
    eog = int32_t(pieces.size());
    pieces.push_back("");
    vocab = std::make_shared<const TokenVocabulary>(pieces, std::vector<int32_t>{eog});
  }
  // The text as tokens: markers as their tokens, everything else byte by byte.
  std::vector<int32_t> tokens(const std::string& text) const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < text.size();) {
      bool marker = false;
      for (int32_t id = 256; id < eog; ++id)
        if (text.compare(i, pieces[size_t(id)].size(), pieces[size_t(id)]) == 0) {
          out.push_back(id);
          i += pieces[size_t(id)].size();
          marker = true;
          break;
        }
      if (!marker) out.push_back(int32_t(static_cast<unsigned char>(text[i++])));
    }
    return out;
  }
};

bool grammar_takes(const std::string& gbnf, const std::string& answer, bool byte_by_byte = false) {
  static const HarmonyVocabulary v;
  GrammarMatcher m(std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), v.vocab));
  std::vector<int32_t> toks;
  if (byte_by_byte)
    for (unsigned char c : answer) toks.push_back(int32_t(c));
  else
    toks = v.tokens(answer);
  for (int32_t t : toks) {
    if (!m.accepts(t)) return false;
    m.accept(t);
  }
  return m.accepts(v.eog);
}

TEST(Harmony, ForcedCallGrammar) {
  const std::string named = tool_call_gbnf(ToolCallFormat::Harmony, kTools, "get_weather", true);
  const std::string any = tool_call_gbnf(ToolCallFormat::Harmony, kTools, "", true);
  const std::string call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
  EXPECT_TRUE(grammar_takes(named, call));
  EXPECT_TRUE(grammar_takes(named, call, true));  // the markers spelled out in bytes read the same
  EXPECT_TRUE(grammar_takes(named, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \"days\": 3}"));
  EXPECT_TRUE(grammar_takes(named, "<|channel|>analysis<|message|>I need the weather, a < b.<|end|><|start|>assistant" + call));
  EXPECT_TRUE(grammar_takes(any, "<|channel|>commentary to=functions.get_time<|message|>{}"));
  // What the grammar refuses: a final answer, another function, arguments off the
  // schema, bare JSON, a marker inside the reasoning.
  EXPECT_FALSE(grammar_takes(named, "<|channel|>final<|message|>Sunny."));
  EXPECT_FALSE(grammar_takes(named, "<|channel|>commentary to=functions.get_time<|message|>{}"));
  EXPECT_FALSE(grammar_takes(named, "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": 3}"));
  EXPECT_FALSE(grammar_takes(named, "<|channel|>commentary to=functions.get_weather<|message|>{\"days\": 3}"));
  EXPECT_FALSE(grammar_takes(named, "{\"city\":\"Paris\"}"));
  EXPECT_FALSE(grammar_takes(named, "<|channel|>analysis<|message|>x<|channel|>final<|end|><|start|>assistant" + call));
  // Everything the grammar takes parses as that call.
  const HarmonyDelta d = parse_harmony(call, kTools);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
}

// response_format on gpt-oss: the JSON is the final message, perhaps after reasoning,
// and parses as the content.
TEST(Harmony, StructuredFinalAnswerGrammar) {
  const std::string g = harmony_final_gbnf(
      json_schema_rules(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})", "answer"),
      "answer");
  EXPECT_TRUE(grammar_takes(g, "<|channel|>final<|message|>{\"n\": 3}"));
  EXPECT_TRUE(grammar_takes(g, "<|channel|>analysis<|message|>Three.<|end|><|start|>assistant<|channel|>final<|message|>{\"n\":3}"));
  EXPECT_FALSE(grammar_takes(g, "{\"n\": 3}"));
  EXPECT_FALSE(grammar_takes(g, "<|channel|>final<|message|>{\"n\": \"3\"}"));
  EXPECT_FALSE(grammar_takes(g, "<|channel|>commentary to=functions.get_time<|message|>{}"));
  const HarmonyDelta d = parse_harmony("<|channel|>analysis<|message|>Three.<|end|><|start|>assistant<|channel|>final<|message|>{\"n\":3}", kTools);
  EXPECT_EQ(d.content, "{\"n\":3}");
  EXPECT_EQ(d.reasoning, "Three.");
}

// The server's vocabulary shows the marker tokens' text to grammars; without that they
// are nothing and a grammar can never choose them.
TEST(Harmony, VocabularyShowsTheMarkers) {
  FakeTokenizer tok({"<ctl>", "x"});
  const int32_t channel = tok.control("<|channel|>");
  for (char c = ' '; c <= '~'; ++c) tok.id(std::string(1, c));
  const auto gbnf = "root ::= \"<|channel|>final\"\n";
  GrammarMatcher shown(std::make_shared<GrammarConstraint>(
      Grammar::parse(gbnf), std::make_shared<const TokenVocabulary>(tok, harmony_marker_tokens(tok))));
  EXPECT_TRUE(shown.accepts(channel));
  GrammarMatcher hidden(std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), std::make_shared<const TokenVocabulary>(tok)));
  EXPECT_FALSE(hidden.accepts(channel));
  EXPECT_TRUE(hidden.accepts(tok.id("<")));
}

}  // namespace
}  // namespace tessera::server
