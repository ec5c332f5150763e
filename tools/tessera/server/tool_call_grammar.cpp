#include "server/tool_call_grammar.h"

#include "tessera/grammar.h"
#include "tessera/json_schema_grammar.h"

namespace tessera::server {

std::string harmony_analysis_gbnf() {
  return "analysis ::= \"<|channel|>analysis<|message|>\" thought \"<|end|><|start|>assistant\"\n"
         "thought ::= ([^<] | \"<\" [^|])*\n";
}

std::string harmony_final_gbnf(const std::string& rules, const std::string& start) {
  return "root ::= analysis? \"<|channel|>final<|message|>\" " + start + "\n" + harmony_analysis_gbnf() + rules +
         json_common_gbnf();
}

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
    if (format == ToolCallFormat::Harmony) {
      // The recipient after the channel (as gpt-oss writes it) or in the role header
      // (as its template renders earlier calls); the arguments are the message.
      const std::string to = gbnf_literal("to=functions." + name);
      rules += rule + " ::= (\"<|channel|>commentary \" " + to + " | \" \" " + to +
               " \"<|channel|>commentary\") content-type \"<|message|>\" " + rule + "-args\n";
      choices += (choices.empty() ? "" : " | ") + rule;
      continue;
    }
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
    case ToolCallFormat::Harmony:
      // One call per answer (<|call|> ends the generation), after an optional analysis
      // message: gpt-oss reasons before it calls. The reasoning may hold any text but
      // a marker ("<|").
      g += "root ::= analysis? call\n" + harmony_analysis_gbnf();
      g += "content-type ::= (\" <|constrain|>json\" | \"<|constrain|>json\" | \" json\")?\n";
      break;
    case ToolCallFormat::None: break;
  }
  return g + rules + json_common_gbnf();
}

}  // namespace tessera::server
