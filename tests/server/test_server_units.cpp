// The server's answer pipeline without a model: tool-call parsing in the template
// families' formats (including text the real templates render for earlier calls),
// the streaming filter, stop strings and UTF-8 against per-token log-probabilities,
// and the logprobs JSON of both endpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "server/answer_stream.h"
#include "server/exchange.h"
#include "server/harmony_answer.h"
#include "server/grammar_cache.h"
#include "server/openai_api.h"
#include "server/tool_calls.h"
#include "fake_tokenizer.h"
#include "tessera/chat_template.h"
#include "tessera/tokenizer.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
])");

// ---- tool-call parsing ----

TEST(ToolCalls, HermesJsonBlocks) {
  const std::string text =
      "I will look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const ToolCallResult r = parse_tool_calls(ToolCallFormat::Hermes, text, kTools);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.content, "I will look both up.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");  // the model's key order
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ToolCalls, HermesVariants) {
  // Only a call: no content. Arguments given as a string holding JSON. No closing tag at the end.
  auto r = parse_tool_calls(ToolCallFormat::Hermes,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}",
                            kTools);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  // "parameters" instead of "arguments"; no arguments at all.
  r = parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"get_time\"}</tool_call>", kTools);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  // Not calls: plain text, invalid JSON, an unknown function, arguments that are not an object,
  // one bad call among good ones.
  for (const char* text : {"Just an answer.", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
                           "<tool_call>{\"name\": \"launch_missiles\", \"arguments\": {}}</tool_call>",
                           "<tool_call>{\"name\": \"get_weather\", \"arguments\": [1, 2]}</tool_call>",
                           "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call><tool_call>{oops}</tool_call>",
                           "<tool_call>"})
    EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Hermes, text, kTools).found) << text;
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::None, "<tool_call>{\"name\": \"get_time\"}</tool_call>", kTools).found);
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"get_time\"}</tool_call>", json()).found);
}

TEST(ToolCalls, QwenXmlBody) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=unit>\n42\n</parameter>\n</function>\n</tool_call>";
  const ToolCallResult r = parse_tool_calls(ToolCallFormat::Hermes, text, kTools);
  ASSERT_TRUE(r.found);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // "days" is an integer in the schema; "unit" a string even if it looks like a number.
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"New York","days":3,"unit":"42"})");
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Hermes,
                                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
                                kTools).found);
}

TEST(ToolCalls, Llama3AndMistral) {
  auto r = parse_tool_calls(ToolCallFormat::Llama3Json,
                            "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", kTools);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Llama3Json, "The weather is {\"sunny\"}", kTools).found);
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Llama3Json, "{\"name\": \"get_weather\"} and more", kTools).found);
  r = parse_tool_calls(ToolCallFormat::Mistral,
                       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}, \"id\": \"abcDEF123\"},"
                       " {\"name\": \"get_time\", \"arguments\": {}}]",
                       kTools);
  ASSERT_TRUE(r.found);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "abcDEF123");
  EXPECT_EQ(r.calls[1].id.size(), 9u);  // Mistral's template wants 9-character ids
  EXPECT_FALSE(parse_tool_calls(ToolCallFormat::Mistral, "[1, 2, 3]", kTools).found);
}

std::string fixture_template(const std::string& name) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/chat_templates/templates/" + name + ".jinja";
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ToolCalls, FormatFromTheTemplate) {
  if (!std::filesystem::exists(std::string(TESSERA_FIXTURES_DIR) + "/chat_templates"))
    GTEST_SKIP() << "chat template fixtures not found";
  const std::map<std::string, ToolCallFormat> want = {
      {"Qwen-Qwen2.5-7B-Instruct", ToolCallFormat::Hermes},   {"Qwen-Qwen3-0.6B", ToolCallFormat::Hermes},
      {"Qwen3.5-4B", ToolCallFormat::Hermes},                 {"meta-llama-Llama-3.1-8B-Instruct", ToolCallFormat::Llama3Json},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolCallFormat::Mistral}, {"google-gemma-2-2b-it", ToolCallFormat::None},
      {"microsoft-Phi-3.5-mini-instruct", ToolCallFormat::None}};
  for (const auto& [name, f] : want)
    EXPECT_EQ(detect_tool_call_format(fixture_template(name)), f) << name;
}

