#include "server/anthropic_api.h"

#include <map>

#include "server/exchange.h"
#include "server/request_fields.h"

namespace tessera::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Beyond Anthropic's own limits: each stop sequence is searched for after every token.
constexpr size_t kMaxStopSequences = 64;

// Text blocks joined into one string, as a chat template expects a message's content.
constexpr const char* kBlockSeparator = "\n";

[[noreturn]] void unsupported_block(const std::string& where, const std::string& type) {
  if (type == "image" || type == "document")
    bad("messages", where + ": '" + type + "' content blocks are not supported by this server (text only)",
        "unsupported_content");
  bad("messages", where + ": content blocks of type '" + type + "' are not supported here", "unsupported_content");
}

std::string block_type(const RequestJson& block, const std::string& where) {
  if (!block.is_object()) bad("messages", where + " must be a content block object", "invalid_type");
  auto t = block.find("type");
  if (t == block.end() || !t->is_string()) bad("messages", where + " needs a string 'type'", "invalid_type");
  return t->get<std::string>();
}

std::string string_field(const RequestJson& block, const char* key, const std::string& param,
                         const std::string& where, bool non_empty = false) {
  auto it = block.find(key);
  if (it == block.end() || !it->is_string() || (non_empty && it->get_ref<const std::string&>().empty()))
    bad(param, where + " needs a " + (non_empty ? "non-empty " : "") + "string '" + key + "'", "invalid_type");
  return it->get<std::string>();
}

// A string, or a list of text blocks joined (system, tool_result content).
std::string text_of(const RequestJson& v, const std::string& param, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(param, where + " must be a string or a list of text blocks", "invalid_type");
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "." + std::to_string(i);
    const std::string type = block_type(v[i], at);
    if (type != "text") {
      if (param == "messages") unsupported_block(at, type);
      bad(param, at + ": only text blocks are allowed here", "invalid_type");
    }
    if (i > 0) text += kBlockSeparator;
    text += string_field(v[i], "text", param, at);
  }
  return text;
}

void append_text(std::string& text, bool& has_text, const std::string& more) {
  if (has_text) text += kBlockSeparator;
  text += more;
  has_text = true;
}

