// Embeddings from a model's final hidden states (after the output norm, where the LM
// head would read them; Engine::forward_hidden): each input runs in a fresh KV
// sequence, many inputs share a forward step, and each input's rows are pooled (mean
// over its tokens, or its last token) as soon as its last chunk has run; its sequence
// is freed then. The model's metadata chooses the pooling (model_pooling).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tessera/error.h"
#include "tessera/kv_cache.h"

namespace tessera {

class Engine;
class ModelFile;
class Tokenizer;

enum class Pooling : uint8_t { Mean, Last };
const char* pooling_name(Pooling p);                       // "mean", "last"
std::optional<Pooling> parse_pooling(std::string_view name);  // "mean", "last"; else nullopt

// The pooling the file's metadata asks for: GGUF's <arch>.pooling_type (llama.cpp's
// values: 1 mean, 3 last); last when absent (decision 117). Throws tessera::Error
// naming the value for a type tessera does not pool this way (0 none, 2 cls, 4 rank).
Pooling model_pooling(const ModelFile& file);

// A text's tokens for embedding: the BOS when the model adds one, the text (special-token
// text is not parsed), and the EOS when the tokenizer appends one (add_eos).
std::vector<int32_t> embedding_tokens(const Tokenizer& tokenizer, std::string_view text, bool add_eos);
// The file's tokenizer.ggml.add_eos_token (embedding models such as Qwen3-Embedding end
// every input with their EOS token); false when absent.
bool tokenizer_adds_eos(const ModelFile& file);

// Keep the first `dimensions` values (0 or >= size: all), then scale to unit L2 norm if
// `normalize` (a zero vector stays zero).
void shape_embedding(std::vector<float>& v, int64_t dimensions, bool normalize);

// EmbeddingBatch::step() found no free KV page for its next chunk: other sequences
// hold the pool (a server answers 503: retry later).
class KvPagesExhausted : public Error {
 public:
  using Error::Error;
};

// A batch of inputs (token ids, each non-empty and within the context) embedded over
// one engine, one forward step at a time, so that its owner may interleave other work
// with it (the server's worker runs generation steps between them).
class EmbeddingBatch {
 public:
  // Throws tessera::Error for an empty input, a token out of range, or an input longer
  // than the engine's context.
  EmbeddingBatch(Engine& engine, std::vector<std::vector<int32_t>> inputs, Pooling pooling);
  ~EmbeddingBatch();  // frees the sequences of inputs not finished (a cancelled batch)
  EmbeddingBatch(const EmbeddingBatch&) = delete;
  EmbeddingBatch& operator=(const EmbeddingBatch&) = delete;

  // Runs one forward step over at most the engine's batch_tokens tokens: the next
  // chunks of the inputs in order, as far as the KV pool's free pages allow. Returns
  // true when every input is pooled. Throws KvPagesExhausted when no chunk fits in
  // the free pages (the pool is held by other sequences), tessera::Error when a hidden
  // state is not finite.
  bool step();
  bool done() const { return finished_ == inputs_.size(); }
  // One pooled hidden state (n_embd floats, not normalised) per input, in order, once done().
  const std::vector<std::vector<float>>& results() const { return results_; }
  // Tokens of all inputs.
  int64_t tokens() const;

 private:
  struct Progress {
    KvCache::SeqId seq = -1;  // -1: not started, or finished and freed
    int64_t done = 0;         // tokens evaluated
    std::vector<double> sum;  // mean pooling: the rows' running sum
  };
  void finish(size_t i, const float* last_row);
  Engine& engine_;
  std::vector<std::vector<int32_t>> inputs_;
  Pooling pooling_;
  std::vector<Progress> progress_;
  std::vector<std::vector<float>> results_;
  size_t next_ = 0;      // the first input not finished
  size_t finished_ = 0;  // inputs pooled
};

// Runs a whole batch (EmbeddingBatch::step until done) and returns its results.
std::vector<std::vector<float>> embed(Engine& engine, std::vector<std::vector<int32_t>> inputs, Pooling pooling);

}  // namespace tessera