// What a template renders for an earlier assistant tool call is what its model writes:
// parsing that text gives the call back.
TEST(ToolCalls, RoundTripThroughTheRealTemplates) {
  if (!std::filesystem::exists(std::string(TESSERA_FIXTURES_DIR) + "/chat_templates"))
    GTEST_SKIP() << "chat template fixtures not found";
  struct Case {
    const char* name;
    const char* begin;  // the assistant turn starts after the last of these
    const char* end;    // and ends before this
  };
  for (const Case& c : {Case{"Qwen-Qwen3-0.6B", "<|im_start|>assistant\n", "<|im_end|>"},
                        Case{"Qwen-Qwen2.5-7B-Instruct", "<|im_start|>assistant\n", "<|im_end|>"},
                        Case{"Qwen3.5-4B", "<|im_start|>assistant\n", "<|im_end|>"},
                        Case{"meta-llama-Llama-3.1-8B-Instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n",
                             "<|eot_id|>"},
                        Case{"mistralai-Mistral-Nemo-Instruct-2407", "[TOOL_CALLS]", "</s>"}}) {
    const std::string tmpl = fixture_template(c.name);
    ojson vars = ojson::parse(R"({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}],
        "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>"})");
    vars["tools"] = ojson::parse(kTools.dump());
    const std::string out = ChatTemplate(tmpl).render(vars);
    const size_t b = out.rfind(c.begin);
    ASSERT_NE(b, std::string::npos) << c.name << ":\n" << out;
    const size_t start = b + std::string(c.begin).size();
    const size_t e = out.find(c.end, start);
    ASSERT_NE(e, std::string::npos) << c.name << ":\n" << out;
    const std::string answer = out.substr(start, e - start);
    const ToolCallResult r = parse_tool_calls(detect_tool_call_format(tmpl), answer, kTools);
    ASSERT_TRUE(r.found) << c.name << ": " << answer;
    ASSERT_EQ(r.calls.size(), 1u) << c.name;
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "Paris", "days": 2})")) << c.name;
    // Qwen3 writes an (empty) reasoning block before the call: it stays in the content.
    EXPECT_TRUE(r.content == "" || r.content == "<think>\n\n</think>") << c.name << ": " << r.content;
  }
}

TEST(ToolCalls, StreamingFilterHoldsWhatMayBeACall) {
  ToolCallFilter h(ToolCallFormat::Hermes);
  EXPECT_EQ(h.push("Let me check"), "Let me check");
  EXPECT_EQ(h.push(".\n<tool"), ".");  // whitespace and a marker's start held
  EXPECT_EQ(h.push("_call>\n{\"name\""), "");
  EXPECT_EQ(h.push(": 1}"), "");
  EXPECT_EQ(h.released(), "Let me check.");
  ToolCallFilter h2(ToolCallFormat::Hermes);
  EXPECT_EQ(h2.push("a <to"), "a");
  EXPECT_EQ(h2.push("y> b"), " <toy> b");  // not the marker after all
  ToolCallFilter l(ToolCallFormat::Llama3Json);
  EXPECT_EQ(l.push("  "), "");
  EXPECT_EQ(l.push(" Hello"), "   Hello");
  EXPECT_EQ(l.push(" {x}"), " {x}");
  ToolCallFilter l2(ToolCallFormat::Llama3Json);
  EXPECT_EQ(l2.push("\n{\"name\""), "");
  EXPECT_EQ(l2.held(), "\n{\"name\"");
  ToolCallFilter none(ToolCallFormat::None);
  EXPECT_EQ(none.push("<tool_call>"), "<tool_call>");
}

// ---- the answer stream: stop strings, UTF-8 and log-probabilities ----

struct Collected {
  std::string content;
  std::vector<AnswerToken> tokens;
  std::vector<ToolCall> calls;
  void add(AnswerDelta d) {
    content += d.content;
    for (auto& t : d.tokens) tokens.push_back(std::move(t));
    for (auto& c : d.tool_calls) calls.push_back(std::move(c));
  }
  std::vector<int32_t> ids() const {
    std::vector<int32_t> v;
    for (const auto& t : tokens) v.push_back(t.id);
    return v;
  }
};

TokenLogprobs fake_lp(int32_t id) { return {-0.25f * float(id), {{id, -0.25f * float(id)}}}; }

