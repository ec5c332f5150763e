#include "server/responses_api.h"

#include <map>

#include "server/exchange.h"
#include "server/request_fields.h"

namespace tessera::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::string string_field(const RequestJson& item, const char* key, const std::string& where) {
  auto it = item.find(key);
  if (it == item.end() || !it->is_string() || it->get_ref<const std::string&>().empty())
    bad("input", where + " needs a non-empty string '" + key + "'", "invalid_type");
  return it->get<std::string>();
}

[[noreturn]] void unsupported_part(const std::string& where, const std::string& type) {
  bad("input", where + ": content parts of type '" + type + "' are not supported by this server (text only)",
      "unsupported_content");
}

// A message item's content: a string, or input_text / output_text parts as the chat
// form's text parts (the chat parser joins them).
ojson message_content(const RequestJson& c, const std::string& where) {
  if (c.is_string()) return c;
  if (!c.is_array()) bad("input", where + ": 'content' must be a string or a list of content parts", "invalid_type");
  ojson parts = ojson::array();
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!c[i].is_object() || !c[i].contains("type") || !c[i]["type"].is_string())
      bad("input", at + " must be a content part with a string 'type'", "invalid_type");
    const std::string type = c[i]["type"].get<std::string>();
    if (type != "input_text" && type != "output_text") unsupported_part(at, type);
    auto t = c[i].find("text");
    if (t == c[i].end() || !t->is_string()) bad("input", at + " needs a string 'text'", "invalid_type");
    parts.push_back({{"type", "text"}, {"text", *t}});
  }
  return parts;
}

// A function_call_output's output: a string or input_text parts, joined.
std::string call_output(const RequestJson& o, const std::string& where) {
  if (o.is_string()) return o.get<std::string>();
  if (!o.is_array()) bad("input", where + ": 'output' must be a string or a list of input_text parts", "invalid_type");
  std::string text;
  for (size_t i = 0; i < o.size(); ++i) {
    const std::string at = where + ".output[" + std::to_string(i) + "]";
    if (!o[i].is_object() || o[i].value("type", "") != "input_text") {
      if (o[i].is_object() && o[i].contains("type") && o[i]["type"].is_string())
        unsupported_part(at, o[i]["type"].get<std::string>());
      bad("input", at + " must be an input_text part", "invalid_type");
    }
    auto t = o[i].find("text");
    if (t == o[i].end() || !t->is_string()) bad("input", at + " needs a string 'text'", "invalid_type");
    text += t->get<std::string>();
  }
  return text;
}

// A reasoning item's text: its reasoning_text parts joined (summaries are left out).
std::string reasoning_text(const RequestJson& item, const std::string& where) {
  std::string text;
  auto c = item.find("content");
  if (c == item.end() || c->is_null()) return text;
  if (!c->is_array()) bad("input", where + ": 'content' must be a list of reasoning_text parts", "invalid_type");
  for (size_t i = 0; i < c->size(); ++i) {
    const RequestJson& part = (*c)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    auto t = part.is_object() ? part.find("text") : part.end();
    if (!part.is_object() || part.value("type", "") != "reasoning_text" || t == part.end() || !t->is_string())
      bad("input", at + " must be a reasoning_text part with a string 'text'", "invalid_type");
    if (!text.empty()) text += "\n";
    text += t->get<std::string>();
  }
  return text;
}

