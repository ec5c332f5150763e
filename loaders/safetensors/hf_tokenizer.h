// A Hugging Face tokenizer (tokenizer.json, with tokenizer_config.json beside it)
// translated into the tokenizer description tessera's Tokenizer is built from: the
// tokenizer.* keys of Tokenizer::from_metadata (tokenizer.h). What the reader does not
// support is refused naming what is missing, never tokenized differently in silence.
#pragma once
#include <string>

namespace tessera {
class Metadata;
}

namespace tessera::hf {

// Adds the tokenizer.* keys for the tokenizer in `folder` to `md`. Returns false (md
// untouched) when the folder has no tokenizer.json; throws tessera::Error with one
// line naming the file and the problem when it has one tessera cannot use.
bool read_tokenizer(const std::string& folder, Metadata& md);

}  // namespace tessera::hf