// Streams the pieces through an AnswerStream as a handler does (finish() after a stop
// string or at the end); returns what was sent.
Collected stream(FakeTokenizer& tok, const std::vector<std::string>& pieces, std::vector<std::string> stops,
                 ToolCallFormat format = ToolCallFormat::None, bool logprobs = true) {
  std::vector<int32_t> ids;
  for (const auto& p : pieces) ids.push_back(p == "<ctl>" ? 0 : tok.id(p));
  AnswerStream a(tok, std::move(stops), format, format == ToolCallFormat::None ? json() : kTools);
  Collected c;
  for (int32_t id : ids) {
    c.add(a.push(id, logprobs ? std::optional<TokenLogprobs>(fake_lp(id)) : std::nullopt));
    if (a.stopped()) break;
  }
  c.add(a.finish());
  EXPECT_EQ(a.finish().content, "") << "finish() twice";
  return c;
}

TEST(AnswerStream, StopStringCutsTextAndTokensAlike) {
  FakeTokenizer tok({"<ctl>"});
  // "Hel" "lo" " wor" "ld": the stop string "o wo" ends the text at "Hell"; "lo"
  // straddles the cut and is reported, " wor" lies in the stop string and is not.
  const Collected c = stream(tok, {"Hel", "lo", " wor", "ld"}, {"o wo"});
  EXPECT_EQ(c.content, "Hell");
  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_EQ(c.tokens[0].id, tok.id("Hel"));
  EXPECT_EQ(c.tokens[1].id, tok.id("lo"));
  EXPECT_EQ(c.tokens[1].offset, 3u);
  EXPECT_EQ(c.tokens[1].lp.logprob, fake_lp(tok.id("lo")).logprob);
  // Without the stop string every token is reported, in order, with its offsets.
  const Collected all = stream(tok, {"Hel", "lo", " wor", "ld"}, {});
  EXPECT_EQ(all.content, "Hello world");
  ASSERT_EQ(all.tokens.size(), 4u);
  EXPECT_EQ(all.tokens[2].offset, 5u);
  EXPECT_EQ(all.tokens[3].char_offset, 9u);
  // A stop string that starts exactly at a token: that token is not reported.
  const Collected at = stream(tok, {"Hel", "lo", " wor", "ld"}, {" wor"});
  EXPECT_EQ(at.content, "Hello");
  EXPECT_EQ(at.tokens.size(), 2u);
}

TEST(AnswerStream, SaysWhichStopStringEndedTheText) {
  FakeTokenizer tok({"<ctl>"});
  AnswerStream a(tok, {"zz", "wor", "lo w"});
  for (const char* p : {"Hel", "lo", " wor", "ld"}) {
    EXPECT_EQ(a.stop_sequence(), "");
    a.push(tok.id(p), std::nullopt);
    if (a.stopped()) break;
  }
  EXPECT_EQ(a.text(), "Hel");  // "lo w" starts before "wor": the earliest one ends it
  EXPECT_EQ(a.stop_sequence(), "lo w");
}

// The job's events as the engine worker hands them out.
std::vector<Job::Event> token_events(FakeTokenizer& tok, const std::vector<std::string>& pieces,
                                     FinishReason last = FinishReason::None) {
  std::vector<Job::Event> v;
  for (const auto& p : pieces) {
    GenerationEvent e;
    e.token = tok.id(p);
    v.push_back(Job::Event::of(e));
  }
  if (last != FinishReason::None) v.back().finish = last;
  return v;
}

TEST(Exchange, RecordsWhatEndedTheAnswer) {
  FakeTokenizer tok({"<ctl>"});
  ParsedRequest req;
  req.stop = {"lo w"};
  Exchange stopped(req, {}, tok);
  stopped.job = std::make_shared<Job>(GenerationRequest{});
  const char* finish = nullptr;
  std::string error;
  AnswerDelta d = stopped.advance(token_events(tok, {"Hel", "lo", " wor", "ld"}), finish, error);
  EXPECT_EQ(d.content, "Hel");
  EXPECT_STREQ(finish, "stop");
  EXPECT_TRUE(stopped.finished && stopped.stop_string);
  EXPECT_EQ(stopped.answer.stop_sequence(), "lo w");
  EXPECT_EQ(stopped.ended, FinishReason::None);
  EXPECT_TRUE(stopped.job->cancelled()) << "a stop string cancels the job";
  EXPECT_EQ(stopped.completion_tokens, 3);

  Exchange full(req, {}, tok);
  full.job = std::make_shared<Job>(GenerationRequest{});
  finish = nullptr;
  d = full.advance(token_events(tok, {"Hel", "lo"}, FinishReason::Length), finish, error);
  EXPECT_EQ(d.content, "Hello");
  EXPECT_STREQ(finish, "length");
  EXPECT_TRUE(full.finished);
  EXPECT_FALSE(full.stop_string);
  EXPECT_EQ(full.ended, FinishReason::Length);
  EXPECT_TRUE(error.empty());
}

