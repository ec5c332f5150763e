// POST /tokenize and /detokenize (see tokenize_api.h).
#include "server/tokenize_api.h"

#include "server/request_fields.h"
#include "tessera/tokenizer.h"

namespace tessera::server {
namespace {

using json = nlohmann::json;

bool flag(const RequestJson& body, const char* key, bool fallback) {
  get(body, key, fallback);
  return fallback;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

const Tokenizer& tokenizer_of(const ModelContext& m) {
  if (!m.tokenizer) throw ApiError(400, "this model has no tokenizer", "", "no_tokenizer");
  return *m.tokenizer;
}

}  // namespace

json tokenize_response(const RequestJson& body, const ModelContext& m) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  auto it = body.find("content");
  if (it == body.end() || it->is_null()) bad("content", "'content' is required", "missing_required_parameter");
  if (!it->is_string()) bad("content", "'content' must be a string", "invalid_type");
  const std::string text = it->get<std::string>();
  const Tokenizer& t = tokenizer_of(m);
  const bool bos = flag(body, "add_special", false) && t.add_bos_default() && t.bos() >= 0;
  const std::vector<int32_t> ids = flag(body, "parse_special", true) ? t.encode_with_special(text, bos)
                                                                     : t.encode(text, bos);
  json tokens = json::array();
  if (!flag(body, "with_pieces", false)) {
    for (int32_t id : ids) tokens.push_back(id);
  } else {
    for (int32_t id : ids) {
      const std::string piece = t.token_to_piece(id, true);
      json p = valid_utf8(piece) ? json(piece) : json(std::vector<uint8_t>(piece.begin(), piece.end()));
      tokens.push_back({{"id", id}, {"piece", std::move(p)}});
    }
  }
  return {{"tokens", std::move(tokens)}};
}

json detokenize_response(const RequestJson& body, const ModelContext& m) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  auto it = body.find("tokens");
  if (it == body.end() || it->is_null()) bad("tokens", "'tokens' is required", "missing_required_parameter");
  if (!it->is_array()) bad("tokens", "'tokens' must be an array of token ids", "invalid_type");
  const Tokenizer& t = tokenizer_of(m);
  std::vector<int32_t> ids;
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m.n_vocab)
      bad("tokens", "'tokens' must hold integers in [0, " + std::to_string(m.n_vocab) + ")");
    ids.push_back(v.get<int32_t>());
  }
  return {{"content", sanitize_utf8(t.decode(ids))}};
}

}  // namespace tessera::server
