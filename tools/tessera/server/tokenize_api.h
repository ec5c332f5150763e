// The bodies of POST /tokenize and /detokenize, as llama.cpp's server has them:
// text to token ids (optionally with each token's piece) and back.
#pragma once
#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace tessera::server {

// {"content": TEXT, "add_special": false, "parse_special": true, "with_pieces": false}
// -> {"tokens": [ids]}, or with pieces {"tokens": [{"id": ID, "piece": TEXT}]} (a
// piece that is not valid UTF-8 on its own is its bytes as an array of numbers).
// add_special adds the BOS token when the model adds one; parse_special reads
// special-token text (<|im_start|>) as that token. Throws ApiError (400) naming the field.
nlohmann::json tokenize_response(const RequestJson& body, const ModelContext& m);
// {"tokens": [ids]} -> {"content": TEXT}: the tokenizer's decoding (a SentencePiece
// leading space dropped, control tokens left out, invalid UTF-8 replaced by U+FFFD),
// so text -> /tokenize -> /detokenize gives the text back. Throws ApiError (400) for a
// missing list or an id out of range.
nlohmann::json detokenize_response(const RequestJson& body, const ModelContext& m);

}  // namespace tessera::server
