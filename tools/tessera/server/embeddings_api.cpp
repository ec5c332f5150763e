// POST /v1/embeddings (see embeddings_api.h).
#include "server/embeddings_api.h"

#include <cstring>

#include "server/request_fields.h"

namespace tessera::server {
namespace {

using json = nlohmann::json;

const char* kInputTypes = "'input' must be a string, an array of strings, an array of token ids, or an array of "
                          "arrays of token ids";

std::vector<int32_t> token_list(const RequestJson& ids, const ModelContext& m) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const auto& v : ids) {
    if (!v.is_number_integer()) bad("input", kInputTypes, "invalid_type");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= m.n_vocab)
      bad("input", "'input' holds token id " + std::to_string(id) + ", not in [0, " + std::to_string(m.n_vocab) + ")");
    out.push_back(int32_t(id));
  }
  return out;
}

}  // namespace

EmbeddingRequest parse_embedding_request(const RequestJson& body, const ModelContext& m, const EmbeddingContext& e) {
  if (!body.is_object()) bad("", "the request body must be a JSON object", "invalid_type");
  if (!e.pooling) throw ApiError(400, "this model serves no embeddings: " + e.unavailable, "", "unsupported_model");
  if (auto it = body.find("model"); it != body.end() && !it->is_null() && !it->is_string())
    bad("model", "'model' must be a string", "invalid_type");
  EmbeddingRequest r;
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) bad("input", "'input' is required", "missing_required_parameter");
  auto text = [&](const RequestJson& s) {
    if (!s.is_string()) bad("input", kInputTypes, "invalid_type");
    const std::string str = s.get<std::string>();
    if (str.empty()) bad("input", "'input' must not hold an empty string");
    if (!m.tokenizer) bad("input", "this model has no tokenizer: send token ids", "no_tokenizer");
    r.inputs.push_back(embedding_tokens(*m.tokenizer, str, e.add_eos));
  };
  if (it->is_string()) {
    text(*it);
  } else if (it->is_array()) {
    if (it->empty()) bad("input", "'input' must not be empty");
    if (it->size() > kMaxEmbeddingInputs)
      bad("input", "'input' holds at most " + std::to_string(kMaxEmbeddingInputs) + " inputs");
    const RequestJson& first = it->front();
    if (first.is_number_integer()) {
      r.inputs.push_back(token_list(*it, m));
    } else if (first.is_string()) {
      for (const auto& s : *it) text(s);
    } else if (first.is_array()) {
      for (const auto& ids : *it) {
        if (!ids.is_array()) bad("input", kInputTypes, "invalid_type");
        if (ids.empty()) bad("input", "'input' must not hold an empty list of token ids");
        r.inputs.push_back(token_list(ids, m));
      }
    } else {
      bad("input", kInputTypes, "invalid_type");
    }
  } else {
    bad("input", kInputTypes, "invalid_type");
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const int64_t n = int64_t(r.inputs[i].size());
    if (n > m.n_ctx)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(m.n_ctx) + " tokens, however input " +
                         std::to_string(i) + " has " + std::to_string(n) + " tokens. Please reduce the input.",
                     "input", "context_length_exceeded");
    r.tokens += n;
  }
  if (get(body, "dimensions", r.dimensions) && (r.dimensions < 1 || r.dimensions > e.n_embd))
    bad("dimensions", "'dimensions' must be in [1, " + std::to_string(e.n_embd) + "] for this model");
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    r.base64 = *f == "base64";
  }
  get(body, "normalize", r.normalize);
  // `user` (an end-user id for abuse monitoring) is accepted and ignored.
  return r;
}

std::string base64_f32(std::span<const float> v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &v[i], 4);
    for (int k = 0; k < 4; ++k) bytes[i * 4 + size_t(k)] = static_cast<unsigned char>(b >> (8 * k));  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    const uint32_t w =
        uint32_t(bytes[i]) << 16 | (n > 1 ? uint32_t(bytes[i + 1]) << 8 : 0) | (n > 2 ? bytes[i + 2] : 0);
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += n > 1 ? kAlphabet[(w >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[w & 63] : '=';
  }
  return out;
}

json embedding_response(const EmbeddingRequest& r, std::vector<std::vector<float>>& pooled, const std::string& model) {
  json data = json::array();
  for (size_t i = 0; i < pooled.size(); ++i) {
    shape_embedding(pooled[i], r.dimensions, r.normalize);
    json values = r.base64 ? json(base64_f32(pooled[i])) : json(pooled[i]);
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(values)}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", r.tokens}, {"total_tokens", r.tokens}}}};
}

}  // namespace tessera::server
