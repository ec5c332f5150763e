// tessera tokenize: token ids of a text, space-separated on one line.
#include <iostream>

#include "cli_common.h"
#include "tessera/open_model.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {

int cmd_tokenize(int argc, char** argv) {
  CommonOptions o;
  bool no_bos = false, special = false;
  std::string text;
  po::options_description desc("options");
  desc.add_options()
    ("model,m", po::value(&o.model), "model or vocabulary file (GGUF); default: the bundled model")
    ("text", po::value(&text)->required(), "text to tokenize (also the first positional argument)")
    ("no-bos", po::bool_switch(&no_bos), "do not add the BOS token even if the model's metadata asks for it")
    ("special", po::bool_switch(&special), "parse special/control token text (e.g. <|im_start|>) as those tokens");
  add_common_options(desc, o, false);
  po::positional_options_description pos;
  pos.add("text", 1);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera tokenize -m MODEL [--no-bos] [--special] TEXT", desc, &pos, vm)) return 0;

  auto reg = make_registry(o);
  auto file = open_model_file(*reg, o.model.empty() ? default_model_path() : o.model);
  auto tok = Tokenizer::from_metadata(file.file->metadata());
  bool bos = tok->add_bos_default() && !no_bos;
  auto ids = special ? tok->encode_with_special(text, bos) : tok->encode(text, bos);
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

}  // namespace tessera::cli