void add_items(const RequestJson& input, ojson& messages) {
  std::map<std::string, std::string> call_names;  // call_id -> function name
  // A reasoning item's text goes with the assistant turn that follows it (the chat
  // form's reasoning_content, which the gpt-oss template renders before a call).
  std::string reasoning;
  auto with_reasoning = [&](ojson m) {
    if (!reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
    reasoning.clear();
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const RequestJson& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) bad("input", where + " must be an object", "invalid_type");
    std::string type = "message";
    if (auto t = item.find("type"); t != item.end() && !t->is_null()) {
      if (!t->is_string()) bad("input", where + ": 'type' must be a string", "invalid_type");
      type = t->get<std::string>();
    }
    if (type == "message") {
      auto role = item.find("role");
      if (role == item.end() || !role->is_string()) bad("input", where + " needs a string 'role'", "invalid_type");
      const std::string r = role->get<std::string>();
      if (r != "user" && r != "assistant" && r != "system" && r != "developer")
        bad("input", where + ": unknown role '" + r + "' (user, assistant, system or developer)");
      auto c = item.find("content");
      if (c == item.end() || c->is_null()) bad("input", where + " needs 'content'", "missing_required_parameter");
      ojson m = {{"role", r}, {"content", message_content(*c, where)}};
      messages.push_back(r == "assistant" ? with_reasoning(std::move(m)) : std::move(m));
    } else if (type == "function_call") {
      const std::string id = string_field(item, "call_id", where), name = string_field(item, "name", where);
      auto args = item.find("arguments");
      if (args == item.end() || !args->is_string())
        bad("input", where + " needs 'arguments' (the call's arguments as JSON text)", "invalid_type");
      // The chat parser gives the template the arguments as an object.
      ojson call = {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *args}}}};
      call_names[id] = name;
      // Calls after an assistant message (or after each other) belong to that turn.
      if (!messages.empty() && messages.back()["role"] == "assistant") {
        ojson& turn = messages.back();
        if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
        turn["tool_calls"].push_back(std::move(call));
      } else {
        messages.push_back(
            with_reasoning({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({std::move(call)})}}));
      }
    } else if (type == "function_call_output") {
      const std::string id = string_field(item, "call_id", where);
      auto name = call_names.find(id);
      if (name == call_names.end())
        bad("input", where + ": call_id '" + id + "' matches no earlier function_call item");
      auto out = item.find("output");
      if (out == item.end() || out->is_null()) bad("input", where + " needs 'output'", "missing_required_parameter");
      messages.push_back(
          {{"role", "tool"}, {"name", name->second}, {"tool_call_id", id}, {"content", call_output(*out, where)}});
    } else if (type == "reasoning") {
      if (!reasoning.empty()) reasoning += "\n";
      reasoning += reasoning_text(item, where);
    } else {
      bad("input", where + ": items of type '" + type + "' are not supported by this server (message, "
                   "function_call, function_call_output and reasoning are)", "unsupported_parameter");
    }
  }
}

ojson chat_tools(const RequestJson& t) {
  if (!t.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  ojson tools = ojson::array();
  for (size_t i = 0; i < t.size(); ++i) {
    const RequestJson& tool = t[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || !tool.contains("type") || !tool["type"].is_string())
      bad("tools", at + " must be an object with a string 'type'", "invalid_type");
    if (tool["type"] != "function")
      bad("tools", at + ": tools of type '" + tool["type"].get<std::string>() + "' (hosted tools) are not "
                   "supported; only function tools are", "unsupported_parameter");
    auto name = tool.find("name");
    if (name == tool.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      bad("tools", at + " needs a non-empty string 'name'", "invalid_type");
    ojson fn = {{"name", *name}};
    if (auto d = tool.find("description"); d != tool.end() && !d->is_null()) {
      if (!d->is_string()) bad("tools", at + ": 'description' must be a string", "invalid_type");
      fn["description"] = *d;
    }
    if (auto p = tool.find("parameters"); p != tool.end() && !p->is_null()) {
      if (!p->is_object()) bad("tools", at + ": 'parameters' must be a JSON Schema object", "invalid_type");
      fn["parameters"] = *p;
    }
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return tools;
}

// The Responses field a chat-parser error names.
std::string responses_param(const std::string& param) {
  if (param == "max_tokens") return "max_output_tokens";
  if (param == "messages") return "input";
  if (param == "response_format") return "text";
  return param;
}

}  // namespace

RequestJson responses_to_chat_body(const RequestJson& body) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  // Stateless: nothing is stored, so nothing can be referred to later.
  for (const char* key : {"previous_response_id", "conversation", "prompt"})
    if (auto it = body.find(key); it != body.end() && !it->is_null())
      bad(key, std::string("'") + key + "' is not supported: this server is stateless (send the whole conversation "
                                        "in 'input')", "unsupported_parameter");
  if (bool store = false; get(body, "store", store) && store)
    bad("store", "'store': true is not supported: this server keeps no responses (send store: false)",
        "unsupported_parameter");
  if (bool background = false; get(body, "background", background) && background)
    bad("background", "'background': true is not supported", "unsupported_parameter");
  if (auto t = body.find("truncation"); t != body.end() && !t->is_null() && *t != "disabled")
    bad("truncation", "only 'truncation': \"disabled\" is supported", "unsupported_parameter");
  if (auto m = body.find("model"); m != body.end() && !m->is_null() && !m->is_string())
    bad("model", "'model' must be a string", "invalid_type");
  ojson messages = ojson::array();
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) bad("instructions", "'instructions' must be a string", "invalid_type");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) bad("input", "'input' is required", "missing_required_parameter");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    add_items(*input, messages);
  } else {
    bad("input", "'input' must be a string or a non-empty list of items", "invalid_type");
  }
  RequestJson chat = {{"messages", std::move(messages)}};
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    ojson tools = chat_tools(*t);
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    // {"type": "function", "name"} is chat's {"type": "function", "function": {"name"}}.
    if (c->is_object() && c->value("type", "") == "function" && c->contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    else
      chat["tool_choice"] = *c;
  }
  if (auto f = body.find("text"); f != body.end() && !f->is_null()) {
    if (!f->is_object()) bad("text", "'text' must be an object", "invalid_type");
    if (auto fmt = f->find("format"); fmt != f->end() && !fmt->is_null()) {
      if (!fmt->is_object()) bad("text", "'text.format' must be an object", "invalid_type");
      // Chat's response_format: json_schema's fields sit one level down there.
      if (fmt->value("type", "") == "json_schema") {
        RequestJson schema = *fmt;
        schema.erase("type");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else {
        chat["response_format"] = *fmt;
      }
    }
  }
  if (auto m = body.find("max_output_tokens"); m != body.end() && !m->is_null()) chat["max_tokens"] = *m;
  for (const char* key : {"temperature", "top_p", "parallel_tool_calls", "stream", "top_k"})
    if (auto v = body.find(key); v != body.end() && !v->is_null()) chat[key] = *v;
  for (const char* key : kSamplingExtensions)
    if (auto v = body.find(key); v != body.end() && !v->is_null()) chat[key] = *v;
  return chat;
}