// One message of the conversation as chat messages (a user turn's tool results are
// each a "tool" message). tool_names: the name of every earlier tool_use id.
void add_message(const RequestJson& msg, const std::string& where, std::map<std::string, std::string>& tool_names,
                 ojson& out) {
  if (!msg.is_object()) bad("messages", where + " must be an object", "invalid_type");
  auto r = msg.find("role");
  if (r == msg.end() || !r->is_string()) bad("messages", where + " needs a string 'role'", "invalid_type");
  const std::string role = r->get<std::string>();
  if (role != "user" && role != "assistant")
    bad("messages", where + ": unknown role '" + role + "' (user or assistant; the system prompt is 'system')");
  auto c = msg.find("content");
  if (c == msg.end() || c->is_null()) bad("messages", where + " needs 'content'", "missing_required_parameter");
  if (c->is_string()) {
    out.push_back({{"role", role}, {"content", c->get<std::string>()}});
    return;
  }
  if (!c->is_array()) bad("messages", where + ": 'content' must be a string or a list of content blocks", "invalid_type");
  if (c->empty()) bad("messages", where + ": 'content' is empty");
  std::string text;
  bool has_text = false;
  if (role == "assistant") {
    ojson calls = ojson::array();
    std::string thinking;
    for (size_t i = 0; i < c->size(); ++i) {
      const RequestJson& b = (*c)[i];
      const std::string at = where + ".content." + std::to_string(i);
      const std::string type = block_type(b, at);
      if (type == "text") {
        append_text(text, has_text, string_field(b, "text", "messages", at));
      } else if (type == "thinking") {
        // An earlier answer's reasoning (we send it with an empty signature): the chat
        // form's reasoning_content, which a template may render (gpt-oss before a call).
        if (!thinking.empty()) thinking += kBlockSeparator;
        thinking += string_field(b, "thinking", "messages", at);
      } else if (type == "redacted_thinking") {
        // Another server's encrypted reasoning: nothing a template can render.
      } else if (type == "tool_use") {
        const std::string id = string_field(b, "id", "messages", at, true);
        const std::string name = string_field(b, "name", "messages", at, true);
        auto input = b.find("input");
        if (input == b.end() || !input->is_object()) bad("messages", at + " needs an object 'input'", "invalid_type");
        // The templates expect each call's arguments as an object (they apply tojson).
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *input}}}});
        tool_names[id] = name;
      } else if (type == "tool_result") {
        bad("messages", at + ": tool_result blocks belong in user messages");
      } else {
        unsupported_block(at, type);
      }
    }
    ojson m = {{"role", "assistant"}, {"content", text}};
    if (!thinking.empty()) m["reasoning_content"] = std::move(thinking);
    if (!calls.empty()) m["tool_calls"] = std::move(calls);
    out.push_back(std::move(m));
    return;
  }
  // A user turn: its text, and each tool result as the chat form's "tool" message, in
  // the order of the blocks.
  auto flush = [&] {
    if (has_text) out.push_back({{"role", "user"}, {"content", text}});
    text.clear();
    has_text = false;
  };
  for (size_t i = 0; i < c->size(); ++i) {
    const RequestJson& b = (*c)[i];
    const std::string at = where + ".content." + std::to_string(i);
    const std::string type = block_type(b, at);
    if (type == "text") {
      append_text(text, has_text, string_field(b, "text", "messages", at));
    } else if (type == "tool_result") {
      flush();
      const std::string id = string_field(b, "tool_use_id", "messages", at, true);
      auto name = tool_names.find(id);
      if (name == tool_names.end())
        bad("messages", at + ": tool_use_id '" + id + "' matches no tool_use block of an earlier assistant message");
      std::string content;
      if (auto rc = b.find("content"); rc != b.end() && !rc->is_null()) content = text_of(*rc, "messages", at + ".content");
      bool is_error = false;
      get(b, "is_error", is_error);  // type-checked; the template has no place for it
      out.push_back({{"role", "tool"}, {"name", name->second}, {"tool_call_id", id}, {"content", content}});
    } else if (type == "tool_use") {
      bad("messages", at + ": tool_use blocks belong in assistant messages");
    } else {
      unsupported_block(at, type);
    }
  }
  flush();
}

