// The `qwen3moe` architecture (Qwen3-30B-A3B and relatives): the llama decoder with
// RMS norms on each query and key head before RoPE (NeoX mode), and a routed
// mixture-of-experts feed-forward: top-k on the raw router logits, softmax over the
// k chosen (equal to llama.cpp's softmax over all experts renormalized to the chosen
// ones, with k exponentials instead of n_expert), SwiGLU experts, weighted sum.
#include <cmath>

#include "models/architectures.h"
#include "models/graph_builder.h"
#include "models/model_loader_util.h"

namespace tessera::models {
namespace {

struct Qwen3MoeLayer {
  Tensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm, router, up_exps, gate_exps, down_exps;
};

class Qwen3MoeModel final : public Model {
 public:
  explicit Qwen3MoeModel(const ModelFile& file) {
    const std::string arch = "qwen3moe";
    WeightSource w(file, arch);
    ModelInfo& i = info_;
    i.architecture = arch;
    i.name = w.md().get_string("general.name").value_or("");
    i.n_embd = w.hp_int("embedding_length");
    i.n_layer = w.hp_int("block_count");
    i.n_head = w.hp_int("attention.head_count");
    i.n_head_kv = w.hp_int("attention.head_count_kv", i.n_head);
    i.context_length = w.hp_int("context_length", 4096);
    i.rms_eps = w.hp_float("attention.layer_norm_rms_epsilon", 1e-6f);
    i.rope_freq_base = w.hp_float("rope.freq_base", 1000000.f);
    i.n_expert = w.hp_int("expert_count");
    i.n_expert_used = w.hp_int("expert_used_count");
    i.n_ff = w.hp_int("expert_feed_forward_length", w.hp_int("feed_forward_length", 0));
    for (auto [key, v] : {std::pair{"embedding_length", i.n_embd}, {"block_count", i.n_layer},
                          {"attention.head_count", i.n_head}, {"attention.head_count_kv", i.n_head_kv},
                          {"expert_count", i.n_expert}, {"expert_used_count", i.n_expert_used},
                          {"expert_feed_forward_length", i.n_ff}})
      if (v <= 0) throw Error("qwen3moe: hyperparameter " + std::string(key) + " must be positive, got " + std::to_string(v));
    if (i.n_expert_used > i.n_expert)
      throw Error("qwen3moe: expert_used_count " + std::to_string(i.n_expert_used) + " exceeds expert_count " +
                  std::to_string(i.n_expert));
    if (i.n_head % i.n_head_kv != 0) throw Error("qwen3moe: attention.head_count is not a multiple of head_count_kv");
    i.head_dim = w.hp_int("attention.key_length", i.n_embd / i.n_head);
    if (w.hp_int("attention.value_length", i.head_dim) != i.head_dim)
      throw Error("qwen3moe: attention.value_length differs from key_length (not supported)");
    i.rope_dims = w.hp_int("rope.dimension_count", i.head_dim);
    if (i.rope_dims <= 0 || i.rope_dims > i.head_dim || i.rope_dims % 2)
      throw Error("qwen3moe: rope.dimension_count " + std::to_string(i.rope_dims) + " is invalid");

    const TensorInfo* emb = file.find_tensor("token_embd.weight");
    if (!emb || emb->ne.size() != 2) throw Error("model is missing tensor 'token_embd.weight' (2-D)");
    i.n_vocab = emb->ne[1];
    const int64_t E = i.n_embd, F = i.n_ff, Q = i.n_head * i.head_dim, KV = i.n_head_kv * i.head_dim,
                  V = i.n_vocab, X = i.n_expert, hd = i.head_dim;
    tok_embd_ = w.require("token_embd.weight", {E, V});
    output_norm_ = w.require("output_norm.weight", {E});
    output_ = w.has("output.weight") ? w.require("output.weight", {E, V}) : tok_embd_;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Qwen3MoeLayer& L = layers_[size_t(l)];
      L.attn_norm = w.require(p + "attn_norm.weight", {E});
      L.wq = w.require(p + "attn_q.weight", {E, Q});
      L.wk = w.require(p + "attn_k.weight", {E, KV});
      L.wv = w.require(p + "attn_v.weight", {E, KV});
      L.wo = w.require(p + "attn_output.weight", {Q, E});
      L.q_norm = w.require(p + "attn_q_norm.weight", {hd});
      L.k_norm = w.require(p + "attn_k_norm.weight", {hd});
      L.ffn_norm = w.require(p + "ffn_norm.weight", {E});
      L.router = w.require(p + "ffn_gate_inp.weight", {E, X});
      L.up_exps = w.require(p + "ffn_up_exps.weight", {E, F, X});
      L.gate_exps = w.require(p + "ffn_gate_exps.weight", {E, F, X});
      L.down_exps = w.require(p + "ffn_down_exps.weight", {F, E, X});
    }
  }