ParsedRequest parse_responses_request(const RequestJson& body, const ModelContext& m, json* echo) {
  const RequestJson chat = responses_to_chat_body(body);
  ParsedRequest r;
  try {
    r = parse_chat_request(chat, m);
  } catch (const ApiError& e) {
    const std::string param = responses_param(e.param);
    std::string message = e.what();
    if (param != e.param)
      for (size_t at = 0; (at = message.find("'" + e.param + "'", at)) != std::string::npos; at += param.size() + 2)
        message.replace(at, e.param.size() + 2, "'" + param + "'");
    throw ApiError(e.status, message, param, e.code, e.type);
  }
  if (echo) {
    auto field = [&](const char* key, json fallback) {
      auto it = body.find(key);
      return it == body.end() || it->is_null() ? fallback : json(*it);
    };
    *echo = {{"instructions", field("instructions", nullptr)},
             {"max_output_tokens", field("max_output_tokens", nullptr)},
             {"temperature", field("temperature", 1.0)},
             {"top_p", field("top_p", 1.0)},
             {"tool_choice", field("tool_choice", "auto")},
             {"tools", field("tools", json::array())},
             {"parallel_tool_calls", field("parallel_tool_calls", true)},
             {"metadata", field("metadata", json::object())}};
  }
  return r;
}

const char* response_status(FinishReason ended, bool tool_calls) {
  if (!tool_calls && (ended == FinishReason::Length || ended == FinishReason::ContextFull)) return "incomplete";
  return "completed";
}

