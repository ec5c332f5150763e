// The `qwen3moe` architecture (Qwen3-30B-A3B and relatives): the llama decoder with
// RMS norms on each query and key head before RoPE (NeoX mode), and a routed
// mixture-of-experts feed-forward (decoder_blocks.h: routed_experts).
#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

struct Qwen3MoeLayer {
  AttentionWeights attn;
  Tensor ffn_norm;
  ExpertWeights experts;
};

class Qwen3MoeModel final : public Model {
 public:
  explicit Qwen3MoeModel(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    // Checked against the tensor table before anything is sized (model_loader_util.h).
    read_decoder_hparams(w, i, {4096, 1e-6f, 1000000.f});
    read_expert_hparams(w, i);

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Qwen3MoeLayer& L = layers_[size_t(l)];
      load_attention(w, L.attn, p, i, /*qk_norms=*/true);
      w.load(L.ffn_norm, p + "ffn_norm.weight", {E});
      load_experts(w, L.experts, p, i);
    }
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const Qwen3MoeLayer& L = layers_[size_t(l)];
      x = g.add(x, self_attention(g, L.attn, info_, kv, int(l), b, x, pos, kRopeNeox));
      int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      x = g.add(x, routed_experts(g, L.experts, info_, h));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  EmbeddingWeights embd_;
  std::vector<Qwen3MoeLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_qwen3moe(const ModelDescription& d) { return std::make_unique<Qwen3MoeModel>(d); }

}  // namespace tessera::models
