// The public face of the interpreter (tessera/chat_template.h): parse once, render many
// times; every failure leaves as a ChatTemplateError.
#include "tessera/chat_template.h"

#include "interp.h"
#include "parser.h"

namespace tessera {

namespace {
std::string describe(ChatTemplateError::Kind kind, const std::string& detail, int line) {
  if (kind == ChatTemplateError::Kind::Raised) return detail;  // the template's own message
  std::string where = line > 0 ? ", line " + std::to_string(line) : "";
  switch (kind) {
    case ChatTemplateError::Kind::Syntax: return "chat template syntax error" + where + ": " + detail;
    case ChatTemplateError::Kind::Limit: return "chat template limit reached" + where + ": " + detail;
    default: return "chat template error" + where + ": " + detail;
  }
}
}  // namespace

ChatTemplateError::ChatTemplateError(Kind kind, std::string detail, int line)
    : Error(describe(kind, detail, line)), kind_(kind), line_(line), detail_(std::move(detail)) {}

ChatTemplate::ChatTemplate(std::string_view source) : program_(chat_template::parse(source)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  chat_template::Interp interp(*program_, variables, options);
  return interp.render();
}

std::string ChatTemplate::render(const nlohmann::json& variables, const RenderOptions& options) const {
  return render(nlohmann::ordered_json(variables), options);
}

}  // namespace tessera
