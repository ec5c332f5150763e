// OpenAI's Responses API without a model: requests translated into the chat form
// (rendered by the real chat templates exactly as the equivalent chat-form fixture
// conversations), what is refused and how errors name the Responses fields, the
// Response object, and the stream's events.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "fake_tokenizer.h"
#include "server/responses_api.h"
#include "tessera/chat_template.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* kWeatherTool = R"({"type": "function", "name": "get_weather", "description": "Current weather for a city.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}, "strict": false})";

// The fixture conversations of chat_templates/cases.json as the Responses API has them.
std::map<std::string, std::string> responses_cases() {
  const std::string tools = std::string(R"("tools": [)") + kWeatherTool + "]";
  return {
      {"system_user", R"({"instructions": "You are a terse assistant.", "input": "Name a prime number."})"},
      {"multi_turn", R"({"input": [{"role": "system", "content": "You answer in one word."},
         {"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]},
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris"}]},
         {"role": "user", "content": "And of Italy?"}]})"},
      {"tools", R"({"instructions": "You can call tools.", )" + tools + R"(, "input": "Weather in Paris?"})"},
      {"tool_round_trip", "{" + tools + R"(, "input": [
         {"role": "user", "content": "Weather in Paris?"},
         {"type": "function_call", "call_id": "call12345", "name": "get_weather",
          "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"},
         {"type": "function_call_output", "call_id": "call12345", "output": "{\"temp\": 21, \"sky\": \"clear\"}"}]})"},
  };
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A model context whose template rendering records what it was given.
struct Recorder {
  FakeTokenizer tok{{"<ctl>", "a"}};
  ModelContext m;
  ojson messages, tools;
  Recorder() {
    m.tokenizer = &tok;
    m.n_vocab = tok.n_vocab();
    m.n_ctx = 64;
    m.tool_format = ToolCallFormat::Hermes;
    m.render_chat = [this](const ojson& msgs, const ojson& t) {
      messages = msgs;
      tools = t;
      return std::string("x");
    };
  }
};

TEST(ResponsesRequests, RenderAsTheFixtureConversationsDo) {
  const std::string dir = std::string(TESSERA_FIXTURES_DIR) + "/chat_templates";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "chat template fixtures not found";
  const json expected = json::parse(read_file(dir + "/expected.json"));
  const std::string ymd = json::parse(read_file(dir + "/cases.json"))["strftime_now_date"].get<std::string>();
  RenderOptions options;
  options.now = std::tm{};
  options.now->tm_year = std::stoi(ymd.substr(0, 4)) - 1900;
  options.now->tm_mon = std::stoi(ymd.substr(5, 2)) - 1;
  options.now->tm_mday = std::stoi(ymd.substr(8, 2));
  Recorder rec;
  int compared = 0;
  for (const auto& [name, fixture] : expected.items()) {
    const ChatTemplate tmpl(read_file(dir + "/templates/" + name + ".jinja"));
    for (const auto& [c, body] : responses_cases()) {
      const json& want = fixture["cases"][c];
      if (!want.contains("text")) continue;  // the template refuses the conversation
      parse_responses_request(RequestJson::parse(body), rec.m);  // what the template is given
      ojson vars = {{"messages", rec.messages}, {"add_generation_prompt", true},
                    {"bos_token", fixture["bos_token"]}, {"eos_token", fixture["eos_token"]}};
      if (!rec.tools.is_null()) vars["tools"] = rec.tools;
      EXPECT_EQ(tmpl.render(vars, options), want["text"].get<std::string>()) << name << " / " << c;
      ++compared;
    }
  }
  EXPECT_GE(compared, 40);
}