ojson tools_of(const RequestJson& t) {
  if (!t.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  ojson tools = ojson::array();
  for (size_t i = 0; i < t.size(); ++i) {
    const RequestJson& tool = t[i];
    const std::string at = "tools." + std::to_string(i);
    if (!tool.is_object()) bad("tools", at + " must be an object", "invalid_type");
    if (auto type = tool.find("type"); type != tool.end() && !type->is_null() && *type != "custom")
      bad("tools", at + ": tool type " + type->dump() + " (a server tool) is not supported; only client tools "
                   "with a name and an input_schema are", "unsupported_parameter");
    ojson fn = {{"name", string_field(tool, "name", "tools", at, true)}};
    if (auto d = tool.find("description"); d != tool.end() && !d->is_null()) {
      if (!d->is_string()) bad("tools", at + ": 'description' must be a string", "invalid_type");
      fn["description"] = *d;
    }
    auto schema = tool.find("input_schema");
    if (schema == tool.end() || !schema->is_object())
      bad("tools", at + " needs an 'input_schema' object (a JSON Schema)", "invalid_type");
    fn["parameters"] = *schema;
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return tools;
}

}  // namespace

bool is_anthropic_path(const std::string& path) {
  return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0;
}

json anthropic_error_body(int status, const std::string& message) {
  const char* type = "api_error";
  switch (status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: type = status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

RequestJson messages_to_chat_body(const RequestJson& body, bool counting) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  RequestJson chat = RequestJson::object();
  if (auto m = body.find("model"); m != body.end() && !m->is_null() && !m->is_string())
    bad("model", "'model' must be a string", "invalid_type");
  ojson messages = ojson::array();
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    const std::string system = text_of(*s, "system", "'system'");
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  }
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad("messages", "'messages' is required", "missing_required_parameter");
  if (!it->is_array() || it->empty()) bad("messages", "'messages' must be a non-empty array", "invalid_type");
  std::map<std::string, std::string> tool_names;
  for (size_t i = 0; i < it->size(); ++i) add_message((*it)[i], "messages." + std::to_string(i), tool_names, messages);
  // The chat template opens a new assistant turn after the conversation, so a last
  // assistant message could not be continued as Anthropic's API does.
  if (it->back().value("role", "") != "user")
    bad("messages", "the last message must be a user message (continuing an assistant message is not supported)");
  chat["messages"] = std::move(messages);
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    ojson tools = tools_of(*t);
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string())
      bad("tool_choice", "'tool_choice' must be an object with a string 'type'", "invalid_type");
    const std::string type = (*c)["type"].get<std::string>();
    // any and tool force a call: chat's "required" and named function.
    if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "tool") {
      auto name = c->find("name");
      if (name == c->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
        bad("tool_choice", "tool_choice 'tool' needs a non-empty string 'name'", "invalid_type");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else if (type != "auto") {
      bad("tool_choice", "'tool_choice' type must be 'auto', 'any', 'tool' or 'none'");
    }
    if (bool off = false; get(*c, "disable_parallel_tool_use", off)) chat["parallel_tool_calls"] = !off;
  }
  if (!counting) {
    auto mt = body.find("max_tokens");
    if (mt == body.end() || mt->is_null()) bad("max_tokens", "'max_tokens' is required", "missing_required_parameter");
    chat["max_tokens"] = *mt;  // the chat parser checks it
  }
  if (double t = 1.0; get(body, "temperature", t)) {
    if (t < 0.0 || t > 1.0) bad("temperature", "'temperature' must be in [0, 1]");
    chat["temperature"] = t;
  }
  for (const char* key : {"top_p", "top_k", "stream"})
    if (auto v = body.find(key); v != body.end() && !v->is_null()) chat[key] = *v;
  for (const char* key : kSamplingExtensions)
    if (auto v = body.find(key); v != body.end() && !v->is_null()) chat[key] = *v;
  return chat;
}

ParsedRequest parse_messages_request(const RequestJson& body, const ModelContext& m, bool counting) {
  RequestJson chat = messages_to_chat_body(body, counting);
  std::vector<std::string> stops;
  if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    if (!s->is_array()) bad("stop_sequences", "'stop_sequences' must be a list of strings", "invalid_type");
    if (s->size() > kMaxStopSequences)
      bad("stop_sequences", "'stop_sequences' holds at most " + std::to_string(kMaxStopSequences) + " strings");
    for (const auto& v : *s) {
      if (!v.is_string() || v.get_ref<const std::string&>().empty())
        bad("stop_sequences", "'stop_sequences' must be a list of non-empty strings", "invalid_type");
      stops.push_back(v.get<std::string>());
    }
  }
  ParsedRequest r = parse_chat_request(chat, m);
  r.stop = std::move(stops);
  return r;
}

const char* anthropic_stop_reason(FinishReason ended, bool stop_string, bool tool_calls) {
  if (tool_calls) return "tool_use";
  if (stop_string) return "stop_sequence";
  if (ended == FinishReason::Length || ended == FinishReason::ContextFull) return "max_tokens";
  return "end_turn";
}

namespace {

json tool_use_block(const ToolCall& call, bool with_input) {
  json input = json::object();
  if (with_input) {
    input = json::parse(call.arguments, nullptr, false);
    if (!input.is_object()) input = json::object();  // the parser only makes calls with object arguments
  }
  return {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}};
}

json stop_sequence_json(const char* stop_reason, const std::string& stop_sequence) {
  return std::string(stop_reason) == "stop_sequence" ? json(stop_sequence) : json(nullptr);
}

}  // namespace

