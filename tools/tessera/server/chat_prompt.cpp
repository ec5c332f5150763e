#include "server/chat_prompt.h"

#include <memory>

#include "server/openai_api.h"
#include "tessera/chat_template.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace tessera::server {

std::function<std::string(const nlohmann::ordered_json&, const nlohmann::ordered_json&)> make_chat_renderer(
    const std::string& template_text, const Tokenizer& tokenizer) {
  auto tmpl = std::make_shared<const ChatTemplate>(template_text);
  const std::string bos = tokenizer.bos() >= 0 ? tokenizer.token_to_piece(tokenizer.bos(), true) : "";
  const std::string eos = tokenizer.eos() >= 0 ? tokenizer.token_to_piece(tokenizer.eos(), true) : "";
  return [tmpl, bos, eos](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools) {
    nlohmann::ordered_json vars = {{"messages", messages}, {"add_generation_prompt", true}, {"bos_token", bos},
                                   {"eos_token", eos}};
    if (!tools.is_null()) vars["tools"] = tools;
    try {
      return tmpl->render(vars);
    } catch (const Error& e) {
      throw ApiError(400, std::string("the chat template refused the conversation: ") + e.what(), "messages",
                     "chat_template_error");
    }
  };
}

}  // namespace tessera::server
