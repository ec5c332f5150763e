// libFuzzer target: any text as a chat template (tokenizer.chat_template comes from
// the model file), parsed and rendered with a typical conversation. Errors must be a
// ChatTemplateError (syntax, runtime or a limit); limits are set low so a hostile
// loop ends in milliseconds.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessera/chat_template.h"
#include "tessera/error.h"

namespace {
const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <|im_start|> there"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"t\": 21}"},
      {"role": "assistant", "content": "It is 21.", "reasoning_content": "think"},
      {"role": "user", "content": [{"type": "text", "text": "and now?"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false
  })");
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  tessera::RenderOptions opt;
  opt.max_output_bytes = size_t{1} << 20;
  opt.max_steps = 200000;
  opt.max_call_depth = 64;
  std::tm fixed{};
  fixed.tm_year = 126;
  fixed.tm_mday = 1;
  opt.now = fixed;
  try {
    tessera::ChatTemplate t(source);
    (void)t.render(variables(), opt);
  } catch (const tessera::Error&) {  // ChatTemplateError is one
  }
  return 0;
}
