// --grammar-file, --grammar and --json-schema: structured output for the CLI's
// generating commands (docs/structured_output.md).
#pragma once
#include <boost/program_options.hpp>
#include <memory>
#include <string>

namespace tessera {

class GrammarConstraint;
class Tokenizer;

struct GrammarOptions {
  std::string grammar_file;  // GBNF in a file
  std::string grammar;       // GBNF text
  std::string json_schema;   // a JSON Schema, or @FILE holding one
};
void add_grammar_options(boost::program_options::options_description& desc, GrammarOptions& g);
// The constraint the options ask for, or null. Throws tessera::Error naming the option
// for an unreadable file, two constraints at once, or a grammar or schema that cannot
// be used.
std::shared_ptr<GrammarConstraint> make_grammar(const GrammarOptions& g, const Tokenizer& tokenizer);

}  // namespace tessera
