#include "server/openai_api.h"

#include <cmath>
#include <limits>

#include "server/request_fields.h"
#include "server/tool_call_grammar.h"
#include "tessera/json_schema_grammar.h"
#include "tessera/tokenizer.h"

namespace tessera::server {

using nlohmann::json;

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

namespace {

// Structured output: llama.cpp's `grammar` (GBNF), OpenAI's response_format
// (json_object, json_schema with its `strict`), or the grammar of a forced tool call;
// at most one of them.
void parse_structured_output(const RequestJson& body, const ModelContext& m, ParsedRequest& r) {
  std::string gbnf = r.tool_grammar;
  std::string param = gbnf.empty() ? "" : "tool_choice";
  auto take = [&](const std::string& from, std::string text) {
    if (!param.empty())
      bad(from, "'" + from + "' cannot be combined with '" + param + "': give one constraint on the answer");
    gbnf = std::move(text);
    param = from;
  };
  if (auto it = body.find("grammar"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad("grammar", "'grammar' must be a string of GBNF rules", "invalid_type");
    if (!it->get<std::string>().empty()) take("grammar", it->get<std::string>());
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("response_format", "'response_format' must be an object", "invalid_type");
    const auto type = it->find("type");
    if (type == it->end() || !type->is_string())
      bad("response_format", "'response_format' needs a string 'type'", "invalid_type");
    const std::string t = type->get<std::string>();
    // gpt-oss writes the JSON as its final message, perhaps after reasoning.
    const bool harmony = r.chat && m.tool_format == ToolCallFormat::Harmony;
    auto json_answer = [&](const std::string& schema, const JsonSchemaOptions& o) {
      return harmony ? harmony_final_gbnf(json_schema_rules(schema, "answer", o), "answer") : json_schema_to_gbnf(schema, o);
    };
    if (t == "json_object") {
      take("response_format", harmony ? json_answer(R"({"type": "object", "additionalProperties": true})", {})
                                      : json_object_gbnf());
    } else if (t == "json_schema") {
      const auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        bad("response_format", "'response_format' of type json_schema needs a 'json_schema' object",
            "missing_required_parameter");
      const auto schema = js->find("schema");
      JsonSchemaOptions o;
      if (auto st = js->find("strict"); st != js->end() && !st->is_null()) {
        if (!st->is_boolean()) bad("response_format", "'json_schema.strict' must be a boolean", "invalid_type");
        o.strict = st->get<bool>();
      } else {
        o.strict = false;  // OpenAI's default
      }
      const std::string text = schema == js->end() || schema->is_null() ? std::string("{}") : schema->dump();
      try {
        take("response_format", json_answer(text, o));
      } catch (const GrammarError& e) {
        bad("response_format", e.what());
      }
    } else if (t != "text") {
      bad("response_format", "'response_format' type must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  if (gbnf.empty()) return;
  if (!m.grammars) bad(param, "this server cannot constrain answers (the model has no tokenizer)", "unsupported_parameter");
  try {
    r.gen.grammar = m.grammars->get(gbnf);
  } catch (const GrammarError& e) {
    bad(param, e.what());
  }
}

void parse_sampling(const RequestJson& body, const ModelContext& m, ParsedRequest& r, bool chat) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  SamplerParams& sp = r.gen.sampling;
  // OpenAI's defaults: temperature 1 and top_p 1, nothing else truncating.
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.0f;
  get(body, "temperature", sp.temperature);
  if (sp.temperature < 0.0f || sp.temperature > 2.0f) bad("temperature", "'temperature' must be in [0, 2]");
  get(body, "top_p", sp.top_p);
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) bad("top_p", "'top_p' must be in (0, 1]");
  get(body, "top_k", sp.top_k);
  if (sp.top_k < 0) bad("top_k", "'top_k' must be >= 0 (0 = off)");
  get(body, "min_p", sp.min_p);
  if (!(sp.min_p >= 0.0f && sp.min_p <= 1.0f)) bad("min_p", "'min_p' must be in [0, 1]");
  get(body, "repeat_penalty", sp.repeat_penalty);
  if (!(sp.repeat_penalty > 0.0f)) bad("repeat_penalty", "'repeat_penalty' must be > 0");
  get(body, "presence_penalty", sp.presence_penalty);
  if (sp.presence_penalty < -2.0f || sp.presence_penalty > 2.0f)
    bad("presence_penalty", "'presence_penalty' must be in [-2, 2]");
  get(body, "frequency_penalty", sp.frequency_penalty);
  if (sp.frequency_penalty < -2.0f || sp.frequency_penalty > 2.0f)
    bad("frequency_penalty", "'frequency_penalty' must be in [-2, 2]");
  int64_t seed = -1;
  if (get(body, "seed", seed)) sp.seed = uint64_t(seed);
  else sp.seed = std::random_device{}();
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias", "invalid_type");
    for (const auto& [k, v] : it->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != k.size() || id < 0 || id >= m.n_vocab)
        bad("logit_bias", "'logit_bias' key '" + k + "' is not a token id of this model (0.." +
                              std::to_string(m.n_vocab - 1) + ")");
      if (!v.is_number() || v.get<double>() < -100 || v.get<double>() > 100)
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      sp.logit_bias.emplace_back(int32_t(id), v.get<float>());
    }
  }
  if (get(body, "n", r.n) && (r.n < 1 || r.n > kMaxChoices))
    bad("n", "'n' must be between 1 and " + std::to_string(kMaxChoices));
  const std::string max_top = std::to_string(kMaxTopLogprobs);
  if (chat) {
    // OpenAI's chat form: logprobs true/false, top_logprobs 0..20 (needs logprobs).
    get(body, "logprobs", r.logprobs);
    if (get(body, "top_logprobs", r.top_logprobs)) {
      if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs)
        bad("top_logprobs", "'top_logprobs' must be in [0, " + max_top + "]");
      if (!r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    }
  } else {
    // The completions form: an integer, the alternatives per token (null: off).
    if (get(body, "logprobs", r.top_logprobs)) {
      if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs)
        bad("logprobs", "'logprobs' must be in [0, " + max_top + "]");
      r.logprobs = true;
    }
    bool echo = false;
    if (get(body, "echo", echo) && echo)
      bad("echo", "'echo' is not supported by this server", "unsupported_parameter");
    int best_of = 1;
    if (get(body, "best_of", best_of) && best_of != 1) bad("best_of", "only best_of = 1 is supported");
    if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
      if (!it->is_string()) bad("suffix", "'suffix' must be a string", "invalid_type");
      if (!it->get<std::string>().empty())
        bad("suffix", "'suffix' (insertion) is not supported by this server", "unsupported_parameter");
    }
  }
  r.gen.logprobs = r.logprobs ? r.top_logprobs : -1;
  parse_structured_output(body, m, r);
  get(body, "ignore_eos", r.gen.ignore_eos);
  // Speculative decoding per request, under llama.cpp's server's name for it.
  r.gen.spec_max = m.spec_max;
  if (int n = 0; get(body, "speculative.n_max", n)) {
    if (n < 0 || n > 64) bad("speculative.n_max", "'speculative.n_max' must be in [0, 64]");
    if (n > 0 && m.spec_max == 0)
      bad("speculative.n_max", "this server decodes without a drafter (start it with --spec to speculate)",
          "unsupported_parameter");
    r.gen.spec_max = n;
  }
  get(body, "stream", r.stream);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("stream_options", "'stream_options' must be an object", "invalid_type");
    get(*it, "include_usage", r.include_usage);
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) bad("stop", "'stop' holds at most 4 strings");
      for (const auto& s : *it) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    }
  }
  // max_tokens: completions default to 16 (OpenAI); chat to the rest of the context.
  int64_t max_tokens = chat ? -1 : 16;
  const char* which = "max_tokens";
  if (chat && get(body, "max_completion_tokens", max_tokens)) which = "max_completion_tokens";
  else get(body, "max_tokens", max_tokens);
  if (max_tokens != -1 && max_tokens < 1) bad(which, std::string("'") + which + "' must be at least 1");
  const int64_t prompt = int64_t(r.gen.prompt.size());
  if (max_tokens == -1) max_tokens = std::max<int64_t>(1, m.n_ctx - prompt);
  if (m.max_tokens_limit > 0) max_tokens = std::min(max_tokens, m.max_tokens_limit);
  if (prompt + max_tokens > m.n_ctx)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(m.n_ctx) + " tokens. However, you "
                   "requested " + std::to_string(prompt + max_tokens) + " tokens (" + std::to_string(prompt) +
                   " in the prompt, " + std::to_string(max_tokens) + " for the completion). Please reduce the prompt "
                   "or the completion length.",
                   which, "context_length_exceeded");
  r.gen.max_tokens = int(max_tokens);
}

