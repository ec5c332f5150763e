// Anthropic's Messages API without a model: requests translated into the chat form
// (rendered by the real chat templates exactly as the equivalent OpenAI-form fixture
// conversations), what is refused, the Message object, and the stream's events.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <ctime>
#include <functional>
#include <sstream>

#include "fake_tokenizer.h"
#include "server/anthropic_api.h"
#include "tessera/chat_template.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// The fixture conversations of chat_templates/cases.json as Anthropic's clients send them.
const char* kWeatherTool = R"({"name": "get_weather", "description": "Current weather for a city.",
  "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}})";

std::map<std::string, std::string> anthropic_cases() {
  const std::string tools = std::string(R"("tools": [)") + kWeatherTool + "]";
  return {
      {"system_user", R"({"max_tokens": 8, "system": "You are a terse assistant.",
         "messages": [{"role": "user", "content": "Name a prime number."}]})"},
      {"multi_turn", R"({"max_tokens": 8, "system": [{"type": "text", "text": "You answer in one word."}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Paris"}]},
                      {"role": "user", "content": "And of Italy?"}]})"},
      {"tools", R"({"max_tokens": 8, "system": "You can call tools.", )" + tools + R"(,
         "messages": [{"role": "user", "content": "Weather in Paris?"}]})"},
      {"tool_round_trip", R"({"max_tokens": 8, )" + tools + R"(, "messages": [
         {"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "call12345", "name": "get_weather",
                                            "input": {"city": "Paris", "unit": "celsius"}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call12345",
                                       "content": [{"type": "text", "text": "{\"temp\": 21, \"sky\": \"clear\"}"}]}]}]})"},
  };
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(AnthropicRequests, RenderAsTheFixtureConversationsDo) {
  const std::string dir = std::string(TESSERA_FIXTURES_DIR) + "/chat_templates";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "chat template fixtures not found";
  const json expected = json::parse(read_file(dir + "/expected.json"));
  // strftime_now sees the fixtures' date.
  const std::string ymd = json::parse(read_file(dir + "/cases.json"))["strftime_now_date"].get<std::string>();
  RenderOptions options;
  options.now = std::tm{};
  options.now->tm_year = std::stoi(ymd.substr(0, 4)) - 1900;
  options.now->tm_mon = std::stoi(ymd.substr(5, 2)) - 1;
  options.now->tm_mday = std::stoi(ymd.substr(8, 2));
  int compared = 0;
  for (const auto& [name, fixture] : expected.items()) {
    const ChatTemplate tmpl(read_file(dir + "/templates/" + name + ".jinja"));
    for (const auto& [c, body] : anthropic_cases()) {
      const json& want = fixture["cases"][c];
      if (!want.contains("text")) continue;  // the template refuses the conversation (gemma: no system role)
      const RequestJson chat = messages_to_chat_body(RequestJson::parse(body));
      ojson vars = {{"messages", chat["messages"]}, {"add_generation_prompt", true},
                    {"bos_token", fixture["bos_token"]}, {"eos_token", fixture["eos_token"]}};
      if (chat.contains("tools")) vars["tools"] = chat["tools"];
      EXPECT_EQ(tmpl.render(vars, options), want["text"].get<std::string>()) << name << " / " << c;
      ++compared;
    }
  }
  EXPECT_GE(compared, 40);
}

TEST(AnthropicRequests, MessagesBecomeChatMessages) {
  const RequestJson chat = messages_to_chat_body(RequestJson::parse(R"({"max_tokens": 5, "system": [
      {"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"b": 1, "a": 2}},
        {"type": "tool_use", "id": "t2", "name": "g", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "G"},
        {"type": "tool_result", "tool_use_id": "t1", "is_error": true},
        {"type": "text", "text": "thanks"}]}],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"type": "custom", "name": "g", "input_schema": {}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
    "temperature": 0.5, "top_k": 3, "top_p": 0.9, "stream": true, "metadata": {"user_id": "u"},
    "seed": 7, "ignore_eos": true, "presence_penalty": 1})"));
  const ojson want = ojson::parse(R"({"messages": [
      {"role": "system", "content": "A\nB"},
      {"role": "user", "content": "one\ntwo"},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}},
        {"id": "t2", "type": "function", "function": {"name": "g", "arguments": {}}}]},
      {"role": "tool", "name": "g", "tool_call_id": "t2", "content": "G"},
      {"role": "tool", "name": "f", "tool_call_id": "t1", "content": ""},
      {"role": "user", "content": "thanks"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "g", "parameters": {}}}],
    "parallel_tool_calls": false, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "stream": true,
    "seed": 7, "ignore_eos": true})");  // tessera's extensions pass; OpenAI's fields (presence_penalty) do not
  EXPECT_EQ(chat.dump(), want.dump());  // key order too: a template's tojson prints it
  // tool_choice none keeps the tools in the prompt and turns off the parsing of calls.
  const RequestJson none = messages_to_chat_body(RequestJson::parse(
      std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "none"},
                      "tools": [)") + kWeatherTool + "]}"));
  EXPECT_EQ(none["tool_choice"], "none");
  EXPECT_EQ(none["tools"].size(), 1u);
  // any and tool force a call: chat's "required" and named function.
  const std::string ask = std::string(R"("max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [)") +
                          kWeatherTool + "]";
  EXPECT_EQ(messages_to_chat_body(RequestJson::parse("{" + ask + R"(, "tool_choice": {"type": "any"}})"))["tool_choice"],
            "required");
  EXPECT_EQ(messages_to_chat_body(RequestJson::parse(
                "{" + ask + R"(, "tool_choice": {"type": "tool", "name": "get_weather"}})"))["tool_choice"].dump(),
            R"({"type":"function","function":{"name":"get_weather"}})");
}