TEST(ResponsesRequests, ItemsBecomeChatMessages) {
  const RequestJson chat = responses_to_chat_body(RequestJson::parse(R"({"model": "gpt-x", "instructions": "Be brief.",
    "input": [{"role": "developer", "content": "Use tools."},
      {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"role": "assistant", "content": "Let me look."},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "G"}]},
      {"type": "function_call_output", "call_id": "c1", "output": "F"},
      {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"}],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "function", "name": "g"}],
    "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false, "max_output_tokens": 9,
    "temperature": 0.3, "top_p": 0.5, "stream": true, "store": false, "truncation": "disabled", "metadata": {"k": "v"},
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true}},
    "top_k": 4, "min_p": 0.1, "seed": 7, "logit_bias": {"5": 1}})"));
  const ojson want = ojson::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": "Use tools."},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
      {"role": "tool", "name": "g", "tool_call_id": "c2", "content": "G"},
      {"role": "tool", "name": "f", "tool_call_id": "c1", "content": "F"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "g"}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": true}},
    "max_tokens": 9, "temperature": 0.3, "top_p": 0.5, "parallel_tool_calls": false, "stream": true,
    "top_k": 4, "seed": 7, "min_p": 0.1})");  // tessera's extensions pass; chat-only fields (logit_bias) do not
  EXPECT_EQ(chat.dump(), want.dump());
  // A string input is one user message; the chat parser reads the rest.
  Recorder rec;
  json echo;
  const ParsedRequest r = parse_responses_request(
      RequestJson::parse(std::string(R"({"input": "hi", "max_output_tokens": 5, "temperature": 0, "tools": [)") +
                         kWeatherTool + "]}"),
      rec.m, &echo);
  EXPECT_EQ(rec.messages.dump(), R"([{"role":"user","content":"hi"}])");
  EXPECT_EQ(r.gen.max_tokens, 5);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.tool_format, ToolCallFormat::Hermes);
  EXPECT_EQ(echo["max_output_tokens"], 5);
  EXPECT_EQ(echo["tools"][0]["name"], "get_weather");  // echoed in the Responses form
  EXPECT_EQ(echo["tool_choice"], "auto");
  EXPECT_EQ(echo["top_p"], 1.0);
  EXPECT_EQ(echo["instructions"], nullptr);
}

// A reasoning item goes with the assistant turn that follows it.
TEST(ResponsesRequests, ReasoningItemsGoWithTheNextAssistantTurn) {
  const RequestJson chat = responses_to_chat_body(RequestJson::parse(R"({"input": [
      {"role": "user", "content": "x"},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Need f."}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "F"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
      {"role": "assistant", "content": "Done."},
      {"role": "user", "content": "y"}]})"));
  const auto& m = chat["messages"];
  EXPECT_EQ(m[1]["reasoning_content"], "Need f.");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "c1");
  EXPECT_FALSE(m[3].contains("reasoning_content"));  // a summary only: no reasoning text
  EXPECT_EQ(m[3]["content"], "Done.");
}

TEST(ResponsesRequests, WhatIsWrongOrUnsupportedIsA400NamingTheField) {
  Recorder rec;
  struct Case {
    std::string body;
    const char* param;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"[1]", "", "JSON object"},
           {R"({})", "input", "'input' is required"},
           {R"({"input": []})", "input", "non-empty"},
           {R"({"input": 5})", "input", "string or a non-empty list"},
           {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id", "stateless"},
           {R"({"input": "x", "conversation": "conv_1"})", "conversation", "stateless"},
           {R"({"input": "x", "store": true})", "store", "keeps no responses"},
           {R"({"input": "x", "store": "no"})", "store", "boolean"},
           {R"({"input": "x", "background": true})", "background", "background"},
           {R"({"input": "x", "truncation": "auto"})", "truncation", "disabled"},
           {R"({"input": "x", "instructions": 3})", "instructions", "string"},
           {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "'max_output_tokens' must be at least 1"},
           {R"({"input": "x", "max_output_tokens": 100})", "max_output_tokens", "maximum context length"},
           {R"({"input": "x", "temperature": 3})", "temperature", "temperature"},
           {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", "input",
            "input[0].content[0]: content parts of type 'input_image' are not supported"},
           {R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})", "input", "'input_file'"},
           {R"({"input": [{"role": "tool", "content": "x"}]})", "input", "unknown role 'tool'"},
           {R"({"input": [{"role": "user"}]})", "input", "'content'"},
           {R"({"input": [{"type": "reasoning", "content": [{"type": "summary_text", "text": "x"}]}]})", "input",
            "input[0].content[0] must be a reasoning_text part"},
           {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input", "'item_reference'"},
           {R"({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})", "input",
            "matches no earlier function_call"},
           {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]})", "input",
            "arguments"},
           {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input", "'call_id'"},
           {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools", "hosted tools"},
           {R"({"input": "x", "tools": [{"type": "function"}]})", "tools", "'name'"},
           {R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]})", "tools", "JSON Schema"},
           // (This model context compiles no grammars: what needs one is refused, naming the field.)
           {R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"})", "tool_choice",
            "cannot constrain"},
           {R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "f"}})",
            "tool_choice", "cannot constrain"},
           {R"({"input": "x", "text": {"format": {"type": "json_object"}}})", "text", "cannot constrain"},
           {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text", "'text' type must be"},
           {R"({"input": "x", "text": 3})", "text", "object"},
       }) {
    try {
      parse_responses_request(RequestJson::parse(c.body), rec.m);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.body;
      EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << "\n  said: " << e.what();
    }
  }
}