json message_response(const ResponseIds& ids, const std::string& text, const std::vector<ToolCall>& calls,
                      const char* stop_reason, const std::string& stop_sequence, int64_t input_tokens,
                      int64_t output_tokens, const std::string& reasoning) {
  json content = json::array();
  if (!reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
  if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
  for (const ToolCall& c : calls) content.push_back(tool_use_block(c, true));
  return {{"id", ids.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", ids.model},
          {"content", std::move(content)},
          {"stop_reason", stop_reason},
          {"stop_sequence", stop_sequence_json(stop_reason, stop_sequence)},
          {"usage", {{"input_tokens", input_tokens}, {"output_tokens", output_tokens}}}};
}

std::string MessageEvents::start() const {
  json message = {{"id", ids_.id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", ids_.model},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}};
  return sse_event("message_start", {{"type", "message_start"}, {"message", std::move(message)}});
}

std::string MessageEvents::open_block(const json& block) {
  std::string out = close_block();
  out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", blocks_}, {"content_block", block}});
  ++blocks_;
  open_ = true;
  if (!pinged_) {
    pinged_ = true;
    out += sse_event("ping", {{"type", "ping"}});
  }
  return out;
}

std::string MessageEvents::close_block() {
  if (!open_) return {};
  open_ = false;
  return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", blocks_ - 1}});
}

std::string MessageEvents::delta(const AnswerDelta& d) {
  std::string out;
  auto block_delta = [&](json delta) {
    out += sse_event("content_block_delta",
                     {{"type", "content_block_delta"}, {"index", blocks_ - 1}, {"delta", std::move(delta)}});
  };
  // Reasoning comes before the text it leads to: each opens its own block.
  if (!d.reasoning.empty()) {
    if (!open_ || open_type_ != "thinking") {
      out += open_block({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      open_type_ = "thinking";
    }
    block_delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (!open_ || open_type_ != "text") {
      out += open_block({{"type", "text"}, {"text", ""}});
      open_type_ = "text";
    }
    block_delta({{"type", "text_delta"}, {"text", d.content}});
  }
  for (const ToolCall& c : d.tool_calls) {
    out += open_block(tool_use_block(c, false));
    open_type_ = "tool_use";
    block_delta({{"type", "input_json_delta"}, {"partial_json", c.arguments}});
    out += close_block();
  }
  return out;
}

std::string MessageEvents::finish(const char* stop_reason, const std::string& stop_sequence, int64_t output_tokens) {
  std::string out = close_block();
  out += sse_event("message_delta",
                   {{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence_json(stop_reason, stop_sequence)}}},
                    {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", output_tokens}}}});
  out += sse_event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string MessageEvents::error(int status, const std::string& message) {
  return sse_event("error", anthropic_error_body(status, message));
}

namespace {

const char* stop_reason(const Exchange& ex, bool tool_calls) {
  return anthropic_stop_reason(ex.ended, ex.stop_string, tool_calls);
}

class AnthropicMessages final : public ApiDialect {
 public:
  const char* id_prefix() const override { return "msg_"; }
  json error(int status, const std::string& message, const std::string&, const std::string&) const override {
    return anthropic_error_body(status, message);
  }
  ParsedRequest parse(const RequestJson& body, const ModelContext& m, json&) const override {
    return parse_messages_request(body, m);
  }
  json response(const Exchange& ex, const AnswerDelta& all, const json&) const override {
    return message_response(ex.ids, all.content, all.tool_calls, stop_reason(ex, !all.tool_calls.empty()),
                            ex.answer.stop_sequence(), int64_t(ex.req.gen.prompt.size()), ex.completion_tokens,
                            all.reasoning);
  }
  class Events final : public Stream {
   public:
    explicit Events(const Exchange& ex) : events_(ex.ids, int64_t(ex.req.gen.prompt.size())) {}
    std::string start(const Exchange&) override { return events_.start(); }
    std::string advance(const Exchange& ex, const AnswerDelta& d) override {
      std::string out = events_.delta(d);
      if (ex.finished)
        out += events_.finish(stop_reason(ex, !d.tool_calls.empty()), ex.answer.stop_sequence(), ex.completion_tokens);
      return out;
    }
    std::string error(const Exchange&, const std::string& message) override { return MessageEvents::error(500, message); }

   private:
    MessageEvents events_;
  };
  std::unique_ptr<Stream> stream(const Exchange& ex, const json&) const override { return std::make_unique<Events>(ex); }
};

}  // namespace

const ApiDialect& anthropic_messages_dialect() {
  static const AnthropicMessages dialect;
  return dialect;
}

}  // namespace tessera::server
