#include "cli_grammar.h"

#include <fstream>
#include <sstream>

#include "tessera/error.h"
#include "tessera/grammar.h"
#include "tessera/json_schema_grammar.h"

namespace po = boost::program_options;

namespace tessera {

namespace {
std::string read_file(const std::string& path, const char* option) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(std::string(option) + ": cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

void add_grammar_options(po::options_description& desc, GrammarOptions& g) {
  desc.add_options()
    ("grammar-file", po::value(&g.grammar_file)->value_name("FILE"),
     "constrain the output to a GBNF grammar (llama.cpp's format; start rule `root`)")
    ("grammar", po::value(&g.grammar)->value_name("GBNF"), "the same, with the grammar given as text")
    ("json-schema", po::value(&g.json_schema)->value_name("SCHEMA"),
     "constrain the output to JSON matching a JSON Schema (the schema's text, or @FILE); keywords that cannot be "
     "enforced are refused by name");
}

std::shared_ptr<GrammarConstraint> make_grammar(const GrammarOptions& g, const Tokenizer& tokenizer) {
  const int given = int(!g.grammar_file.empty()) + int(!g.grammar.empty()) + int(!g.json_schema.empty());
  if (given == 0) return nullptr;
  if (given > 1) throw Error("give one of --grammar-file, --grammar and --json-schema");
  std::string gbnf;
  const char* option = "--grammar";
  try {
    if (!g.grammar_file.empty()) {
      option = "--grammar-file";
      gbnf = read_file(g.grammar_file, option);
    } else if (!g.grammar.empty()) {
      gbnf = g.grammar;
    } else {
      option = "--json-schema";
      const std::string schema =
          g.json_schema[0] == '@' ? read_file(g.json_schema.substr(1), option) : g.json_schema;
      gbnf = json_schema_to_gbnf(schema);
    }
    return std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), std::make_shared<const TokenVocabulary>(tokenizer));
  } catch (const GrammarError& e) {
    throw Error(std::string(option) + ": " + e.what());
  }
}

}  // namespace tessera