std::vector<int32_t> tokenize(const ModelContext& m, const std::string& text, bool special) {
  const Tokenizer& t = *m.tokenizer;
  bool bos = t.add_bos_default() && t.bos() >= 0;
  if (bos && special && text.rfind(t.token_to_piece(t.bos(), true), 0) == 0) bos = false;  // the template wrote it
  return special ? t.encode_with_special(text, bos) : t.encode(text, bos);
}

}  // namespace

ParsedRequest parse_completion_request(const RequestJson& body, const ModelContext& m) {
  ParsedRequest r;
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("prompt", "'prompt' is required", "missing_required_parameter");
  if (it->is_string()) {
    r.gen.prompt = tokenize(m, it->get<std::string>(), false);
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    for (const auto& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.n_vocab)
        bad("prompt", "'prompt' token ids must be integers in [0, " + std::to_string(m.n_vocab) + ")");
      r.gen.prompt.push_back(t.get<int32_t>());
    }
  } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    r.gen.prompt = tokenize(m, (*it)[0].get<std::string>(), false);
  } else {
    bad("prompt", "'prompt' must be a string or an array of token ids (one prompt per request)", "invalid_type");
  }
  if (r.gen.prompt.empty()) bad("prompt", "'prompt' is empty");
  parse_sampling(body, m, r, false);
  return r;
}

