// The `gemma3` architecture (Gemma 3 text models): local sliding-window attention
// layers between global ones (by default five local, then one global), each kind with
// its own RoPE base (linear RoPE scaling applies to the global layers only); RMS norms
// on each query and key head, norms both before and after the attention and the
// feed-forward, a GELU (tanh form) gated feed-forward, embeddings scaled by
// sqrt(n_embd) and a tied output. GGUF files store Gemma's norm weights with the +1
// already added, so every norm here is a plain weighted RMS norm.
#include <cmath>

#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

struct Gemma3Layer {
  AttentionWeights attn;
  Tensor attn_post_norm, ffn_norm, ffn_post_norm;
  FfnWeights ffn;
  bool local = false;
};

class Gemma3Model final : public Model {
 public:
  explicit Gemma3Model(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    read_decoder_hparams(w, i, {131072, 1e-6f, 1000000.f});
    i.n_ff = w.hp_size("feed_forward_length");
    window_ = read_sliding_window(w, 4096);
    // Which layers are local: attention.sliding_window_pattern as one flag per layer
    // (true: local) or as a period N (every N-th layer global); absent, a period of 6
    // (llama.cpp's default for gemma3 files, which do not record it).
    std::vector<bool> local(size_t(i.n_layer));
    const MetaValue* pv = w.hp_value("attention.sliding_window_pattern");
    if (const std::vector<MetaValue>* flags = pv ? pv->as_array() : nullptr) {
      if (int64_t(flags->size()) < i.n_layer)
        w.refuse("attention.sliding_window_pattern", std::to_string(flags->size()) + " flags",
                 "has fewer flags than the " + std::to_string(i.n_layer) + " layers");
      for (int64_t l = 0; l < i.n_layer; ++l) {
        const std::optional<int64_t> f = (*flags)[size_t(l)].as_int();
        if (!f) w.refuse("attention.sliding_window_pattern", "a non-boolean flag", "must hold booleans");
        local[size_t(l)] = *f != 0;
      }
    } else {
      const int64_t pattern = w.hp_int("attention.sliding_window_pattern", 6);
      if (pattern < 1) w.refuse("attention.sliding_window_pattern", std::to_string(pattern), "must be >= 1");
      for (int64_t l = 0; l < i.n_layer; ++l) local[size_t(l)] = (l + 1) % pattern != 0;
    }
    local_base_ = w.hp_positive_float("rope.freq_base_swa", 10000.f);
    if (read_rope_scaling(w, i).ext_factor != 0.f)
      throw Error(w.arch() + ": rope scaling type 'yarn' is not supported");
    // Queries are scaled by 1/sqrt(query_pre_attn_scalar): the head size, except in the
    // 27B model (62 layers), where it is n_embd / n_head (as llama.cpp infers it).
    const float pre_attn = i.n_layer == 62 ? float(i.n_embd / i.n_head) : float(i.head_dim);
    attn_scale_ = 1.0f / std::sqrt(pre_attn);

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Gemma3Layer& L = layers_[size_t(l)];
      load_attention(w, L.attn, p, i, /*qk_norms=*/true);
      w.load(L.attn_post_norm, p + "post_attention_norm.weight", {E});
      w.load(L.ffn_norm, p + "ffn_norm.weight", {E});
      w.load(L.ffn_post_norm, p + "post_ffw_norm.weight", {E});
      load_ffn(w, L.ffn, p, "", E, i.n_ff);
      L.local = local[size_t(l)];
    }
    embd_scale_.assign(size_t(E), std::sqrt(float(E)));
  }

  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    return windowed_kv_config(info_, n_ctx, page_tokens, window_, local_layer_flags(layers_));
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const int64_t E = info_.n_embd;
    if (!b.stage_input)  // the embeddings' scale (a previous rank's output has it)
      x = g.mul(x, g.input(Tensor::contiguous(DType::F32, {E}, const_cast<float*>(embd_scale_.data()))));
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const Gemma3Layer& L = layers_[size_t(l)];
      AttentionSpec s;
      s.rope_mode = kRopeNeox;
      s.rope_base = L.local ? local_base_ : info_.rope_freq_base;
      s.rope_scale = L.local ? 1.f : info_.rope_freq_scale;
      s.scale = attn_scale_;
      s.window = L.local ? window_ : 0;
      int32_t att = self_attention(g, L.attn, info_, kv, int(l), b, x, pos, s);
      x = g.add(x, g.rms_norm(att, g.input(L.attn_post_norm), info_.rms_eps));
      const int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      const int32_t ff = gated_ffn(g, L.ffn, h, Glu::GeluTanh);
      x = g.add(x, g.rms_norm(ff, g.input(L.ffn_post_norm), info_.rms_eps));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  int32_t window_ = 0;
  float local_base_ = 10000.f, attn_scale_ = 1.f;
  std::vector<float> embd_scale_;  // sqrt(n_embd) in every column (the embeddings' scale)
  EmbeddingWeights embd_;
  std::vector<Gemma3Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const ModelDescription& d) { return std::make_unique<Gemma3Model>(d); }

}  // namespace tessera::models
