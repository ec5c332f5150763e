// The `llama` architecture (also Mistral-style dense models): pre-norm decoder with
// grouped-query attention, RoPE in normal (adjacent pairs) mode, SwiGLU feed-forward,
// and the token embedding reused as the output matrix when output.weight is absent.
#include <cmath>

#include "models/architectures.h"
#include "models/graph_builder.h"
#include "models/model_loader_util.h"

namespace tessera::models {
namespace {

struct LlamaLayer {
  Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};

class LlamaModel final : public Model {
 public:
  explicit LlamaModel(const ModelFile& file) {
    const std::string arch = "llama";
    WeightSource w(file, arch);
    info_.architecture = arch;
    info_.name = w.md().get_string("general.name").value_or("");
    info_.n_embd = w.hp_int("embedding_length");
    info_.n_layer = w.hp_int("block_count");
    info_.n_ff = w.hp_int("feed_forward_length");
    info_.n_head = w.hp_int("attention.head_count");
    info_.n_head_kv = w.hp_int("attention.head_count_kv", info_.n_head);
    info_.context_length = w.hp_int("context_length", 2048);
    info_.rms_eps = w.hp_float("attention.layer_norm_rms_epsilon", 1e-5f);
    info_.rope_freq_base = w.hp_float("rope.freq_base", 10000.f);
    check_positive("embedding_length", info_.n_embd);
    check_positive("block_count", info_.n_layer);
    check_positive("feed_forward_length", info_.n_ff);
    check_positive("attention.head_count", info_.n_head);
    check_positive("attention.head_count_kv", info_.n_head_kv);
    if (info_.n_head % info_.n_head_kv != 0)
      throw Error("llama: attention.head_count (" + std::to_string(info_.n_head) +
                  ") is not a multiple of attention.head_count_kv (" + std::to_string(info_.n_head_kv) + ")");
    info_.head_dim = w.hp_int("attention.key_length", info_.n_embd / info_.n_head);
    if (w.hp_int("attention.value_length", info_.head_dim) != info_.head_dim)
      throw Error("llama: attention.value_length differs from key_length (not supported)");
    check_positive("attention.key_length", info_.head_dim);
    info_.rope_dims = w.hp_int("rope.dimension_count", info_.head_dim);
    if (info_.rope_dims <= 0 || info_.rope_dims > info_.head_dim || info_.rope_dims % 2)
      throw Error("llama: rope.dimension_count " + std::to_string(info_.rope_dims) + " is invalid for head size " +
                  std::to_string(info_.head_dim));
    if (auto type = w.md().get_string(arch + ".rope.scaling.type"); type && *type != "none") {
      if (*type != "linear") throw Error("llama: rope scaling type '" + *type + "' is not supported");
      float factor = w.hp_float("rope.scaling.factor", 1.f);
      if (!(factor > 0.f)) throw Error("llama: rope.scaling.factor must be positive");
      info_.rope_freq_scale = 1.f / factor;
    }

    const TensorInfo* emb = file.find_tensor("token_embd.weight");
    if (!emb || emb->ne.size() != 2) throw Error("model is missing tensor 'token_embd.weight' (2-D)");
    info_.n_vocab = emb->ne[1];
    const int64_t E = info_.n_embd, F = info_.n_ff, Q = info_.n_head * info_.head_dim,
                  KV = info_.n_head_kv * info_.head_dim, V = info_.n_vocab;
    tok_embd_ = w.require("token_embd.weight", {E, V});
    output_norm_ = w.require("output_norm.weight", {E});
    output_ = w.has("output.weight") ? w.require("output.weight", {E, V}) : tok_embd_;
    layers_.resize(size_t(info_.n_layer));
    for (int64_t l = 0; l < info_.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LlamaLayer& L = layers_[size_t(l)];
      L.attn_norm = w.require(p + "attn_norm.weight", {E});
      L.wq = w.require(p + "attn_q.weight", {E, Q});
      L.wk = w.require(p + "attn_k.weight", {E, KV});
      L.wv = w.require(p + "attn_v.weight", {E, KV});
      L.wo = w.require(p + "attn_output.weight", {Q, E});
      L.ffn_norm = w.require(p + "ffn_norm.weight", {E});
      L.w_gate = w.require(p + "ffn_gate.weight", {E, F});
      L.w_up = w.require(p + "ffn_up.weight", {E, F});
      L.w_down = w.require(p + "ffn_down.weight", {F, E});
    }
  }

  const ModelInfo& info() const override { return info_; }

  std::vector<Tensor*> weights() override {
    std::vector<Tensor*> all{&tok_embd_, &output_norm_, &output_};
    for (auto& L : layers_)
      for (Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down})
        all.push_back(t);
    return all;
  }

  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    return paged_kv_config(info_, n_ctx, page_tokens);
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    const int64_t n = int64_t(b.tokens.size());
    const int64_t hd = info_.head_dim, pos0 = b.positions.front();
    const float kq_scale = 1.0f / std::sqrt(float(hd));

    int32_t ids = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.tokens.data())));
    int32_t pos = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.positions.data())));
    int32_t x = g.get_rows(g.input(tok_embd_), ids);

    for (int64_t l = 0; l < info_.n_layer; ++l) {
      const LlamaLayer& L = layers_[size_t(l)];
      int32_t h = g.rms_norm(x, g.input(L.attn_norm), info_.rms_eps);
      int32_t q = g.reshape(g.matmul(g.input(L.wq), h), {hd, info_.n_head, n});
      int32_t k = g.reshape(g.matmul(g.input(L.wk), h), {hd, info_.n_head_kv, n});
      int32_t v = g.reshape(g.matmul(g.input(L.wv), h), {hd, info_.n_head_kv, n});
      q = g.rope(q, pos, int(info_.rope_dims), kRopeNormal, info_.rope_freq_base, info_.rope_freq_scale);
      k = g.rope(k, pos, int(info_.rope_dims), kRopeNormal, info_.rope_freq_base, info_.rope_freq_scale);
      g.kv_write(kv, int(l), b.seq, pos0, k, v);
      int32_t att = g.attention(kv, int(l), b.seq, pos0, q, kq_scale);
      att = g.reshape(att, {hd * info_.n_head, n});
      x = g.add(x, g.matmul(g.input(L.wo), att));

      h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      int32_t ff = g.swiglu(g.matmul(g.input(L.w_gate), h), g.matmul(g.input(L.w_up), h));
      x = g.add(x, g.matmul(g.input(L.w_down), ff));
    }
    if (!b.all_logits) x = g.last_row(x);
    x = g.rms_norm(x, g.input(output_norm_), info_.rms_eps);
    return g.matmul(g.input(output_), x);
  }

 private:
  static void check_positive(const char* key, int64_t v) {
    if (v <= 0) throw Error(std::string("llama: hyperparameter ") + key + " must be positive, got " + std::to_string(v));
  }

  ModelInfo info_;
  Tensor tok_embd_, output_norm_, output_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_llama(const ModelFile& file) { return std::make_unique<LlamaModel>(file); }

}  // namespace tessera::models
