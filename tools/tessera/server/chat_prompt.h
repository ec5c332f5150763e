// The chat endpoint's prompt: the model's chat template (tokenizer.chat_template or
// --chat-template) rendered over the request's messages and tools, with the
// vocabulary's BOS/EOS text and the generation prompt.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

// Parses the template now (throws tessera::Error on a syntax error); the function
// renders messages and tools (null: none) and throws ApiError (400) when the template
// raises, e.g. "System role not supported".
std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools)>
make_chat_renderer(
    const std::string& template_text, const Tokenizer& tokenizer);

}  // namespace tessera::server