// Thinking blocks of an earlier answer become its reasoning_content (which a harmony
// template renders); redacted ones are dropped.
TEST(AnthropicRequests, ThinkingBlocksBecomeReasoning) {
  const RequestJson chat = messages_to_chat_body(RequestJson::parse(R"({"max_tokens": 5, "messages": [
      {"role": "user", "content": "x"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "redacted_thinking", "data": "abc"}, {"type": "thinking", "thinking": "Yes.", "signature": "s"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "F"}]}]})"));
  EXPECT_EQ(chat["messages"][1].dump(),
            R"({"role":"assistant","content":"","reasoning_content":"Hmm.\nYes.","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":{}}}]})");
}

ModelContext model_context(const Tokenizer& tok) {
  ModelContext m;
  m.tokenizer = &tok;
  m.n_vocab = tok.n_vocab();
  m.n_ctx = 64;
  m.render_chat = [](const ojson& messages, const ojson&) { return messages.dump(); };
  m.tool_format = ToolCallFormat::Hermes;
  return m;
}

// The status of the ApiError the call throws (200: none) and the error's message.
int status_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (message) *message = e.what();
    return e.status;
  }
  return 200;
}

TEST(AnthropicRequests, ParsedWithTheChatParser) {
  FakeTokenizer tok({"<ctl>", "a"});
  const ModelContext m = model_context(tok);
  ParsedRequest r = parse_messages_request(RequestJson::parse(R"({"model": "claude", "max_tokens": 7,
      "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["1", "2", "3", "4", "5", "6"],
      "temperature": 0, "top_k": 2, "stream": true})"), m);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.sampling.top_k, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"1", "2", "3", "4", "5", "6"}));  // more than chat's 4
  EXPECT_EQ(r.tool_format, ToolCallFormat::None);
  r = parse_messages_request(RequestJson::parse(std::string(R"({"max_tokens": 7, "messages": [{"role": "user", "content": "x"}],
      "tools": [)") + kWeatherTool + "]}"), m);
  EXPECT_EQ(r.tool_format, ToolCallFormat::Hermes);
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(r.parallel_tool_calls);
  // count_tokens: max_tokens is not needed.
  EXPECT_EQ(status_of([&] { parse_messages_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), m, true); }),
            200);
}

