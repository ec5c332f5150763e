// The grammar of a forced tool call (tool_choice "required" or a named function): the
// answer is one call, or several with parallel_tool_calls, in the template's format
// (tool_calls.h), to one of the allowed tools, with arguments that match that tool's
// `parameters` schema. Harmony (gpt-oss): one commentary-channel message to
// functions.NAME, perhaps after an analysis message; its markers are matched as text,
// which the server's vocabulary gives the marker tokens (TokenVocabulary's
// shown_control).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/tool_calls.h"

namespace tessera::server {

// GBNF for calls to the tools of `tools` (OpenAI's array) named `only` (empty: any of
// them). Throws GrammarError for a schema that cannot be enforced or a format without
// a known call syntax.
std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::json& tools, const std::string& only, bool parallel);

// Harmony's optional analysis message before the answer (rule `analysis`): any text
// without a marker ("<|"), then <|end|><|start|>assistant.
std::string harmony_analysis_gbnf();
// A structured answer (response_format) in harmony: perhaps an analysis message, then
// a final message whose text is the JSON of `rules` (json_schema_rules, start rule
// `start`), so that gpt-oss reasons as it always does and the content is the JSON.
std::string harmony_final_gbnf(const std::string& rules, const std::string& start);

}  // namespace tessera::server
