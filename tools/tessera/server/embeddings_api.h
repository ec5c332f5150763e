// POST /v1/embeddings, as OpenAI has it: the request's inputs (a string, strings, token
// ids, or lists of token ids) validated into token lists, and the response built from
// the pooled hidden states the engine's worker computed (EmbeddingJob), normalised,
// truncated to `dimensions`, as float arrays or base64.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "tessera/embedder.h"

namespace tessera::server {

// What the embeddings endpoint needs from the model beyond ModelContext.
struct EmbeddingContext {
  int64_t n_embd = 0;
  // How the hidden states are pooled (model_pooling or --pooling); unset: the endpoint
  // answers 400 with `unavailable`.
  std::optional<Pooling> pooling;
  std::string unavailable;
  bool add_eos = false;  // the tokenizer appends its EOS token (tokenizer.ggml.add_eos_token)
};

// OpenAI's limit on the inputs of one request.
constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, one list per input
  int64_t tokens = 0;                         // over all inputs
  int64_t dimensions = 0;                     // 0: n_embd
  bool base64 = false;                        // encoding_format "base64"
  bool normalize = true;                      // tessera's extension: false hands out the raw pooled state
};

// Throws ApiError (400) naming the field: no or empty input, a wrong type, a token id
// out of range, an input longer than the context, dimensions outside [1, n_embd], an
// unknown encoding_format; the model's pooling unavailable.
EmbeddingRequest parse_embedding_request(const RequestJson& body, const ModelContext& m, const EmbeddingContext& e);
// {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
//  "model": ..., "usage": {"prompt_tokens": N, "total_tokens": N}}; `pooled` (one per
// input) is shaped in place (shape_embedding).
nlohmann::json embedding_response(const EmbeddingRequest& r, std::vector<std::vector<float>>& pooled,
                                  const std::string& model);
// The floats' little-endian bytes in base64 (what OpenAI's clients decode).
std::string base64_f32(std::span<const float> v);

}  // namespace tessera::server
