// Chat templates: the Jinja2 programs that GGUF files carry in `tokenizer.chat_template`,
// rendered the way Hugging Face's apply_chat_template renders them (a sandboxed Jinja2
// environment with trim_blocks, lstrip_blocks, loop controls, a tojson that keeps
// non-ASCII characters, raise_exception and strftime_now). The interpreter is our own:
// see docs/chat_templates.md for what is supported and the limits that keep a hostile
// template from hanging or exhausting memory.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessera/error.h"

namespace tessera {

// Every failure of a chat template: a syntax error (at parse time), the template's own
// raise_exception(msg), a run-time error (a type error, an undefined value used, ...) or
// a limit reached. what() is one line for the CLI; for Kind::Raised it is exactly the
// template's message (what Hugging Face reports as "TemplateError: <message>").
class ChatTemplateError : public Error {
 public:
  enum class Kind { Syntax, Raised, Runtime, Limit };
  ChatTemplateError(Kind kind, std::string detail, int line);
  Kind kind() const { return kind_; }
  int line() const { return line_; }                       // 1-based; 0 when unknown
  const std::string& detail() const { return detail_; }   // the message without the line prefix

 private:
  Kind kind_;
  int line_;
  std::string detail_;
};

struct RenderOptions {
  // strftime_now's clock (default: the local time now). Only the calendar fields are
  // read (year, month, day, hour, minute, second); weekday and day of year are derived.
  std::optional<std::tm> now;
  // Limits against hostile templates (each reached one is a ChatTemplateError::Kind::Limit).
  size_t max_output_bytes = size_t{64} << 20;  // any rendered text, and any string or list built
  uint64_t max_steps = 20'000'000;             // statements, loop iterations, macro calls, items filtered
  int max_call_depth = 200;                    // nested macro calls (and recursive loops)
};

namespace chat_template {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template; throws ChatTemplateError (Kind::Syntax, with the line) on a
  // syntax error.
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the given variables (a JSON object: messages, tools,
  // add_generation_prompt, bos_token, eos_token, ...). Objects keep their key order
  // (tojson prints keys in the order given, as Python does). Throws ChatTemplateError:
  // Kind::Raised with the template's message when it calls raise_exception, Kind::Runtime
  // or Kind::Limit otherwise. Thread-safe: a ChatTemplate may render on many threads.
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;
  // The same for a nlohmann::json, whose objects are sorted by key (so tojson prints
  // keys sorted): prefer ordered_json for byte-exact renderings.
  std::string render(const nlohmann::json& variables, const RenderOptions& options = {}) const;

 private:
  std::unique_ptr<chat_template::Program> program_;
};

}  // namespace tessera
