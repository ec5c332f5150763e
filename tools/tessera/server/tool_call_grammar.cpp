#include "server/tool_call_grammar.h"

#include "tessera/grammar.h"
#include "tessera/json_schema_grammar.h"

namespace tessera::server {

std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::json& tools, const std::string& only, bool parallel) {
  if (format == ToolCallFormat::None)
    throw GrammarError("this model's chat template has no tool-call syntax that the server knows, so a call cannot be forced");
  // One alternative per tool: its name, then arguments that match its parameters.
  const char* args_key = format == ToolCallFormat::Llama3Json ? "parameters" : "arguments";
  std::string rules, choices;
  int n = 0;
  for (const auto& tool : tools) {
    const auto& f = tool.at("function");
    const std::string name = f.at("name").get<std::string>();
    if (!only.empty() && name != only) continue;
    const std::string rule = "tool-" + std::to_string(n++);
    JsonSchemaOptions o;
    o.strict = f.value("strict", true);
    const auto p = f.find("parameters");
    const std::string schema = p != f.end() && !p->is_null() ? p->dump() : std::string(R"({"type":"object"})");
    rules += json_schema_rules(schema, rule + "-args", o);
    rules += rule + " ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws " + gbnf_literal(nlohmann::json(name).dump()) +
             " ws \",\" ws " + gbnf_literal(nlohmann::json(args_key).dump()) + " ws \":\" ws " + rule + "-args ws \"}\"\n";
    choices += (choices.empty() ? "" : " | ") + rule;
  }
  if (choices.empty()) throw GrammarError("no tool named '" + only + "' among the request's tools");
  std::string g = "call ::= " + choices + "\n";
  switch (format) {
    case ToolCallFormat::Hermes:
      g += "block ::= \"<tool_call>\" \"\\n\"? call \"\\n\"? \"</tool_call>\"\n";
      g += parallel ? "root ::= block (\"\\n\" block)*\n" : "root ::= block\n";
      break;
    case ToolCallFormat::Llama3Json:  // one object per answer: no parallel calls in this format
      g += "root ::= call\n";
      break;
    case ToolCallFormat::Mistral:
      g += parallel ? "root ::= \"[\" ws call ws (\",\" ws call ws)* \"]\"\n" : "root ::= \"[\" ws call ws \"]\"\n";
      break;
    case ToolCallFormat::None: break;
  }
  return g + rules + json_common_gbnf();
}

}  // namespace tessera::server