ParsedRequest parse_chat_request(const RequestJson& body, const ModelContext& m) {
  using ojson = nlohmann::ordered_json;
  ParsedRequest r;
  r.chat = true;
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) bad("messages", "'messages' is required", "missing_required_parameter");
  if (!it->is_array() || it->empty()) bad("messages", "'messages' must be a non-empty array", "invalid_type");
  ojson messages = ojson::array();
  for (const auto& msg : *it) {
    if (!msg.is_object()) bad("messages", "each message must be an object", "invalid_type");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) bad("messages", "each message needs a string 'role'", "invalid_type");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
      bad("messages", "unknown message role '" + rs + "'");
    ojson out = msg;
    // Content as a list of text parts becomes one string (what templates expect).
    if (auto c = msg.find("content"); c != msg.end() && c->is_array()) {
      std::string text;
      for (const auto& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad("messages", "only text content parts are supported", "invalid_type");
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else if (c != msg.end() && !c->is_string() && !c->is_null()) {
      bad("messages", "'content' must be a string or a list of text parts", "invalid_type");
    }
    // Earlier tool calls: OpenAI's clients send each call's arguments as JSON text,
    // the templates expect the object (Hugging Face's convention; they apply tojson).
    if (auto calls = out.find("tool_calls"); calls != out.end() && !calls->is_null()) {
      if (!calls->is_array()) bad("messages", "'tool_calls' must be an array", "invalid_type");
      for (auto& call : *calls) {
        if (!call.is_object()) bad("messages", "each tool call must be an object", "invalid_type");
        auto f = call.find("function");
        if (f == call.end() || !f->is_object()) continue;
        if (auto a = f->find("arguments"); a != f->end() && a->is_string()) {
          ojson parsed = ojson::parse(a->get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) *a = std::move(parsed);
        }
      }
    }
    if (m.tool_format == ToolCallFormat::Harmony && rs == "assistant") {
      // An earlier answer's reasoning, sent back as we return it: the gpt-oss template
      // reads it from `thinking` (and renders it only before a tool call, as harmony asks).
      if (!out.contains("thinking"))
        if (auto rc = out.find("reasoning_content"); rc != out.end() && rc->is_string() && !rc->get<std::string>().empty())
          out["thinking"] = *rc;
      // A call's message comes back from OpenAI's clients with content null, which the
      // gpt-oss template cannot search for markers: no content is "".
      if (auto c = out.find("content"); c != out.end() && c->is_null()) *c = "";
    }
    messages.push_back(std::move(out));
  }
  ojson tools = nullptr;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be an array", "invalid_type");
    for (const auto& tool : *t) {
      if (!tool.is_object() || !tool.contains("type") || tool["type"] != "function")
        bad("tools", "each tool must be an object with \"type\": \"function\"");
      auto f = tool.find("function");
      if (f == tool.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
          (*f)["name"].get<std::string>().empty())
        bad("tools", "each tool needs a 'function' object with a non-empty string 'name'");
      if (auto p = f->find("parameters"); p != f->end() && !p->is_null() && !p->is_object())
        bad("tools", "a function's 'parameters' must be a JSON Schema object", "invalid_type");
    }
    tools = *t;
    // The gpt-oss template writes every tool's description into the prompt and fails
    // on one without; OpenAI makes it optional.
    if (m.tool_format == ToolCallFormat::Harmony)
      for (auto& tool : tools)
        if (auto& f = tool["function"]; !f.contains("description") || !f["description"].is_string()) f["description"] = "";
  }
  // tool_choice: "auto" (the default), "none", or a forced call: "required" (any of
  // the tools) or {"type": "function", "function": {"name": ...}}, which constrain the
  // answer to calls in the template's syntax.
  bool parse_calls = !tools.is_null() && !tools.empty();
  bool forced = false;
  std::string forced_name;
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string v = c->get<std::string>();
      if (v == "none") parse_calls = false;
      else if (v == "required") forced = true;
      else if (v != "auto") bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object");
    } else if (c->is_object()) {
      const auto f = c->find("function");
      if (c->value("type", json("")) != json("function") || f == c->end() || !f->is_object() ||
          !f->contains("name") || !(*f)["name"].is_string())
        bad("tool_choice", "a 'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      forced = true;
      forced_name = (*f)["name"].get<std::string>();
    } else {
      bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object", "invalid_type");
    }
  }
  get(body, "parallel_tool_calls", r.parallel_tool_calls);
  if (forced && m.render_chat) {  // without a template the request is refused below
    if (!parse_calls) bad("tool_choice", "'tool_choice' forces a tool call, but the request has no 'tools'");
    try {
      r.tool_grammar = tool_call_gbnf(m.tool_format, json(tools), forced_name, r.parallel_tool_calls);
    } catch (const GrammarError& e) {
      bad("tool_choice", e.what());
    }
  }
  if (parse_calls) {
    r.tool_format = m.tool_format;
    r.tools = json(tools);
  }
  if (m.tool_format == ToolCallFormat::Harmony) r.tool_format = ToolCallFormat::Harmony;
  if (!m.render_chat)
    bad("messages", "this model has no chat template; start the server with --chat-template FILE",
        "chat_template_missing");
  r.gen.prompt = tokenize(m, m.render_chat(messages, tools), true);
  if (r.gen.prompt.empty()) bad("messages", "the rendered prompt is empty");
  parse_sampling(body, m, r, true);
  return r;
}