TEST(AnthropicRequests, WhatIsWrongOrUnsupportedIsA400NamingIt) {
  FakeTokenizer tok({"<ctl>", "a"});
  const ModelContext m = model_context(tok);
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tools = std::string(R"("tools": [)") + kWeatherTool + "]";
  struct Case {
    std::string body;
    const char* says;  // in the message
  };
  for (const Case& c : std::vector<Case>{
           {"[1]", "JSON object"},
           {"{" + user + "}", "'max_tokens' is required"},
           {R"({"max_tokens": 0, )" + user + "}", "max_tokens"},
           {R"({"max_tokens": 5})", "'messages' is required"},
           {R"({"max_tokens": 5, "messages": []})", "non-empty"},
           {R"({"max_tokens": 5, "model": 3, )" + user + "}", "'model'"},
           {R"({"max_tokens": 5, "temperature": 1.5, )" + user + "}", "'temperature' must be in [0, 1]"},
           {R"({"max_tokens": 5, "top_p": 0, )" + user + "}", "top_p"},
           {R"({"max_tokens": 5, "system": 5, )" + user + "}", "'system'"},
           {R"({"max_tokens": 5, "system": [{"type": "image"}], )" + user + "}", "only text blocks"},
           {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "unknown role 'system'"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
            "messages.0.content.0: 'image' content blocks are not supported"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]})", "'document'"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]})", "'text'"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": []}]})", "empty"},
           {R"({"max_tokens": 5, "messages": [{"role": "user"}]})", "'content'"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]})",
            "matches no tool_use"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})",
            "belong in assistant messages"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
               {"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}, {"role": "user", "content": "y"}]})",
            "object 'input'"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]})",
            "the last message must be a user message"},
           {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
               "content": [{"type": "image"}]}]}]})", "matches no tool_use"},
           {R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}], )" + user + "}",
            "server tool"},
           {R"({"max_tokens": 5, "tools": [{"name": "f"}], )" + user + "}", "input_schema"},
           {R"({"max_tokens": 5, "tools": [{"name": "", "input_schema": {}}], )" + user + "}", "'name'"},
           {R"({"max_tokens": 5, "tool_choice": {"type": "tool"}, )" + tools + ", " + user + "}",
            "tool_choice 'tool' needs a non-empty string 'name'"},
           {R"({"max_tokens": 5, "tool_choice": {"type": "sometimes"}, )" + tools + ", " + user + "}",
            "'tool_choice' type must be"},
           {R"({"max_tokens": 5, "tool_choice": "auto", )" + user + "}", "'tool_choice'"},
           {R"({"max_tokens": 5, "stop_sequences": "END", )" + user + "}", "'stop_sequences'"},
           {R"({"max_tokens": 5, "stop_sequences": [""], )" + user + "}", "non-empty"},
           {R"({"max_tokens": 5, "stream": "yes", )" + user + "}", "stream"},
           {R"({"max_tokens": 100, )" + user + "}", "maximum context length"},
       }) {
    std::string message;
    EXPECT_EQ(status_of([&] { parse_messages_request(RequestJson::parse(c.body), m); }, &message), 400) << c.body;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.body << "\n  said: " << message;
  }
  // The image inside a tool result is named when the id is known.
  std::string message;
  EXPECT_EQ(status_of([&] {
              parse_messages_request(RequestJson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}]})"),
                                     m);
            }, &message),
            400);
  EXPECT_NE(message.find("messages.2.content.0.content.0: 'image' content blocks are not supported"), std::string::npos)
      << message;
}

TEST(AnthropicResponses, StopReasons) {
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::Stop, false, false), "end_turn");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::Length, false, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::ContextFull, false, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::None, true, false), "stop_sequence");
  EXPECT_STREQ(anthropic_stop_reason(FinishReason::Stop, false, true), "tool_use");
}

TEST(AnthropicResponses, ErrorShape) {
  for (const auto& [status, type] : std::vector<std::pair<int, const char*>>{
           {400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
           {408, "invalid_request_error"}, {413, "request_too_large"}, {500, "api_error"}, {503, "overloaded_error"}}) {
    const json e = anthropic_error_body(status, "why");
    EXPECT_EQ(e, json::parse(std::string(R"({"type": "error", "error": {"type": ")") + type + R"(", "message": "why"}})"));
  }
  EXPECT_TRUE(is_anthropic_path("/v1/messages"));
  EXPECT_TRUE(is_anthropic_path("/v1/messages/count_tokens"));
  EXPECT_FALSE(is_anthropic_path("/v1/messagesx"));
  EXPECT_FALSE(is_anthropic_path("/v1/chat/completions"));
}

const std::vector<ToolCall> kCalls = {{"call_1", "get_weather", R"({"city": "Paris"})"},
                                      {"call_2", "get_time", "{}"}};

TEST(AnthropicResponses, MessageObject) {
  const ResponseIds ids{"msg_1", 0, "m"};
  json r = message_response(ids, "Sure.", kCalls, "tool_use", "", 12, 30);
  EXPECT_EQ(r, json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
      "content": [{"type": "text", "text": "Sure."},
                  {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                  {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}],
      "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 30}})"));
  r = message_response(ids, "", {}, "stop_sequence", "END", 1, 2);
  EXPECT_EQ(r["content"], json::array());
  EXPECT_EQ(r["stop_sequence"], "END");
  EXPECT_EQ(message_response(ids, "x", {}, "end_turn", "END", 1, 2)["stop_sequence"], nullptr);
}

// Server-Sent Events split into (name, data).
std::vector<std::pair<std::string, json>> parse_sse(const std::string& s) {
  std::vector<std::pair<std::string, json>> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event not ended by a blank line: " << s.substr(at);
    if (end == std::string::npos) break;
    const std::string ev = s.substr(at, end - at);
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.emplace_back(ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7)));
    at = end + 2;
  }
  return out;
}