const std::vector<ToolCall> kCalls = {{"call_1", "get_weather", R"({"city": "Paris"})"}, {"call_2", "get_time", "{}"}};
const json kEcho = {{"instructions", nullptr}, {"max_output_tokens", 30}, {"temperature", 1.0}, {"top_p", 1.0},
                    {"tool_choice", "auto"}, {"tools", json::array()}, {"parallel_tool_calls", true},
                    {"metadata", json::object()}};

TEST(ResponsesResponses, StatusAndResponseObject) {
  EXPECT_STREQ(response_status(FinishReason::Stop, false), "completed");
  EXPECT_STREQ(response_status(FinishReason::Length, false), "incomplete");
  EXPECT_STREQ(response_status(FinishReason::ContextFull, false), "incomplete");
  EXPECT_STREQ(response_status(FinishReason::Length, true), "completed");
  const ResponseIds ids{"resp_abc", 1700000000, "m"};
  json r = response_object(ids, kEcho, "completed", "Sure.", kCalls, 12, 30);
  EXPECT_EQ(r["id"], "resp_abc");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 1700000000);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["incomplete_details"], nullptr);
  EXPECT_EQ(r["max_output_tokens"], 30);
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(r["output"], json::parse(R"([
      {"id": "msg_abc", "type": "message", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]},
      {"id": "fc_abc_0", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}"},
      {"id": "fc_abc_1", "type": "function_call", "status": "completed", "call_id": "call_2", "name": "get_time",
       "arguments": "{}"}])"));
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
      "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42})"));
  r = response_object(ids, kEcho, "incomplete", "Su", {}, 12, 30);
  EXPECT_EQ(r["incomplete_details"], json::parse(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  r = response_object(ids, kEcho, "completed", "", kCalls, 12, 30);
  EXPECT_EQ(r["output"].size(), 2u) << "calls without text: no message item";
  r = response_object(ids, kEcho, "completed", "", {}, 12, 0);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "") << "no text and no call: an empty message";
  r = response_object(ids, kEcho, "in_progress", "", {}, 12, 0);
  EXPECT_EQ(r["output"], json::array());
  EXPECT_EQ(r["usage"], nullptr);
}

std::vector<json> parse_sse(const std::string& s) {
  std::vector<json> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "an event not ended by a blank line";
      break;
    }
    const std::string ev = s.substr(at, end - at);
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    json data = json::parse(ev.substr(nl + 7));
    EXPECT_EQ(data["type"], ev.substr(7, nl - 7));
    out.push_back(std::move(data));
    at = end + 2;
  }
  return out;
}

// The openai SDK's accumulation (ResponseStream), simplified: the snapshot from
// response.created, items and parts added, deltas appended.
json accumulate(const std::vector<json>& events) {
  json snap;
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["sequence_number"], i);
    const std::string t = e["type"];
    if (t == "response.created") snap = e["response"];
    if (t == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], snap["output"].size());
      snap["output"].push_back(e["item"]);
    }
    if (t == "response.content_part.added") snap["output"][e["output_index"].get<size_t>()]["content"].push_back(e["part"]);
    if (t == "response.output_text.delta" || t == "response.reasoning_text.delta") {
      json& part = snap["output"][e["output_index"].get<size_t>()]["content"][e["content_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + e["delta"].get<std::string>();
    }
    if (t == "response.function_call_arguments.delta") {
      json& item = snap["output"][e["output_index"].get<size_t>()];
      item["arguments"] = item["arguments"].get<std::string>() + e["delta"].get<std::string>();
    }
    if (t == "response.output_item.done") {
      // The item as it is done equals what the deltas built, but for its status.
      json built = snap["output"][e["output_index"].get<size_t>()];
      built["status"] = e["item"]["status"];
      EXPECT_EQ(built, e["item"]);
      snap["output"][e["output_index"].get<size_t>()] = e["item"];
    }
  }
  return snap;
}

