#include "server/tool_calls.h"

#include <random>

namespace tessera::server {

using ojson = nlohmann::ordered_json;
using nlohmann::json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string rtrim(std::string s) {
  while (!s.empty() && is_ws(s.back())) s.pop_back();
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0;
  while (b < s.size() && is_ws(s[b])) ++b;
  return rtrim(s.substr(b));
}

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }

std::string random_alnum(size_t n) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(n, 'x');
  for (char& c : s) c = kChars[rng() % (sizeof kChars - 1)];
  return s;
}

}  // namespace

const json* find_tool_function(const json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const json& t : tools) {
    if (!t.is_object()) continue;
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) continue;
    auto n = f->find("name");
    if (n != f->end() && n->is_string() && n->get<std::string>() == name) return &*f;
  }
  return nullptr;
}

std::string new_tool_call_id() { return "call_" + random_alnum(24); }

namespace {

const json* find_function(const json& tools, const std::string& name) { return find_tool_function(tools, name); }

// Arguments as JSON text of an object: an object, or a string holding one.
bool arguments_text(const ojson& a, std::string& out) {
  if (a.is_object()) {
    out = a.dump();
    return true;
  }
  if (a.is_string()) {
    const ojson parsed = ojson::parse(a.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) return false;
    out = a.get<std::string>();
    return true;
  }
  return false;
}

// {"name": ..., "arguments" or "parameters": {...}} (no arguments: {}).
bool call_from_json(const ojson& obj, const json& tools, ToolCall& out) {
  if (!obj.is_object()) return false;
  auto n = obj.find("name");
  if (n == obj.end() || !n->is_string() || !find_function(tools, n->get<std::string>())) return false;
  out.name = n->get<std::string>();
  auto a = obj.find("arguments");
  if (a == obj.end()) a = obj.find("parameters");
  if (a == obj.end() || a->is_null()) {
    out.arguments = "{}";
    return true;
  }
  return arguments_text(*a, out.arguments);
}

// Qwen3.5 / Qwen3-Coder: <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>.
// A value is JSON when its parameter's schema type is not "string" and it parses as
// JSON, else the text itself.
bool call_from_xml(const std::string& body, const json& tools, ToolCall& out) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kParam = "<parameter=",
                             kParamEnd = "</parameter>";
  if (!starts_with(body, kFn)) return false;
  size_t p = kFn.size();
  size_t gt = body.find('>', p);
  if (gt == std::string::npos) return false;
  out.name = trim(body.substr(p, gt - p));
  const json* fn = find_function(tools, out.name);
  if (!fn) return false;
  const json* props = nullptr;
  if (auto params = fn->find("parameters"); params != fn->end() && params->is_object())
    if (auto pr = params->find("properties"); pr != params->end() && pr->is_object()) props = &*pr;
  ojson args = ojson::object();
  p = gt + 1;
  for (;;) {
    while (p < body.size() && is_ws(body[p])) ++p;
    if (body.compare(p, kFnEnd.size(), kFnEnd) == 0) {
      p += kFnEnd.size();
      break;
    }
    if (body.compare(p, kParam.size(), kParam) != 0) return false;
    p += kParam.size();
    gt = body.find('>', p);
    if (gt == std::string::npos) return false;
    const std::string key = trim(body.substr(p, gt - p));
    const size_t end = body.find(kParamEnd, gt + 1);
    if (key.empty() || end == std::string::npos) return false;
    std::string value = body.substr(gt + 1, end - gt - 1);
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    std::string type;
    if (props)
      if (auto pr = props->find(key); pr != props->end() && pr->is_object())
        if (auto t = pr->find("type"); t != pr->end() && t->is_string()) type = t->get<std::string>();
    ojson v = value;
    if (type != "string") {
      ojson parsed = ojson::parse(value, nullptr, false);
      if (!parsed.is_discarded()) v = std::move(parsed);
    }
    args[key] = std::move(v);
    p = end + kParamEnd.size();
  }
  while (p < body.size() && is_ws(body[p])) ++p;
  if (p != body.size()) return false;
  out.arguments = args.dump();
  return true;
}

ToolCallResult parse_hermes(const std::string& text, const json& tools) {
  ToolCallResult r;
  const size_t first = text.find(kHermesOpen);
  if (first == std::string::npos) return r;
  for (size_t pos = first; pos != std::string::npos;) {
    const size_t start = pos + kHermesOpen.size();
    const size_t end = text.find(kHermesClose, start);
    // The last block may lack its closing tag (the answer ended there).
    const std::string body = trim(end == std::string::npos ? text.substr(start) : text.substr(start, end - start));
    ToolCall call;
    if (starts_with(body, "<function=")) {
      if (!call_from_xml(body, tools, call)) return {};
    } else {
      const ojson obj = ojson::parse(body, nullptr, false);
      if (obj.is_discarded() || !call_from_json(obj, tools, call)) return {};
    }
    r.calls.push_back(std::move(call));
    if (end == std::string::npos) break;
    pos = text.find(kHermesOpen, end + kHermesClose.size());
  }
  r.found = true;
  r.content = rtrim(text.substr(0, first));
  return r;
}