// What a client makes of the events (the SDK's accumulation, simplified).
json accumulate(const std::vector<std::pair<std::string, json>>& events) {
  json msg;
  std::vector<std::string> partial;
  for (const auto& [name, e] : events) {
    EXPECT_EQ(e["type"], name);
    if (name == "message_start") msg = e["message"];
    if (name == "content_block_start") {
      EXPECT_EQ(e["index"], msg["content"].size());
      msg["content"].push_back(e["content_block"]);
      partial.emplace_back();
    }
    if (name == "content_block_delta") {
      json& block = msg["content"][e["index"].get<size_t>()];
      if (e["delta"]["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + e["delta"]["text"].get<std::string>();
      else if (e["delta"]["type"] == "thinking_delta")
        block["thinking"] = block["thinking"].get<std::string>() + e["delta"]["thinking"].get<std::string>();
      else partial[e["index"].get<size_t>()] += e["delta"]["partial_json"].get<std::string>();
    }
    if (name == "content_block_stop" && msg["content"][e["index"].get<size_t>()]["type"] == "tool_use")
      msg["content"][e["index"].get<size_t>()]["input"] = json::parse(partial[e["index"].get<size_t>()]);
    if (name == "message_delta") {
      msg["stop_reason"] = e["delta"]["stop_reason"];
      msg["stop_sequence"] = e["delta"]["stop_sequence"];
      msg["usage"]["output_tokens"] = e["usage"]["output_tokens"];
    }
  }
  return msg;
}

std::vector<std::string> names(const std::vector<std::pair<std::string, json>>& events) {
  std::vector<std::string> v;
  for (const auto& e : events) v.push_back(e.first);
  return v;
}

TEST(AnthropicResponses, StreamEventsInOrderAddUpToTheMessage) {
  const ResponseIds ids{"msg_1", 0, "m"};
  MessageEvents ev(ids, 12);
  std::string s = ev.start();
  s += ev.delta(AnswerDelta{});  // nothing yet: no block opens
  s += ev.delta(AnswerDelta{"Su", {}, {}, {}});
  s += ev.delta(AnswerDelta{"re.", {}, {}, {}});
  s += ev.delta(AnswerDelta{"", {}, kCalls, {}});
  s += ev.finish("tool_use", "", 30);
  const auto events = parse_sse(s);
  EXPECT_EQ(names(events),
            (std::vector<std::string>{"message_start", "content_block_start", "ping", "content_block_delta",
                                      "content_block_delta", "content_block_stop", "content_block_start",
                                      "content_block_delta", "content_block_stop", "content_block_start",
                                      "content_block_delta", "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(events[6].second["content_block"]["input"], json::object());  // the input comes as JSON text deltas
  EXPECT_EQ(accumulate(events), message_response(ids, "Sure.", kCalls, "tool_use", "", 12, 30));

  // Text only, ended by a stop sequence; and an answer with nothing in it.
  MessageEvents text(ids, 3);
  s = text.start();  // (one statement per call: each changes the writer's state)
  s += text.delta(AnswerDelta{"Hi", {}, {}, {}});
  s += text.finish("stop_sequence", "END", 4);
  const auto t = parse_sse(s);
  EXPECT_EQ(accumulate(t), message_response(ids, "Hi", {}, "stop_sequence", "END", 3, 4));
  MessageEvents empty(ids, 3);
  s = empty.start();
  s += empty.finish("end_turn", "", 1);
  const auto e = parse_sse(s);
  EXPECT_EQ(names(e), (std::vector<std::string>{"message_start", "message_delta", "message_stop"}));
  EXPECT_EQ(accumulate(e), message_response(ids, "", {}, "end_turn", "", 3, 1));
  // gpt-oss: reasoning opens a thinking block, the text then its own block.
  MessageEvents think(ids, 3);
  s = think.start();
  s += think.delta(AnswerDelta{"", {}, {}, "Let me"});
  s += think.delta(AnswerDelta{"", {}, {}, " think."});
  s += think.delta(AnswerDelta{"Hi", {}, {}, ""});
  s += think.finish("end_turn", "", 5);
  const auto th = parse_sse(s);
  EXPECT_EQ(names(th), (std::vector<std::string>{"message_start", "content_block_start", "ping", "content_block_delta",
                                                 "content_block_delta", "content_block_stop", "content_block_start",
                                                 "content_block_delta", "content_block_stop", "message_delta",
                                                 "message_stop"}));
  EXPECT_EQ(th[3].second["delta"]["type"], "thinking_delta");
  const json whole = message_response(ids, "Hi", {}, "end_turn", "", 3, 5, "Let me think.");
  EXPECT_EQ(whole["content"][0], json::parse(R"({"type": "thinking", "thinking": "Let me think.", "signature": ""})"));
  EXPECT_EQ(accumulate(th), whole);
  const auto err = parse_sse(MessageEvents::error(500, "the engine failed"));
  EXPECT_EQ(err[0].first, "error");
  EXPECT_EQ(err[0].second, anthropic_error_body(500, "the engine failed"));
}

}  // namespace
}  // namespace tessera::server