std::vector<std::string> types(const std::vector<json>& events) {
  std::vector<std::string> v;
  for (const auto& e : events) v.push_back(e["type"]);
  return v;
}

TEST(ResponsesResponses, StreamEventsInOrderAddUpToTheResponse) {
  const ResponseIds ids{"resp_abc", 1700000000, "m"};
  ResponseEvents ev(ids, kEcho, 12);
  std::string s = ev.start();
  s += ev.delta(AnswerDelta{});
  s += ev.delta(AnswerDelta{"Su", {}, {}, {}});
  s += ev.delta(AnswerDelta{"re.", {}, kCalls, {}});
  s += ev.finish("completed", 30);
  const auto events = parse_sse(s);
  EXPECT_EQ(types(events),
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done", "response.output_item.done",
                "response.output_item.added", "response.function_call_arguments.delta",
                "response.function_call_arguments.done", "response.output_item.done", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"}));
  const json whole = response_object(ids, kEcho, "completed", "Sure.", kCalls, 12, 30);
  EXPECT_EQ(events.back()["response"], whole);
  json built = accumulate(events);
  EXPECT_EQ(built["output"], whole["output"]);
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");

  // gpt-oss: a reasoning item first, then the message and a call.
  ResponseEvents think(ids, kEcho, 12);
  s = think.start();
  s += think.delta(AnswerDelta{"", {}, {}, "Need"});
  s += think.delta(AnswerDelta{"", {}, {}, " it."});
  s += think.delta(AnswerDelta{"Ok.", {}, {kCalls[0]}, ""});
  s += think.finish("completed", 30);
  const auto th = parse_sse(s);
  EXPECT_EQ(types(th),
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
                "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                "response.output_text.done", "response.content_part.done", "response.output_item.done",
                "response.output_item.added", "response.function_call_arguments.delta",
                "response.function_call_arguments.done", "response.output_item.done", "response.completed"}));
  const json with_reasoning = response_object(ids, kEcho, "completed", "Ok.", {kCalls[0]}, 12, 30, "Need it.");
  EXPECT_EQ(with_reasoning["output"][0], json::parse(R"({"id": "rs_abc", "type": "reasoning", "status": "completed",
      "summary": [], "content": [{"type": "reasoning_text", "text": "Need it."}]})"));
  EXPECT_EQ(th.back()["response"], with_reasoning);
  EXPECT_EQ(accumulate(th)["output"], with_reasoning["output"]);

  // Text only, cut by max_output_tokens; nothing at all; an engine failure.
  ResponseEvents cut(ids, kEcho, 12);
  // (One statement per call: the events are numbered in the order they are made.)
  s = cut.start();
  s += cut.delta(AnswerDelta{"Hi", {}, {}, {}});
  s += cut.finish("incomplete", 30);
  const auto c = parse_sse(s);
  EXPECT_EQ(c.back()["type"], "response.incomplete");
  EXPECT_EQ(c.back()["response"], response_object(ids, kEcho, "incomplete", "Hi", {}, 12, 30));
  EXPECT_EQ(accumulate(c)["output"], c.back()["response"]["output"]);
  ResponseEvents none(ids, kEcho, 12);
  s = none.start();
  s += none.finish("completed", 1);
  const auto n = parse_sse(s);
  EXPECT_EQ(accumulate(n)["output"], response_object(ids, kEcho, "completed", "", {}, 12, 1)["output"]);
  ResponseEvents fail(ids, kEcho, 12);
  s = fail.start();
  s += fail.failed("the engine failed");
  const auto f = parse_sse(s);
  EXPECT_EQ(f.back()["type"], "response.failed");
  EXPECT_EQ(f.back()["response"]["status"], "failed");
  EXPECT_EQ(f.back()["response"]["error"]["message"], "the engine failed");
}

}  // namespace
}  // namespace tessera::server
