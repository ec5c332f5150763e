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
// The text is compact JSON with optional whitespace between tokens (at most a few
// characters at a time); numbers have at most 16 integer and 16 fraction digits. An
// object without additionalProperties takes only its listed properties.
#pragma once
#include <string>
#include <string_view>

namespace tessera {

// The GBNF of JSON text matching `schema_json` (a JSON Schema document). Throws
// GrammarError for an unsupported keyword or a malformed schema.
std::string json_schema_to_gbnf(std::string_view schema_json);

// The GBNF of any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace tessera