TEST(AnswerStream, TokensTravelWithTheTextThatHoldsThem) {
  FakeTokenizer tok({"<ctl>"});
  // A character split over two tokens: nothing is sent until it is whole; a control
  // token (no text) goes with the next text.
  std::vector<int32_t> ids = {tok.id("\xe2\x80"), tok.id("\x99s"), 0, tok.id(" ok")};
  AnswerStream a(tok, {"STOP"});
  AnswerDelta d = a.push(ids[0], fake_lp(ids[0]));
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(d.tokens.empty());
  d = a.push(ids[1], fake_lp(ids[1]));
  EXPECT_EQ(d.content, "\xe2\x80\x99s");
  ASSERT_EQ(d.tokens.size(), 2u);
  EXPECT_EQ(d.tokens[1].char_offset, 0u);  // it starts inside the first character
  d = a.push(0, fake_lp(0));
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tokens.size(), 1u);  // its position is known: nothing before it is held
  d = a.push(ids[3], fake_lp(ids[3]));
  EXPECT_EQ(d.content, " ok");
  ASSERT_EQ(d.tokens.size(), 1u);
  EXPECT_EQ(d.tokens[0].char_offset, 2u);
  // Text held as a possible stop string holds its tokens too.
  AnswerStream b(tok, {"STOP"});
  d = b.push(tok.id("xx ST"), fake_lp(1));
  EXPECT_EQ(d.content, "xx ");
  EXPECT_EQ(d.tokens.size(), 1u);  // its first byte was sent
  d = b.push(tok.id("OP"), fake_lp(2));
  EXPECT_TRUE(b.stopped());
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(b.finish().tokens.empty());  // "OP" lies in the stop string
}