  const ModelInfo& info() const override { return info_; }

  std::vector<Tensor*> weights() override {
    std::vector<Tensor*> all{&tok_embd_, &output_norm_, &output_};
    for (auto& L : layers_)
      for (Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.q_norm, &L.k_norm, &L.ffn_norm, &L.router,
                        &L.up_exps, &L.gate_exps, &L.down_exps})
        all.push_back(t);
    return all;
  }

  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    return paged_kv_config(info_, n_ctx, page_tokens);
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    const ModelInfo& i = info_;
    const int64_t n = int64_t(b.tokens.size()), hd = i.head_dim, pos0 = b.positions.front();
    const float kq_scale = 1.0f / std::sqrt(float(hd));

    int32_t ids = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.tokens.data())));
    int32_t pos = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.positions.data())));
    int32_t x = g.get_rows(g.input(tok_embd_), ids);

    for (int64_t l = 0; l < i.n_layer; ++l) {
      const Qwen3MoeLayer& L = layers_[size_t(l)];
      int32_t h = g.rms_norm(x, g.input(L.attn_norm), i.rms_eps);
      int32_t q = g.reshape(g.matmul(g.input(L.wq), h), {hd, i.n_head, n});
      int32_t k = g.reshape(g.matmul(g.input(L.wk), h), {hd, i.n_head_kv, n});
      int32_t v = g.reshape(g.matmul(g.input(L.wv), h), {hd, i.n_head_kv, n});
      q = g.rms_norm(q, g.input(L.q_norm), i.rms_eps);
      k = g.rms_norm(k, g.input(L.k_norm), i.rms_eps);
      q = g.rope(q, pos, int(i.rope_dims), kRopeNeox, i.rope_freq_base, i.rope_freq_scale);
      k = g.rope(k, pos, int(i.rope_dims), kRopeNeox, i.rope_freq_base, i.rope_freq_scale);
      g.kv_write(kv, int(l), b.seq, pos0, k, v);
      int32_t att = g.reshape(g.attention(kv, int(l), b.seq, pos0, q, kq_scale), {hd * i.n_head, n});
      x = g.add(x, g.matmul(g.input(L.wo), att));

      h = g.rms_norm(x, g.input(L.ffn_norm), i.rms_eps);
      x = g.add(x, moe_ffn(g, L, h, n));
    }
    if (!b.all_logits) x = g.last_row(x);
    x = g.rms_norm(x, g.input(output_norm_), i.rms_eps);
    return g.matmul(g.input(output_), x);
  }

 private:
  int32_t moe_ffn(GraphBuilder& g, const Qwen3MoeLayer& L, int32_t h, int64_t n) const {
    int32_t logits = g.matmul(g.input(L.router), h);            // [n_expert, n]
    int32_t chosen = g.top_k(logits, info_.n_expert_used);       // [k, n]
    int32_t weights = g.softmax(g.gather_cols(logits, chosen));  // [k, n]
    int32_t x3 = g.reshape(h, {info_.n_embd, 1, n});
    int32_t up = g.mat_mul_id(g.input(L.up_exps), x3, chosen);    // [ff, k, n]
    int32_t gate = g.mat_mul_id(g.input(L.gate_exps), x3, chosen);
    int32_t down = g.mat_mul_id(g.input(L.down_exps), g.swiglu(gate, up), chosen);  // [embd, k, n]
    return g.moe_combine(down, weights);
  }

  ModelInfo info_;
  Tensor tok_embd_, output_norm_, output_;
  std::vector<Qwen3MoeLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_qwen3moe(const ModelFile& file) { return std::make_unique<Qwen3MoeModel>(file); }

}  // namespace tessera::models
