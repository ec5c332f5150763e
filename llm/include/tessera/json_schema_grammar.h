// JSON Schema as a grammar (GBNF text for Grammar::parse), for structured output.
//
// Covered: type (one or a list), object (properties in the schema's order, required
// and optional ones, additionalProperties false / true / a schema), array (items,
// prefixItems, minItems, maxItems), string (minLength, maxLength, a regular pattern,
// format date / time / date-time / uuid), integer (minimum, maximum, exclusive
// bounds), number (integer-valued minimum / maximum), boolean, null, enum, const,
// anyOf, oneOf, allOf of one schema, $ref to #, #/$defs/... and #/definitions/...
// (recursion included). Annotations (title, description, default, examples, ...) are
// ignored. Anything else is refused: the GrammarError names the keyword.
//
// The text is JSON with optional whitespace between tokens (a space, or a newline and
// up to 20 spaces or tabs of indentation); numbers have at most 16 integer and 16 fraction digits. An
// object without additionalProperties takes only its listed properties.
#pragma once
#include <string>
#include <string_view>

namespace tessera {

struct JsonSchemaOptions {
  // false (OpenAI's "strict": false): keywords that cannot be enforced are ignored
  // instead of refused (the text still has the schema's shape).
  bool strict = true;
};

// The GBNF of JSON text matching `schema_json` (a JSON Schema document). Throws
// GrammarError for an unsupported keyword or a malformed schema.
std::string json_schema_to_gbnf(std::string_view schema_json, const JsonSchemaOptions& options = {});

// For grammars that embed several schemas: the rules of one schema, its start rule
// named `rule` and its other rules prefixed by it, without json_common_gbnf().
std::string json_schema_rules(std::string_view schema_json, const std::string& rule,
                              const JsonSchemaOptions& options = {});
// The generic JSON rules those refer to: ws, json-value, json-object, json-string ...
const std::string& json_common_gbnf();

// The GBNF of any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace tessera