TEST(AnswerStream, InvalidUtf8IsReplacedAndCountedAsSent) {
  FakeTokenizer tok({"<ctl>"});
  const Collected c = stream(tok, {"a", "\x80", "\xe2\x82", "b", "\xc3\xa9"}, {});
  EXPECT_EQ(c.content, "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "b\xc3\xa9");  // one U+FFFD per stray byte
  ASSERT_EQ(c.tokens.size(), 5u);
  std::vector<size_t> offsets;
  for (const auto& t : c.tokens) offsets.push_back(t.char_offset);
  EXPECT_EQ(offsets, (std::vector<size_t>{0, 1, 2, 4, 5}));
  EXPECT_EQ(sanitize_utf8("ok \xf0\x9f\x98\x80"), "ok \xf0\x9f\x98\x80");
  EXPECT_EQ(sanitize_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong
}

TEST(AnswerStream, TheTextDoesNotDependOnLogprobs) {
  FakeTokenizer tok({"<ctl>"});
  const std::vector<std::string> pieces = {"The", " answer", " is", " 4", "2", ".", " E", "N", "D", " more"};
  const Collected whole = stream(tok, pieces, {"END"});
  EXPECT_EQ(whole.content, "The answer is 42. ");
  EXPECT_EQ(whole.tokens.size(), 7u);  // through " E", which straddles "END"
  const Collected nolp = stream(tok, pieces, {"END"}, ToolCallFormat::None, false);
  EXPECT_EQ(nolp.content, whole.content);
  EXPECT_TRUE(nolp.tokens.empty());
}

TEST(AnswerStream, ToolCallsAreHeldAndParsed) {
  FakeTokenizer tok({"<ctl>"});
  const Collected c = stream(tok,
                             {"Let", " me", " check", ".", "\n", "<tool", "_call>", "\n{\"name\": \"get_weather\", ",
                              "\"arguments\": {\"city\": \"Paris\"}}", "\n</tool_call>"},
                             {}, ToolCallFormat::Hermes);
  EXPECT_EQ(c.content, "Let me check.");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(c.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(c.tokens.size(), 10u);  // the calls' tokens too
  // Invalid JSON in the call: all of it is content, nothing lost.
  const Collected bad = stream(tok, {"Hi", " <tool_call>", "{\"name\": get_weather}", "</tool_call>"}, {},
                               ToolCallFormat::Hermes);
  EXPECT_EQ(bad.content, "Hi <tool_call>{\"name\": get_weather}</tool_call>");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.tokens.size(), 4u);
  // Llama 3: a whole-answer JSON call; a plain answer passes through.
  const Collected l = stream(tok, {"{\"name\": \"get_time\", ", "\"parameters\": {}}"}, {}, ToolCallFormat::Llama3Json);
  EXPECT_EQ(l.content, "");
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(l.calls[0].name, "get_time");
  const Collected plain = stream(tok, {" Sunny", " today"}, {}, ToolCallFormat::Llama3Json);
  EXPECT_EQ(plain.content, " Sunny today");
  EXPECT_TRUE(plain.calls.empty());
  // A stop string inside the call cuts it: no call, the text before the stop is content.
  const Collected cut = stream(tok, {"<tool_call>", "{\"name\": \"get_time\"}", "</tool_call>"}, {"</tool"},
                               ToolCallFormat::Hermes);
  EXPECT_EQ(cut.calls.size(), 1u);  // the block without its closing tag still parses
  EXPECT_EQ(cut.content, "");
}

// ---- JSON ----

TEST(LogprobsJson, TokenDisplay) {
  bool esc = false;
  EXPECT_EQ(token_display("h\xc3\xa9llo", esc), "h\xc3\xa9llo");
  EXPECT_FALSE(esc);
  EXPECT_EQ(token_display("\xe2\x80", esc), "\\xe2\\x80");
  EXPECT_TRUE(esc);
  EXPECT_EQ(token_display("a\x99" "b", esc), "a\\x99b");
  EXPECT_EQ(token_display("\xed\xa0\x80", esc), "\\xed\\xa0\\x80");  // a surrogate is not a character
  EXPECT_EQ(token_display("\xf0\x9f\x98\x80", esc), "\xf0\x9f\x98\x80");
  EXPECT_FALSE(esc);
}

TEST(LogprobsJson, ChatAndCompletionShapes) {
  FakeTokenizer tok({"<ctl>", "Hi", "\xe2\x80", " there"});
  std::vector<AnswerToken> toks;
  toks.push_back({1, 0, 0, 2, {-0.5f, {{1, -0.5f}, {3, -1.5f}, {0, -3.0f}}}});
  toks.push_back({2, 2, 2, 2, {-0.25f, {{2, -0.25f}, {1, -2.0f}, {3, -INFINITY}}}});
  const json chat = logprobs_json(toks, tok, true, 2);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "Hi");
  EXPECT_EQ(chat["content"][0]["bytes"], json::parse("[72, 105]"));
  EXPECT_FLOAT_EQ(chat["content"][0]["logprob"].get<float>(), -0.5f);
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], " there");
  EXPECT_EQ(chat["content"][1]["token"], "\\xe2\\x80");
  EXPECT_EQ(chat["content"][1]["bytes"], json::parse("[226, 128]"));
  EXPECT_TRUE(chat["refusal"].is_null());
  const json none = logprobs_json(toks, tok, true, 0);
  EXPECT_TRUE(none["content"][0]["top_logprobs"].empty());

  const json cmpl = logprobs_json(toks, tok, false, 3);
  EXPECT_EQ(cmpl["tokens"], json::parse(R"(["Hi", "bytes:\\xe2\\x80"])"));
  EXPECT_EQ(cmpl["text_offset"], json::parse("[0, 2]"));
  EXPECT_FLOAT_EQ(cmpl["token_logprobs"][1].get<float>(), -0.25f);
  EXPECT_EQ(cmpl["top_logprobs"][0].size(), 3u);
  EXPECT_FLOAT_EQ(cmpl["top_logprobs"][0]["<|ctl|>"].get<float>(), -3.0f);  // control tokens shown
  EXPECT_FLOAT_EQ(cmpl["top_logprobs"][1][" there"].get<float>(), -9999.0f);  // -inf as OpenAI gives it
  // logprobs 0: just the chosen token.
  const json zero = logprobs_json(toks, tok, false, 0);
  EXPECT_EQ(zero["top_logprobs"][0].size(), 1u);
  EXPECT_TRUE(zero["top_logprobs"][0].contains("Hi"));
  EXPECT_NO_THROW((void)json(cmpl).dump());
}