ToolCallResult parse_llama3(const std::string& text, const json& tools) {
  std::string t = trim(text);
  if (starts_with(t, "<|python_tag|>")) t = trim(t.substr(14));
  const ojson obj = ojson::parse(t, nullptr, false);
  ToolCall call;
  if (obj.is_discarded() || !call_from_json(obj, tools, call)) return {};
  ToolCallResult r;
  r.found = true;
  r.calls.push_back(std::move(call));
  return r;
}

ToolCallResult parse_mistral(const std::string& text, const json& tools) {
  std::string t = trim(text);
  if (starts_with(t, "[TOOL_CALLS]")) t = trim(t.substr(12));
  const ojson arr = ojson::parse(t, nullptr, false);
  if (arr.is_discarded() || !arr.is_array() || arr.empty()) return {};
  ToolCallResult r;
  for (const ojson& obj : arr) {
    ToolCall call;
    if (!call_from_json(obj, tools, call)) return {};
    // Mistral's template insists on 9-character ids: keep the model's if it gave one.
    if (auto id = obj.find("id"); id != obj.end() && id->is_string() && id->get<std::string>().size() == 9)
      call.id = id->get<std::string>();
    else
      call.id = random_alnum(9);
    r.calls.push_back(std::move(call));
  }
  r.found = true;
  return r;
}

}  // namespace

ToolCallFormat detect_tool_call_format(const std::string& t) {
  if (t.find("<|channel|>") != std::string::npos) return ToolCallFormat::Harmony;
  if (t.find(kHermesOpen) != std::string::npos) return ToolCallFormat::Hermes;
  if (t.find("[TOOL_CALLS]") != std::string::npos) return ToolCallFormat::Mistral;
  if (t.find("<|python_tag|>") != std::string::npos || t.find("\"parameters\"") != std::string::npos)
    return ToolCallFormat::Llama3Json;
  return ToolCallFormat::None;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3-json";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::Harmony: return "harmony";
  }
  return "none";
}

ToolCallResult parse_tool_calls(ToolCallFormat f, const std::string& text, const json& tools) {
  ToolCallResult r;
  switch (f) {
    case ToolCallFormat::None:
    case ToolCallFormat::Harmony: return r;
    case ToolCallFormat::Hermes: r = parse_hermes(text, tools); break;
    case ToolCallFormat::Llama3Json: r = parse_llama3(text, tools); break;
    case ToolCallFormat::Mistral: r = parse_mistral(text, tools); break;
  }
  if (!r.found || r.calls.empty()) return {};
  for (ToolCall& c : r.calls)
    if (c.id.empty()) c.id = new_tool_call_id();
  return r;
}

std::string ToolCallFilter::push(const std::string& text) {
  if (format_ == ToolCallFormat::None || state_ == State::Passing) {
    released_ += text;
    return text;
  }
  held_ += text;
  if (state_ == State::Capturing) return {};
  std::string out;
  if (format_ == ToolCallFormat::Hermes) {
    if (const size_t p = held_.find(kHermesOpen); p != std::string::npos) {
      out = rtrim(held_.substr(0, p));
      held_.erase(0, out.size());
      state_ = State::Capturing;
    } else {
      // Hold the longest tail that the marker starts with, and the whitespace before it.
      size_t hold = 0;
      for (size_t n = std::min(kHermesOpen.size() - 1, held_.size()); n > 0; --n)
        if (held_.compare(held_.size() - n, n, kHermesOpen, 0, n) == 0) {
          hold = n;
          break;
        }
      while (hold < held_.size() && is_ws(held_[held_.size() - hold - 1])) ++hold;
      out = held_.substr(0, held_.size() - hold);
      held_.erase(0, out.size());
    }
  } else {
    // The whole answer is the call: decided by its first non-whitespace character.
    size_t i = 0;
    while (i < held_.size() && is_ws(held_[i])) ++i;
    if (i == held_.size()) return {};
    const char opener = format_ == ToolCallFormat::Llama3Json ? '{' : '[';
    if (held_[i] == opener || (format_ == ToolCallFormat::Llama3Json && held_[i] == '<')) {
      state_ = State::Capturing;  // ('<': perhaps a visible <|python_tag|>)
      return {};
    }
    state_ = State::Passing;
    out.swap(held_);
  }
  released_ += out;
  return out;
}

}  // namespace tessera::server
