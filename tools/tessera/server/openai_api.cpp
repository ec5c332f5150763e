#include "server/openai_api.h"

#include <cmath>
#include <limits>

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

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "invalid_value") {
  throw ApiError(400, message, param, code);
}

// A field that may be absent or null; if present it must have the right type.
template <typename T>
bool get(const json& body, const char* key, T& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean", "invalid_type");
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
    const int64_t v = it->get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      bad(key, std::string("'") + key + "' is out of range");
    out = T(v);
  } else {
    if (!it->is_number()) bad(key, std::string("'") + key + "' must be a number", "invalid_type");
    out = it->get<T>();
    if (!std::isfinite(double(out))) bad(key, std::string("'") + key + "' must be finite");
  }
  return true;
}

void parse_sampling(const json& body, const ModelContext& m, ParsedRequest& r, bool chat) {
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
  int n = 1;
  if (get(body, "n", n) && n != 1) bad("n", "only n = 1 is supported");
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()))
    bad("logprobs", "'logprobs' is not supported by this server", "unsupported_parameter");
  get(body, "ignore_eos", r.gen.ignore_eos);
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

ParsedRequest parse_completion_request(const json& body, const ModelContext& m) {
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

ParsedRequest parse_chat_request(const json& body, const nlohmann::ordered_json& ordered, const ModelContext& m) {
  using ojson = nlohmann::ordered_json;
  ParsedRequest r;
  r.chat = true;
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  auto it = ordered.find("messages");
  if (it == ordered.end() || it->is_null()) bad("messages", "'messages' is required", "missing_required_parameter");
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
    messages.push_back(std::move(out));
  }
  ojson tools = nullptr;
  if (auto t = ordered.find("tools"); t != ordered.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be an array", "invalid_type");
    tools = *t;
  }
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

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_response(const ResponseIds& ids, bool chat, const std::string& text, const char* finish,
                         int64_t prompt_tokens, int64_t completion_tokens) {
  json choice = {{"index", 0}, {"finish_reason", finish}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", ids.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

json stream_chunk(const ResponseIds& ids, bool chat, const std::string& text, const char* finish, bool role_only) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
  if (chat) {
    json delta = json::object();
    if (role_only) delta["role"] = "assistant";
    if (!text.empty()) delta["content"] = text;
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

json usage_chunk(const ResponseIds& ids, bool chat, int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"id", ids.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace tessera::server