TEST(ToolCallsJson, ResponseAndStreamShapes) {
  std::vector<ToolCall> calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  const ResponseIds ids{"chatcmpl-1", 1, "m"};
  const json r = completion_response(ids, true, "", "tool_calls", 5, 7, nullptr, calls);
  const json& msg = r["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_FALSE(msg["tool_calls"][0].contains("index"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  const json chunk = stream_chunk(ids, true, "", nullptr, false, nullptr, calls);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["id"], "call_1");
}

// ---- request parsing ----

ModelContext model_context(const Tokenizer& tok) {
  ModelContext m;
  m.tokenizer = &tok;
  m.n_vocab = tok.n_vocab();
  m.n_ctx = 64;
  m.render_chat = [](const ojson& messages, const ojson&) { return messages.dump(); };
  m.tool_format = ToolCallFormat::Hermes;
  m.grammars = std::make_shared<GrammarCache>(std::make_shared<const TokenVocabulary>(tok));
  return m;
}

ParsedRequest chat(const ModelContext& m, const std::string& body) {
  return parse_chat_request(RequestJson::parse(body), m);
}

int status_of(const std::function<void()>& f, std::string* param = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (param) *param = e.param;
    return e.status;
  }
  return 200;
}

TEST(Requests, LogprobsFields) {
  FakeTokenizer tok({"<ctl>", "a", "b"});
  const ModelContext m = model_context(tok);
  ParsedRequest r = parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "logprobs": 3})"), m);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.gen.logprobs, 3);
  r = parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "logprobs": null})"), m);
  EXPECT_EQ(r.gen.logprobs, -1);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20})");
  EXPECT_EQ(r.gen.logprobs, 20);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  EXPECT_EQ(r.gen.logprobs, 0);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})");
  EXPECT_EQ(r.gen.logprobs, -1);
  std::string param;
  for (const char* b : {R"({"prompt": [1], "logprobs": 21})", R"({"prompt": [1], "logprobs": -1})",
                        R"({"prompt": [1], "logprobs": true})", R"({"prompt": [1], "echo": true})"}) {
    EXPECT_EQ(status_of([&] { parse_completion_request(RequestJson::parse(b), m); }, &param), 400) << b;
  }
  EXPECT_EQ(param, "echo");
  for (const char* b : {R"({"prompt": [1], "echo": false})", R"({"prompt": [1], "best_of": 1, "suffix": ""})",
                        R"({"prompt": [1], "response_format": {"type": "text"}})"})
    EXPECT_EQ(status_of([&] { parse_completion_request(RequestJson::parse(b), m); }), 200) << b;
  for (const char* b : {R"({"prompt": [1], "best_of": 2})", R"({"prompt": [1], "suffix": "end"})",
                        R"({"prompt": [1], "response_format": "json"})"})
    EXPECT_EQ(status_of([&] { parse_completion_request(RequestJson::parse(b), m); }), 400) << b;
  for (const char* b : {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
                        R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
                        R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})"})
    EXPECT_EQ(status_of([&] { chat(m, b); }), 400) << b;
}

