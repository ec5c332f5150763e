// The `gpt-oss` architecture (gpt-oss-20b, gpt-oss-120b): pre-norm decoder layers
// alternating sliding-window attention (even layers) and full attention (odd layers),
// with biases on the q, k, v and output projections, a learned per-head attention sink
// logit, YaRN RoPE (NeoX pairs) on every layer, and a routed mixture of experts with
// biases on the router and on every expert product, the clamped SwiGLU of gpt-oss
// between them, and a softmax over the chosen experts' router logits.
#include <cmath>

#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

// The expert biases, one row per expert ([width, n_expert], F32).
struct ExpertBiases {
  Tensor router, up, gate, down;
};

struct GptOssLayer {
  AttentionWeights attn;
  Tensor bo, sinks;
  Tensor ffn_norm;  // the file's post_attention_norm: the norm before the feed-forward
  ExpertWeights experts;
  ExpertBiases bias;
  bool local = false;
};

// gpt-oss's clamped SwiGLU: alpha in the sigmoid, gate clamped above and up both ways.
constexpr float kSwiGluAlpha = 1.702f, kSwiGluLimit = 7.0f;

class GptOssModel final : public Model {
 public:
  explicit GptOssModel(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    read_decoder_hparams(w, i, {131072, 1e-5f, 150000.f});
    read_expert_hparams(w, i);
    window_ = read_sliding_window(w, 128);
    yarn_ = read_rope_scaling(w, i);

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd, F = i.n_ff, X = i.n_expert;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      GptOssLayer& L = layers_[size_t(l)];
      load_attention(w, L.attn, p, i, /*qk_norms=*/false, /*qkv_bias=*/true);
      w.load_f32(L.bo, p + "attn_output.bias", {E});
      w.load_f32(L.sinks, p + "attn_sinks.weight", {i.n_head});
      w.load(L.ffn_norm, p + "post_attention_norm.weight", {E});
      load_experts(w, L.experts, p, i);
      w.load_f32(L.bias.router, p + "ffn_gate_inp.bias", {X});
      w.load_f32(L.bias.up, p + "ffn_up_exps.bias", {F, X});
      w.load_f32(L.bias.gate, p + "ffn_gate_exps.bias", {F, X});
      w.load_f32(L.bias.down, p + "ffn_down_exps.bias", {E, X});
      L.local = l % 2 == 0;  // sliding window on even layers, full attention on odd ones
    }
  }

  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    return windowed_kv_config(info_, n_ctx, page_tokens, window_, local_layer_flags(layers_));
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const GptOssLayer& L = layers_[size_t(l)];
      AttentionSpec s;
      s.rope_mode = kRopeNeox;
      s.rope_base = info_.rope_freq_base;
      s.rope_scale = info_.rope_freq_scale;
      s.yarn = yarn_;
      s.window = L.local ? window_ : 0;
      s.sinks = g.input(L.sinks);
      const int32_t att = g.add(self_attention(g, L.attn, info_, kv, int(l), b, x, pos, s), g.input(L.bo));
      x = g.add(x, att);
      const int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      x = g.add(x, experts(g, L, h));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  // Router (with its bias), top-k, softmax over the chosen logits; each chosen expert's
  // products with their biases (rows of the bias tables gathered by expert id), the
  // clamped SwiGLU, and the weighted sum.
  int32_t experts(GraphBuilder& g, const GptOssLayer& L, int32_t h) const {
    const ModelInfo& i = info_;
    const int64_t n = g.graph().tensor(h).ne[1], k = i.n_expert_used;
    const int32_t logits = g.add(g.matmul(g.input(L.experts.router), h), g.input(L.bias.router));  // [X, n]
    const int32_t chosen = g.top_k(logits, k);                                                     // [k, n]
    const int32_t weights = g.softmax(g.gather_cols(logits, chosen));
    const int32_t ids = g.reshape(chosen, {k * n});
    auto biased = [&](int32_t products, const Tensor& bias) {  // products [w, k, n] + bias[:, id]
      const int64_t width = g.graph().tensor(products).ne[0];
      return g.add(products, g.reshape(g.get_rows(g.input(bias), ids), {width, k, n}));
    };
    const int32_t x3 = g.reshape(h, {i.n_embd, 1, n});
    const int32_t up = biased(g.mat_mul_id(g.input(L.experts.up_exps), x3, chosen), L.bias.up);
    const int32_t gate = biased(g.mat_mul_id(g.input(L.experts.gate_exps), x3, chosen), L.bias.gate);
    const int32_t act = g.swiglu_oai(gate, up, kSwiGluAlpha, kSwiGluLimit);
    const int32_t down = biased(g.mat_mul_id(g.input(L.experts.down_exps), act, chosen), L.bias.down);
    return g.moe_combine(down, weights);
  }

  int32_t window_ = 0;
  RopeYarn yarn_;
  EmbeddingWeights embd_;
  std::vector<GptOssLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_gpt_oss(const ModelDescription& d) { return std::make_unique<GptOssModel>(d); }

}  // namespace tessera::models
