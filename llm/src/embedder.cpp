#include "tessera/embedder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/model_description.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace tessera {

const char* pooling_name(Pooling p) { return p == Pooling::Mean ? "mean" : "last"; }

std::optional<Pooling> parse_pooling(std::string_view name) {
  if (name == "mean") return Pooling::Mean;
  if (name == "last") return Pooling::Last;
  return std::nullopt;
}

Pooling model_pooling(const ModelFile& file) {
  const ModelDescription d = file.describe();
  const std::optional<int64_t> type = d.hparams.get_int("pooling_type");
  if (!type) return Pooling::Last;
  if (*type == 1) return Pooling::Mean;
  if (*type == 3) return Pooling::Last;
  const char* names[] = {"none", "mean", "cls", "last", "rank"};
  const std::string what = *type >= 0 && *type <= 4 ? std::string(" (") + names[*type] + ")" : std::string();
  throw Error(printable(d.origin_of("pooling_type"), 100) + " is " + std::to_string(*type) + what +
              ": embeddings pool the final hidden states by mean (1) or last token (3) only");
}

std::vector<int32_t> embedding_tokens(const Tokenizer& t, std::string_view text, bool add_eos) {
  std::vector<int32_t> ids = t.encode(text, t.add_bos_default() && t.bos() >= 0);
  if (add_eos && t.eos() >= 0) ids.push_back(t.eos());
  return ids;
}

bool tokenizer_adds_eos(const ModelFile& file) {
  return file.metadata().get_bool("tokenizer.ggml.add_eos_token").value_or(false);
}

void shape_embedding(std::vector<float>& v, int64_t dimensions, bool normalize) {
  if (dimensions > 0 && size_t(dimensions) < v.size()) v.resize(size_t(dimensions));
  if (!normalize) return;
  double sq = 0;
  for (float x : v) sq += double(x) * double(x);
  if (sq == 0) return;
  const double scale = 1.0 / std::sqrt(sq);
  for (float& x : v) x = float(double(x) * scale);
}

EmbeddingBatch::EmbeddingBatch(Engine& engine, std::vector<std::vector<int32_t>> inputs, Pooling pooling)
    : engine_(engine), inputs_(std::move(inputs)), pooling_(pooling), progress_(inputs_.size()),
      results_(inputs_.size()) {
  const int64_t V = engine_.n_vocab();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const auto& in = inputs_[i];
    if (in.empty()) throw Error("embedding input " + std::to_string(i) + " is empty");
    if (int64_t(in.size()) > engine_.n_ctx())
      throw Error("embedding input " + std::to_string(i) + " has " + std::to_string(in.size()) +
                  " tokens; the context size is " + std::to_string(engine_.n_ctx()));
    for (int32_t t : in)
      if (t < 0 || t >= V)
        throw Error("token id " + std::to_string(t) + " is out of range (vocabulary size " + std::to_string(V) + ")");
  }
}

EmbeddingBatch::~EmbeddingBatch() {
  for (const Progress& p : progress_)
    if (p.seq >= 0) engine_.kv().free_sequence(p.seq);
}

int64_t EmbeddingBatch::tokens() const {
  int64_t n = 0;
  for (const auto& in : inputs_) n += int64_t(in.size());
  return n;
}

bool EmbeddingBatch::step() {
  if (done()) return true;
  KvCache& kv = engine_.kv();
  const int64_t page = kv.config().page_tokens;
  auto pages_for = [&](int64_t n) { return (n + page - 1) / page; };
  int64_t budget = engine_.batch_tokens(), free_pages = kv.new_position_pages();
  struct Planned {
    size_t input;
    int64_t count;
    bool last;
  };
  std::vector<Planned> plan;
  std::vector<Engine::Chunk> chunks;
  // Inputs in order: each continues where it stopped; a later one starts only when the
  // earlier ones' last chunks are in this step, so inputs finish in order.
  for (size_t i = next_; i < inputs_.size() && budget > 0; ++i) {
    Progress& p = progress_[i];
    const int64_t len = int64_t(inputs_[i].size()), remaining = len - p.done;
    int64_t count = std::min(remaining, budget);
    int64_t need = pages_for(p.done + count) - pages_for(p.done);
    if (need > free_pages) {  // as many tokens as the free pages hold
      count = std::min(count, (pages_for(p.done) + free_pages) * page - p.done);
      if (count <= 0) break;
      need = pages_for(p.done + count) - pages_for(p.done);
    }
    free_pages -= need;
    budget -= count;
    if (p.seq < 0) p.seq = kv.create_sequence();
    const bool last = count == remaining;
    using L = Engine::Logits;
    const L rows = pooling_ == Pooling::Mean ? L::All : last ? L::Last : L::None;
    chunks.push_back({p.seq, std::span<const int32_t>(inputs_[i]).subspan(size_t(p.done), size_t(count)), rows});
    plan.push_back({i, count, last});
    if (!last) break;
  }
  if (chunks.empty())
    throw KvPagesExhausted("the KV cache has no free pages for the next embedding input (other sequences hold them)");

  const std::span<const float> rows = engine_.forward_hidden(chunks);
  const int64_t E = engine_.n_embd();
  size_t off = 0;
  for (const Planned& pl : plan) {
    Progress& p = progress_[pl.input];
    if (pooling_ == Pooling::Mean) {
      p.sum.resize(size_t(E), 0.0);
      for (int64_t r = 0; r < pl.count; ++r, off += size_t(E))
        for (int64_t j = 0; j < E; ++j) p.sum[size_t(j)] += double(rows[off + size_t(j)]);
    }
    p.done += pl.count;
    if (!pl.last) continue;
    const float* last_row = nullptr;
    if (pooling_ == Pooling::Last) {
      last_row = rows.data() + off;
      off += size_t(E);
    }
    finish(pl.input, last_row);
  }
  if (off != rows.size()) throw Error("internal: hidden-state rows do not match the embedding chunks");
  return done();
}

void EmbeddingBatch::finish(size_t i, const float* last_row) {
  Progress& p = progress_[i];
  const int64_t E = engine_.n_embd();
  std::vector<float>& out = results_[i];
  out.resize(size_t(E));
  const double n = double(inputs_[i].size());
  for (int64_t j = 0; j < E; ++j) out[size_t(j)] = last_row ? last_row[j] : float(p.sum[size_t(j)] / n);
  engine_.kv().free_sequence(p.seq);
  p.seq = -1;
  p.sum = {};
  ++finished_;
  while (next_ < inputs_.size() && progress_[next_].done == int64_t(inputs_[next_].size())) ++next_;
  for (float x : out)
    if (!std::isfinite(x))
      throw Error("embedding input " + std::to_string(i) +
                  ": the final hidden state holds NaN or infinity; the weights may be damaged (try --check-tensors)");
}

std::vector<std::vector<float>> embed(Engine& engine, std::vector<std::vector<int32_t>> inputs, Pooling pooling) {
  EmbeddingBatch batch(engine, std::move(inputs), pooling);
  while (!batch.step()) {
  }
  return batch.results();
}

}  // namespace tessera