TEST(Requests, ToolsAndToolChoice) {
  FakeTokenizer tok({"<ctl>", "a"});
  const ModelContext m = model_context(tok);
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_time"}}])";
  ParsedRequest r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], )" + tools + "}");
  EXPECT_EQ(r.tool_format, ToolCallFormat::Hermes);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none", )" + tools + "}");
  EXPECT_EQ(r.tool_format, ToolCallFormat::None);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto", )" + tools + "}");
  EXPECT_EQ(r.tool_format, ToolCallFormat::Hermes);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.tool_format, ToolCallFormat::None);
  // Forced calls: a grammar of calls in the template's syntax.
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", )" + tools + "}");
  EXPECT_EQ(r.tool_format, ToolCallFormat::Hermes);
  ASSERT_TRUE(r.gen.grammar);
  EXPECT_NE(r.tool_grammar.find("<tool_call>"), std::string::npos);
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "get_time"}}, )" + tools + "}");
  ASSERT_TRUE(r.gen.grammar);
  std::string param;
  EXPECT_EQ(status_of([&] { chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "nope"}}, )" + tools + "}"); }, &param), 400);
  EXPECT_EQ(param, "tool_choice");
  EXPECT_EQ(status_of([&] { chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})"); }, &param), 400);
  EXPECT_EQ(param, "tool_choice");
  EXPECT_EQ(status_of([&] { chat(m, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "response_format": {"type": "json_object"}, )" + tools + "}"); }, &param), 400);
  EXPECT_EQ(param, "response_format");
  for (const std::string& b :
       {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes", )" + tools + "}",
        R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": 3, )" + tools + "}",
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"),
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval", "function": {"name": "f"}}]})"),
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})"),
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": {"type": "function"}})"),
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 5, "function": {"name": "f"}}]})"),
        std::string(R"({"messages": [{"role": "assistant", "tool_calls": 5}]})"),
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "yes"})")})
    EXPECT_EQ(status_of([&] { chat(m, b); }), 400) << b;
}

TEST(Requests, StructuredOutputFields) {
  FakeTokenizer tok({"<ctl>", "a", "{", "}", "\"", "1"});
  const ModelContext m = model_context(tok);
  auto completion = [&](const std::string& b) { return parse_completion_request(RequestJson::parse(b), m); };
  EXPECT_FALSE(completion(R"({"prompt": [1]})").gen.grammar);
  EXPECT_FALSE(completion(R"({"prompt": [1], "response_format": {"type": "text"}, "grammar": ""})").gen.grammar);
  EXPECT_TRUE(completion(R"({"prompt": [1], "response_format": {"type": "json_object"}})").gen.grammar);
  EXPECT_TRUE(completion(R"({"prompt": [1], "grammar": "root ::= \"a\"+"})").gen.grammar);
  const ParsedRequest r = chat(m, R"({"messages": [{"role": "user", "content": "x"}], "response_format":
      {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "integer"}}}})");
  ASSERT_TRUE(r.gen.grammar);
  // The grammar lets "1" start the answer and not "a".
  GrammarMatcher g(r.gen.grammar);
  EXPECT_TRUE(g.accepts(5));
  EXPECT_FALSE(g.accepts(1));
  // The same schema twice: one compiled grammar.
  const ParsedRequest again = chat(m, R"({"messages": [{"role": "user", "content": "y"}], "response_format":
      {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "integer"}}}})");
  EXPECT_EQ(again.gen.grammar, r.gen.grammar);
  // Errors name the field, and the keyword that cannot be enforced.
  struct Bad {
    std::string body, param, says;
  };
  const std::vector<Bad> cases = {
      {R"({"prompt": [1], "grammar": "root ::= nothing"})", "grammar", "undefined rule 'nothing'"},
      {R"({"prompt": [1], "grammar": 5})", "grammar", "GBNF"},
      {R"({"prompt": [1], "response_format": {"type": "xml"}})", "response_format", "json_schema"},
      {R"({"prompt": [1], "response_format": {"type": "json_schema"}})", "response_format", "json_schema"},
      {R"({"prompt": [1], "response_format": {"type": "json_schema", "json_schema": {"strict": true,
          "schema": {"type": "string", "format": "email"}}}})", "response_format", "'email'"},
      {R"({"prompt": [1], "response_format": {"type": "json_schema", "json_schema": {"strict": true,
          "schema": {"type": "object", "minProperties": 1}}}})", "response_format", "'minProperties'"},
      {R"({"prompt": [1], "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})",
       "response_format", "cannot be combined"},
  };
  for (const Bad& b : cases) {
    try {
      completion(b.body);
      ADD_FAILURE() << "accepted: " << b.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << b.body;
      EXPECT_EQ(e.param, b.param) << b.body;
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
    }
  }
  // Not strict (OpenAI's default): what cannot be enforced is left out.
  EXPECT_TRUE(completion(R"({"prompt": [1], "response_format": {"type": "json_schema", "json_schema":
      {"schema": {"type": "string", "format": "email"}}}})").gen.grammar);
}