namespace {

// Item ids derived from the response's: "resp_X" has the message "msg_X" and calls "fc_X_N".
std::string item_id(const ResponseIds& ids, const char* prefix) {
  const size_t us = ids.id.find('_');
  return prefix + (us == std::string::npos ? ids.id : ids.id.substr(us + 1));
}

json message_item(const ResponseIds& ids, const std::string& status, json content) {
  return {{"id", item_id(ids, "msg_")},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

json reasoning_item(const ResponseIds& ids, size_t n, const std::string& status, const std::string& text) {
  return {{"id", item_id(ids, "rs_") + (n ? "_" + std::to_string(n) : std::string())},
          {"type", "reasoning"},
          {"status", status},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json text_part(const std::string& text) { return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}; }

json call_item(const ResponseIds& ids, size_t i, const ToolCall& c, const std::string& status, const std::string& arguments) {
  return {{"id", item_id(ids, "fc_") + "_" + std::to_string(i)},
          {"type", "function_call"},
          {"status", status},
          {"call_id", c.id},
          {"name", c.name},
          {"arguments", arguments}};
}

}  // namespace

json response_object(const ResponseIds& ids, const json& echo, const std::string& status, const std::string& text,
                     const std::vector<ToolCall>& calls, int64_t input_tokens, int64_t output_tokens,
                     const std::string& reasoning, int64_t reasoning_tokens) {
  const bool done = status != "in_progress";
  json output = json::array();
  if (done && !reasoning.empty()) output.push_back(reasoning_item(ids, 0, "completed", reasoning));
  if (done && (!text.empty() || calls.empty()))
    output.push_back(message_item(ids, status == "incomplete" ? "incomplete" : "completed", json::array({text_part(text)})));
  if (done)
    for (size_t i = 0; i < calls.size(); ++i) output.push_back(call_item(ids, i, calls[i], "completed", calls[i].arguments));
  json r = {{"id", ids.id},
            {"object", "response"},
            {"created_at", ids.created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"model", ids.model},
            {"output", std::move(output)},
            {"previous_response_id", nullptr},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"store", false},
            {"text", {{"format", {{"type", "text"}}}}},
            {"truncation", "disabled"},
            {"user", nullptr},
            {"usage", done ? json{{"input_tokens", input_tokens},
                                  {"input_tokens_details", {{"cached_tokens", 0}}},
                                  {"output_tokens", output_tokens},
                                  {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                                  {"total_tokens", input_tokens + output_tokens}}
                           : json(nullptr)}};
  for (const auto& [k, v] : echo.items()) r[k] = v;
  return r;
}

std::string ResponseEvents::event(const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return sse_event(type, fields);
}

std::string ResponseEvents::start() {
  const json r = response_object(ids_, echo_, "in_progress", "", {}, input_tokens_, 0);
  // (Each event takes the next sequence number: one statement each.)
  std::string out = event("response.created", {{"response", r}});
  out += event("response.in_progress", {{"response", r}});
  return out;
}

std::string ResponseEvents::open_reasoning() {
  std::string out = close_reasoning();
  reasoning_open_ = true;
  reasoning_index_ = items_++;
  reasoning_.clear();
  json item = reasoning_item(ids_, reasoning_items_, "in_progress", "");
  item["content"] = json::array();  // its part is added next, as a message's is
  out += event("response.output_item.added", {{"output_index", reasoning_index_}, {"item", item}});
  out += event("response.content_part.added", {{"item_id", item["id"]},
                                               {"output_index", reasoning_index_},
                                               {"content_index", 0},
                                               {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  return out;
}

std::string ResponseEvents::close_reasoning() {
  if (!reasoning_open_) return {};
  reasoning_open_ = false;
  const json item = reasoning_item(ids_, reasoning_items_++, "completed", reasoning_);
  json where = {{"item_id", item["id"]}, {"output_index", reasoning_index_}, {"content_index", 0}};
  json text_done = where, part_done = where;
  text_done["text"] = reasoning_;
  part_done["part"] = {{"type", "reasoning_text"}, {"text", reasoning_}};
  std::string out = event("response.reasoning_text.done", std::move(text_done));
  out += event("response.content_part.done", std::move(part_done));
  out += event("response.output_item.done", {{"output_index", reasoning_index_}, {"item", item}});
  return out;
}

std::string ResponseEvents::open_message() {
  std::string out = close_reasoning();
  message_open_ = true;
  message_index_ = items_++;
  const std::string id = item_id(ids_, "msg_");
  out += event("response.output_item.added",
               {{"output_index", message_index_}, {"item", message_item(ids_, "in_progress", json::array())}});
  out += event("response.content_part.added",
               {{"item_id", id}, {"output_index", message_index_}, {"content_index", 0}, {"part", text_part("")}});
  return out;
}

std::string ResponseEvents::close_message(const std::string& status) {
  message_open_ = false;
  message_done_ = true;
  const std::string id = item_id(ids_, "msg_");
  json where = {{"item_id", id}, {"output_index", message_index_}, {"content_index", 0}};
  json text_done = where, part_done = where;
  text_done["text"] = text_;
  part_done["part"] = text_part(text_);
  std::string out = event("response.output_text.done", std::move(text_done));
  out += event("response.content_part.done", std::move(part_done));
  out += event("response.output_item.done",
               {{"output_index", message_index_}, {"item", message_item(ids_, status, json::array({text_part(text_)}))}});
  return out;
}

std::string ResponseEvents::delta(const AnswerDelta& d) {
  std::string out;
  // Reasoning comes before the message; reasoning after the message's text has begun
  // (a model out of its format) is a reasoning item of its own after it.
  if (!d.reasoning.empty()) {
    if (!reasoning_open_) out += open_reasoning();
    reasoning_ += d.reasoning;
    all_reasoning_ += d.reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", reasoning_item(ids_, reasoning_items_, "", "")["id"]},
                                                   {"output_index", reasoning_index_},
                                                   {"content_index", 0},
                                                   {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (!message_open_) out += open_message();
    text_ += d.content;
    out += event("response.output_text.delta", {{"item_id", item_id(ids_, "msg_")},
                                                {"output_index", message_index_},
                                                {"content_index", 0},
                                                {"delta", d.content}});
  }
  if (d.tool_calls.empty()) return out;
  out += close_reasoning();
  if (message_open_) out += close_message("completed");
  for (const ToolCall& c : d.tool_calls) {
    const size_t i = calls_.size();
    calls_.push_back(c);
    const int64_t index = items_++;
    const json item = call_item(ids_, i, c, "in_progress", "");
    const std::string id = item["id"];
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", id}, {"output_index", index}, {"delta", c.arguments}});
    out += event("response.function_call_arguments.done",
                 {{"item_id", id}, {"output_index", index}, {"arguments", c.arguments}});
    out += event("response.output_item.done",
                 {{"output_index", index}, {"item", call_item(ids_, i, c, "completed", c.arguments)}});
  }
  return out;
}

std::string ResponseEvents::finish(const std::string& status, int64_t output_tokens, int64_t reasoning_tokens) {
  std::string out = close_reasoning();
  // No text and no call: the message item is there, empty, as in the whole Response.
  if (!message_open_ && !message_done_ && calls_.empty()) out += open_message();
  if (message_open_) out += close_message(status == "incomplete" ? "incomplete" : "completed");
  const json r =
      response_object(ids_, echo_, status, text_, calls_, input_tokens_, output_tokens, all_reasoning_, reasoning_tokens);
  out += event(status == "incomplete" ? "response.incomplete" : "response.completed", {{"response", r}});
  return out;
}

std::string ResponseEvents::failed(const std::string& message) {
  json r = response_object(ids_, echo_, "in_progress", "", {}, input_tokens_, 0);
  r["status"] = "failed";
  r["error"] = {{"code", "server_error"}, {"message", message}};
  return event("response.failed", {{"response", std::move(r)}});
}

namespace {

class Responses final : public ApiDialect {
 public:
  const char* id_prefix() const override { return "resp_"; }
  json error(int status, const std::string& message, const std::string& param, const std::string& code) const override {
    return error_body(message, status >= 500 ? "server_error" : "invalid_request_error", param, code);
  }
  ParsedRequest parse(const RequestJson& body, const ModelContext& m, json& context) const override {
    return parse_responses_request(body, m, &context);
  }
  json response(const Exchange& ex, const AnswerDelta& all, const json& echo) const override {
    return response_object(ex.ids, echo, response_status(ex.ended, !all.tool_calls.empty()), all.content, all.tool_calls,
                           int64_t(ex.req.gen.prompt.size()), ex.completion_tokens, all.reasoning,
                           ex.answer.reasoning_tokens());
  }
  class Events final : public Stream {
   public:
    Events(const Exchange& ex, const json& echo) : events_(ex.ids, echo, int64_t(ex.req.gen.prompt.size())) {}
    std::string start(const Exchange&) override { return events_.start(); }
    std::string advance(const Exchange& ex, const AnswerDelta& d) override {
      std::string out = events_.delta(d);
      if (ex.finished) {
        tool_calls_ = tool_calls_ || !d.tool_calls.empty();
        out += events_.finish(response_status(ex.ended, tool_calls_), ex.completion_tokens, ex.answer.reasoning_tokens());
      }
      return out;
    }
    std::string error(const Exchange&, const std::string& message) override { return events_.failed(message); }

   private:
    ResponseEvents events_;
    bool tool_calls_ = false;
  };
  std::unique_ptr<Stream> stream(const Exchange& ex, const json& echo) const override {
    return std::make_unique<Events>(ex, echo);
  }
};

}  // namespace

const ApiDialect& responses_dialect() {
  static const Responses dialect;
  return dialect;
}

}  // namespace tessera::server
