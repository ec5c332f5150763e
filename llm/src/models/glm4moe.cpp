// The `glm4moe` architecture (GLM-4.5, GLM-4.5-Air, GLM-4.6): the llama decoder with
// biases on q, k and v, optional RMS norms on each query and key head, NeoX RoPE on the
// first rope.dimension_count dimensions of each head, leading dense layers, then
// mixture-of-experts layers with one shared expert beside the routed ones and sigmoid
// routing (decoder_blocks.h: routed_experts_scored). The file's last
// nextn_predict_layers blocks are NextN (multi-token prediction) layers: their tensors
// are recognised and left out of the forward pass.
#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

struct Glm4MoeLayer {
  AttentionWeights attn;
  Tensor ffn_norm;  // the file's post_attention_norm: the norm before the feed-forward
  FfnWeights dense;       // leading dense layers
  ExpertWeights experts;  // the others
  ScoredRouting routing;
  FfnWeights shared;
};

class Glm4MoeModel final : public Model {
 public:
  explicit Glm4MoeModel(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    read_decoder_hparams(w, i, {131072, 1e-5f, 1000000.f});
    const int64_t n_blocks = i.n_layer;
    const int64_t nextn = w.hp_int("nextn_predict_layers", 0);
    if (nextn < 0 || nextn >= n_blocks)
      w.refuse("nextn_predict_layers", std::to_string(nextn), "must be 0 .. block_count - 1");
    i.n_layer = n_blocks - nextn;
    n_dense_ = w.hp_int("leading_dense_block_count", 0);
    if (n_dense_ < 0 || n_dense_ > i.n_layer)
      w.refuse("leading_dense_block_count", std::to_string(n_dense_), "must be 0 .. the number of layers");
    read_expert_hparams(w, i);
    const int64_t n_ff_dense = w.hp_size("feed_forward_length");
    const int64_t n_shared = w.hp_int("expert_shared_count", 0);
    if (n_shared != 1)
      w.refuse("expert_shared_count", std::to_string(n_shared), "is not supported (glm4moe has one shared expert)");
    if (const int64_t gating = w.hp_int("expert_gating_func", 2); gating != 2)
      w.refuse("expert_gating_func", std::to_string(gating), "is not supported (glm4moe routes by sigmoid, 2)");
    const ExpertGroups groups = read_expert_groups(w, i);
    if (!w.hp_bool("expert_weights_norm").value_or(true))
      w.refuse("expert_weights_norm", "false", "un-normalised sigmoid routing weights are not supported");
    const float routed_scale = w.hp_positive_float("expert_weights_scale", 1.f);

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Glm4MoeLayer& L = layers_[size_t(l)];
      load_attention(w, L.attn, p, i, /*qk_norms=*/w.has(p + "attn_q_norm.weight"), /*qkv_bias=*/true);
      w.load(L.ffn_norm, p + "post_attention_norm.weight", {E});
      if (l < n_dense_) {
        load_ffn(w, L.dense, p, "", E, n_ff_dense);
        continue;
      }
      load_experts(w, L.experts, p, i);
      w.load_f32(L.routing.correction_bias, p + "exp_probs_b.bias", {i.n_expert});
      L.routing.scale = routed_scale;
      L.routing.groups = groups.groups;
      L.routing.groups_kept = groups.kept;
      load_ffn(w, L.shared, p, "_shexp", E, i.n_ff);
    }
    // The NextN layers: every tensor named blk.N.* for N past the forward layers.
    for (const TensorInfo& t : desc.tensors)
      for (int64_t l = i.n_layer; l < n_blocks; ++l)
        if (t.name.rfind("blk." + std::to_string(l) + ".", 0) == 0) skipped_.push_back(t.name);
  }

  std::vector<std::string> skipped_tensors() const override { return skipped_; }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const Glm4MoeLayer& L = layers_[size_t(l)];
      x = g.add(x, self_attention(g, L.attn, info_, kv, int(l), b, x, pos, kRopeNeox));
      const int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      if (l < n_dense_) {
        x = g.add(x, gated_ffn(g, L.dense, h));
        continue;
      }
      const int32_t routed = routed_experts_scored(g, L.experts, L.routing, info_, h);
      const int32_t shared = gated_ffn(g, L.shared, h);
      x = g.add(x, g.add(routed, shared));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  int64_t n_dense_ = 0;
  EmbeddingWeights embd_;
  std::vector<Glm4MoeLayer> layers_;
  std::vector<std::string> skipped_;
};

}  // namespace

std::unique_ptr<Model> make_glm4moe(const ModelDescription& d) { return std::make_unique<Glm4MoeModel>(d); }

}  // namespace tessera::models