TEST(Requests, EarlierToolCallArgumentsReachTheTemplateAsObjects) {
  FakeTokenizer tok({"<ctl>", "a"});
  ModelContext m = model_context(tok);
  ojson seen;
  m.render_chat = [&](const ojson& messages, const ojson&) {
    seen = messages;
    return std::string("x");
  };
  chat(m, R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"}]})");
  EXPECT_EQ(seen[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":2})");  // key order kept
  EXPECT_EQ(seen[1]["tool_calls"][1]["function"]["arguments"], "not json");  // left as it was
}

// gpt-oss: reasoning sent back reaches the template as `thinking`, a call's null
// content is "", tools without a description get an empty one; every answer is parsed
// as harmony, its calls only with tools. Other templates get the messages unchanged.
TEST(Requests, HarmonyConversationsReachTheTemplateAsItNeeds) {
  FakeTokenizer tok({"<ctl>", "a"});
  ModelContext m = model_context(tok);
  ojson seen, seen_tools;
  m.render_chat = [&](const ojson& messages, const ojson& tools) {
    seen = messages;
    seen_tools = tools;
    return std::string("x");
  };
  const std::string body = R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})";
  ParsedRequest r = chat(m, body);
  EXPECT_FALSE(seen[1].contains("thinking"));
  EXPECT_TRUE(seen[1]["content"].is_null());
  EXPECT_FALSE(seen_tools[0]["function"].contains("description"));
  m.tool_format = ToolCallFormat::Harmony;
  r = chat(m, body);
  EXPECT_EQ(seen[1]["thinking"], "Look it up.");
  EXPECT_EQ(seen[1]["content"], "");
  EXPECT_EQ(seen_tools[0]["function"]["description"], "");
  EXPECT_EQ(r.tool_format, ToolCallFormat::Harmony);
  EXPECT_FALSE(r.tools.is_null());
  r = chat(m, R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.tool_format, ToolCallFormat::Harmony);  // channels parsed without tools too
  EXPECT_TRUE(r.tools.is_null());
  // response_format: the JSON is the final message, so the answer starts with a marker.
  const int32_t channel = tok.control("<|channel|>"), brace = tok.id("{");
  m.grammars = std::make_shared<GrammarCache>(std::make_shared<const TokenVocabulary>(tok, harmony_marker_tokens(tok)));
  for (const char* format : {R"({"type": "json_object"})",
                             R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}})"}) {
    r = chat(m, std::string(R"({"messages": [{"role": "user", "content": "x"}], "response_format": )") + format + "}");
    GrammarMatcher g(r.gen.grammar);
    EXPECT_TRUE(g.accepts(channel)) << format;
    EXPECT_FALSE(g.accepts(brace)) << format;
  }
}

TEST(Requests, MaxTokensLimitCapsMinusOneAndLargerValues) {
  FakeTokenizer tok({"<ctl>", "a", "b"});
  ModelContext m = model_context(tok);  // n_ctx 64
  // Without a limit: -1 is the rest of the context.
  EXPECT_EQ(parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "max_tokens": -1})"), m).gen.max_tokens, 62);
  EXPECT_EQ(chat(m, R"({"messages": [{"role": "user", "content": "x"}]})").gen.max_tokens, 63);  // chat's default
  m.max_tokens_limit = 10;
  EXPECT_EQ(parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "max_tokens": -1})"), m).gen.max_tokens, 10);
  EXPECT_EQ(parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "max_tokens": 50})"), m).gen.max_tokens, 10);
  EXPECT_EQ(parse_completion_request(RequestJson::parse(R"({"prompt": [1, 2], "max_tokens": 7})"), m).gen.max_tokens, 7);
  EXPECT_EQ(chat(m, R"({"messages": [{"role": "user", "content": "x"}]})").gen.max_tokens, 10);
  EXPECT_EQ(chat(m, R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 30})").gen.max_tokens, 10);
  // The limit is not a way around the context: a prompt that leaves no room still fails.
  m.max_tokens_limit = 100;
  std::string param;
  EXPECT_EQ(status_of([&] { parse_completion_request(RequestJson::parse(R"({"prompt": [1], "max_tokens": 80})"), m); }, &param),
            400);
  EXPECT_EQ(param, "max_tokens");
}

}  // namespace
}  // namespace tessera::server