const char* openai_finish_reason(FinishReason r, bool stop_string) {
  if (stop_string) return "stop";
  switch (r) {
    case FinishReason::Length:
    case FinishReason::ContextFull: return "length";
    default: return "stop";
  }
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens) {
  json u = {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  if (reasoning_tokens > 0) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  return u;
}

std::string token_display(const std::string& s, bool& escaped) {
  escaped = false;
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t len = utf8_char_len(s, i); len > 0) {
      out.append(s, i, len);
      i += len;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      const uint8_t b = uint8_t(s[i++]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      escaped = true;
    }
  }
  return out;
}

namespace {

json logprob_value(float lp) { return std::isfinite(lp) ? json(lp) : json(-9999.0); }

json byte_list(const std::string& bytes) {
  json a = json::array();
  for (char c : bytes) a.push_back(int(uint8_t(c)));
  return a;
}

}  // namespace

json logprobs_json(const std::vector<AnswerToken>& tokens, const Tokenizer& tok, bool chat, int top_n) {
  auto piece = [&](int32_t id) { return tok.token_to_piece(id, true); };
  if (chat) {
    json content = json::array();
    for (const AnswerToken& t : tokens) {
      bool escaped = false;
      const std::string bytes = piece(t.id);
      json top = json::array();
      for (size_t i = 0; i < t.lp.top.size() && int(i) < top_n; ++i) {
        const std::string b = piece(t.lp.top[i].id);
        top.push_back({{"token", token_display(b, escaped)}, {"logprob", logprob_value(t.lp.top[i].logprob)},
                       {"bytes", byte_list(b)}});
      }
      content.push_back({{"token", token_display(bytes, escaped)},
                         {"logprob", logprob_value(t.lp.logprob)},
                         {"bytes", byte_list(bytes)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  auto text = [&](int32_t id) {
    bool escaped = false;
    std::string d = token_display(piece(id), escaped);
    return escaped ? "bytes:" + d : d;
  };
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const AnswerToken& t : tokens) {
    toks.push_back(text(t.id));
    lps.push_back(logprob_value(t.lp.logprob));
    json top = json::object();
    for (size_t i = 0; i < t.lp.top.size() && int(i) < top_n; ++i) {
      const std::string k = text(t.lp.top[i].id);
      if (!top.contains(k)) top[k] = logprob_value(t.lp.top[i].logprob);
    }
    if (const std::string k = text(t.id); !top.contains(k)) top[k] = logprob_value(t.lp.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(t.char_offset);
  }
  return {{"tokens", std::move(toks)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool stream) {
  json a = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (stream) c["index"] = i;
    a.push_back(std::move(c));
  }
  return a;
}

json completion_response(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                         int64_t prompt_tokens, int64_t completion_tokens, const json& logprobs,
                         const std::vector<ToolCall>& calls, const std::string& reasoning) {
  json choice = {{"index", 0}, {"finish_reason", finish}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) choice["message"]["reasoning_content"] = reasoning;
    if (!calls.empty()) {
      if (text.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_json(calls, false);
    }
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  return {{"id", ids.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

json stream_chunk(const ResponseIds& ids, bool chat, const std::string& text, const char* finish, bool role_only,
                  const json& logprobs, const std::vector<ToolCall>& calls, const std::string& reasoning) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}, {"logprobs", logprobs}};
  if (chat) {
    json delta = json::object();
    if (role_only) delta["role"] = "assistant";
    if (!text.empty()) delta["content"] = text;
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!calls.empty()) delta["tool_calls"] = tool_calls_json(calls, true);
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", ids.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const ResponseIds& ids, bool chat, int64_t prompt_tokens, int64_t completion_tokens,
                 int64_t reasoning_tokens) {
  return {{"id", ids.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens, reasoning_tokens)}};
}

}  // namespace tessera::server
