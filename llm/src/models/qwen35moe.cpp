// The `qwen35moe` architecture (Qwen3.5 / 3.6 MoE, e.g. Qwen3.5-35B-A3B): a hybrid of
// gated delta-net linear-attention layers and, every `full_attention_interval`-th
// layer, gated full attention; every layer has a post-attention norm and a routed
// mixture of experts plus a sigmoid-gated shared expert. The math follows llama.cpp
// (src/models/qwen35moe.cpp, delta-net-base.cpp):
//  - delta-net layer: qkv = W_qkv h, z = W_gate h, beta = sigmoid(W_beta h),
//    g = softplus(W_alpha h + dt_bias) * a; a causal depthwise conv (kernel d_conv,
//    state of d_conv-1 inputs) and SiLU over qkv; q and k L2-normalized; the delta
//    rule per value head (value head h reads key head h % n_k_heads); RMS norm of
//    each head's output times SiLU(z); output projection.
//  - attention layer: one projection gives each head's query and its output gate;
//    q/k RMS norms; interleaved multi-section RoPE on the first rope.dimension_count
//    dims; attention over the paged KV cache; output times sigmoid(gate); W_o.
// Only the attention layers have KV-cache layers; the delta-net layers keep their
// state in the cache's RecurrentState.
#include <array>
#include <cmath>

#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

struct DeltaNetWeights {
  Tensor qkv, gate, conv1d, dt_bias, a, beta, alpha, norm, out;
};

struct GatedAttentionWeights {
  Tensor wq_gate, wk, wv, wo, q_norm, k_norm;
};

struct SharedExpertWeights {
  Tensor gate_inp, up, gate, down;
};

struct Qwen35MoeLayer {
  bool recurrent = false;
  int cache_layer = 0;  // index among the KV (attention) or recurrent layers
  Tensor attn_norm, post_norm;
  DeltaNetWeights dn;
  GatedAttentionWeights at;
  ExpertWeights experts;
  SharedExpertWeights shexp;
};

class Qwen35MoeModel final : public Model {
 public:
  explicit Qwen35MoeModel(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    // Checked against the tensor table before anything is sized (model_loader_util.h);
    // products of sizes are overflow-checked.
    read_decoder_hparams(w, i, {4096, 1e-6f, 10000000.f});
    i.n_expert = w.hp_size("expert_count");
    i.n_expert_used = w.hp_size("expert_used_count");
    i.n_ff = w.hp_size("expert_feed_forward_length");
    n_ff_shexp_ = w.hp_has("expert_shared_feed_forward_length") || !w.hp_has("feed_forward_length")
                      ? w.hp_size("expert_shared_feed_forward_length", i.n_ff)
                      : w.hp_size("feed_forward_length");
    d_conv_ = w.hp_size("ssm.conv_kernel");
    head_dim_ssm_ = w.hp_size("ssm.state_size");
    n_k_heads_ = w.hp_size("ssm.group_count");
    n_v_heads_ = w.hp_size("ssm.time_step_rank");
    const int64_t d_inner = w.hp_size("ssm.inner_size");
    const int64_t interval = w.hp_int("full_attention_interval", 4);
    if (interval < 1 || interval > i.n_layer)
      w.refuse("full_attention_interval", std::to_string(interval),
               "must be between 1 and block_count " + std::to_string(i.n_layer) + " (no full-attention layer otherwise)");
    if (i.n_expert_used > i.n_expert)
      w.refuse("expert_used_count", std::to_string(i.n_expert_used),
               "exceeds expert_count " + std::to_string(i.n_expert));
    if (n_v_heads_ % n_k_heads_ != 0)
      w.refuse("ssm.time_step_rank", std::to_string(n_v_heads_),
               "(value heads) is not a multiple of ssm.group_count " + std::to_string(n_k_heads_));
    if (d_inner != w.mul(head_dim_ssm_, n_v_heads_, "ssm.state_size x ssm.time_step_rank"))
      w.refuse("ssm.inner_size", std::to_string(d_inner),
               "differs from ssm.state_size x ssm.time_step_rank (" + std::to_string(head_dim_ssm_) + " x " +
                   std::to_string(n_v_heads_) + ")");
    read_rope_sections(w);

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd, hd = i.head_dim, S = head_dim_ssm_;
    const int64_t key_dim = w.mul(S, n_k_heads_, "ssm.state_size x ssm.group_count");
    const int64_t value_dim = d_inner;
    const int64_t conv_dim = w.mul(2, key_dim, "2 x key dim") + value_dim;  // both <= max_dim: no overflow
    const int64_t q_gate_dim = w.mul(2, w.mul(hd, i.n_head, "attention.key_length x attention.head_count"),
                                     "2 x query dim");
    const int64_t kv_dim = w.mul(hd, i.n_head_kv, "attention.key_length x attention.head_count_kv");
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Qwen35MoeLayer& L = layers_[size_t(l)];
      L.recurrent = (l + 1) % interval != 0;
      L.cache_layer = L.recurrent ? n_recurrent_++ : n_attention_++;
      w.load(L.attn_norm, p + "attn_norm.weight", {E});
      w.load(L.post_norm, p + "post_attention_norm.weight", {E});
      if (L.recurrent) {
        DeltaNetWeights& d = L.dn;
        w.load(d.qkv, p + "attn_qkv.weight", {E, conv_dim});
        w.load(d.gate, p + "attn_gate.weight", {E, value_dim});
        w.load(d.conv1d, p + "ssm_conv1d.weight", {d_conv_, conv_dim});
        w.load(d.dt_bias, p + "ssm_dt.bias", {n_v_heads_});
        w.load(d.a, p + "ssm_a", {n_v_heads_});
        w.load(d.beta, p + "ssm_beta.weight", {E, n_v_heads_});
        w.load(d.alpha, p + "ssm_alpha.weight", {E, n_v_heads_});
        w.load(d.norm, p + "ssm_norm.weight", {S});
        w.load(d.out, p + "ssm_out.weight", {value_dim, E});
      } else {
        GatedAttentionWeights& a = L.at;
        w.load(a.wq_gate, p + "attn_q.weight", {E, q_gate_dim});
        w.load(a.wk, p + "attn_k.weight", {E, kv_dim});
        w.load(a.wv, p + "attn_v.weight", {E, kv_dim});
        w.load(a.wo, p + "attn_output.weight", {q_gate_dim / 2, E});
        w.load(a.q_norm, p + "attn_q_norm.weight", {hd});
        w.load(a.k_norm, p + "attn_k_norm.weight", {hd});
      }
      load_experts(w, L.experts, p, i);
      w.load(L.shexp.gate_inp, p + "ffn_gate_inp_shexp.weight", {E});
      w.load(L.shexp.up, p + "ffn_up_shexp.weight", {E, n_ff_shexp_});
      w.load(L.shexp.gate, p + "ffn_gate_shexp.weight", {E, n_ff_shexp_});
      w.load(L.shexp.down, p + "ffn_down_shexp.weight", {n_ff_shexp_, E});
    }
  }

  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    KvCacheConfig c = paged_kv_config(info_, n_ctx, page_tokens);
    c.n_layers = n_attention_;
    const int64_t conv_dim = (2 * n_k_heads_ + n_v_heads_) * head_dim_ssm_;
    c.recurrent.n_layers = n_recurrent_;
    c.recurrent.conv_elems = (d_conv_ - 1) * conv_dim;
    c.recurrent.state_elems = head_dim_ssm_ * head_dim_ssm_ * n_v_heads_;
    return c;
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const Qwen35MoeLayer& L = layers_[size_t(l)];
      int32_t h = g.rms_norm(x, g.input(L.attn_norm), info_.rms_eps);
      x = g.add(x, L.recurrent ? delta_net(g, L, kv, b, h) : gated_attention(g, L, kv, b, h, pos));
      int32_t h2 = g.rms_norm(x, g.input(L.post_norm), info_.rms_eps);
      x = g.add(x, g.add(routed_experts(g, L.experts, info_, h2), shared_expert(g, L.shexp, h2)));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  [[noreturn]] static void fail(const std::string& why) { throw Error("qwen35moe: " + why); }

  void read_rope_sections(const WeightSource& w) {
    const MetaValue* v = w.hp_value("rope.dimension_sections");
    if (!v) fail("missing metadata key " + w.key("rope.dimension_sections"));
    const auto* arr = v->as_array();
    if (!arr || arr->empty() || arr->size() > 4) fail("rope.dimension_sections must be an array of up to 4 integers");
    // Each section is bounded before it is summed or narrowed (a huge section was signed
    // overflow in the int32 sum).
    const int64_t limit = info_.rope_dims / 2;
    int64_t total = 0;
    for (size_t j = 0; j < arr->size(); ++j) {
      auto s = (*arr)[j].as_int();
      if (!s || *s < 0 || *s > limit)
        w.refuse("rope.dimension_sections", "[.., " + (s ? std::to_string(*s) : std::string("?")) + ", ..]",
                 "must hold integers between 0 and rope.dimension_count / 2 = " + std::to_string(limit));
      sections_[j] = int32_t(*s);
      total += *s;
    }
    if (int64_t(sections_[0]) + sections_[1] + sections_[2] <= 0 || total > limit)
      w.refuse("rope.dimension_sections", "(sum " + std::to_string(total) + ")",
               "does not fit rope.dimension_count " + std::to_string(info_.rope_dims));
  }

  int32_t delta_net(GraphBuilder& g, const Qwen35MoeLayer& L, KvCache& kv, const ForwardBatch& b, int32_t h) const {
    const DeltaNetWeights& d = L.dn;
    const int64_t n = int64_t(b.tokens.size()), S = head_dim_ssm_;
    int32_t qkv = g.matmul(g.input(d.qkv), h);                     // [conv_dim, n]
    int32_t z = g.matmul(g.input(d.gate), h);                      // [value_dim, n]
    int32_t beta = g.sigmoid(g.matmul(g.input(d.beta), h));        // [n_v_heads, n]
    int32_t alpha = g.matmul(g.input(d.alpha), h);                 // [n_v_heads, n]
    int32_t decay = g.mul(g.softplus(g.add(alpha, g.input(d.dt_bias))), g.input(d.a));  // log decay
    const int32_t kernel = g.input(d.conv1d);
    int32_t conv, o;  // [conv_dim, n], [S, n_v_heads, n]
    if (b.slices.size() == 1) {
      const KvCache::SeqId seq = b.slices.front().seq;
      conv = g.silu(g.ssm_conv(kv, L.cache_layer, seq, qkv, kernel));
      o = g.gated_delta_net(kv, L.cache_layer, seq, conv, decay, beta, n_k_heads_, n_v_heads_, S, info_.rms_eps);
    } else {
      // Each sequence runs its tokens in order through its own state slot, writing its
      // rows of the shared outputs.
      const int32_t raw = g.same_shape_f32(qkv);
      for (const SeqSlice& s : b.slices)
        g.ssm_conv(kv, L.cache_layer, s.seq, g.token_rows(qkv, s.first, s.count), kernel,
                   g.token_rows(raw, s.first, s.count));
      conv = g.silu(raw);
      o = g.graph().new_tensor(DType::F32, {S, n_v_heads_, n});
      for (const SeqSlice& s : b.slices)
        g.gated_delta_net(kv, L.cache_layer, s.seq, g.token_rows(conv, s.first, s.count),
                          g.token_rows(decay, s.first, s.count), g.token_rows(beta, s.first, s.count), n_k_heads_,
                          n_v_heads_, S, info_.rms_eps, g.token_rows(o, s.first, s.count));
    }
    int32_t normed = g.rms_norm(o, g.input(d.norm), info_.rms_eps);
    int32_t gated = g.swiglu(g.reshape(z, {S, n_v_heads_, n}), normed);  // silu(z) * norm(o)
    return g.matmul(g.input(d.out), g.reshape(gated, {S * n_v_heads_, n}));
  }

  int32_t gated_attention(GraphBuilder& g, const Qwen35MoeLayer& L, KvCache& kv, const ForwardBatch& b, int32_t h,
                          int32_t pos) const {
    const GatedAttentionWeights& a = L.at;
    const int64_t n = int64_t(b.tokens.size()), hd = info_.head_dim, nh = info_.n_head;
    // The joint projection holds, per head, hd query values then hd gate values.
    int32_t qg = g.matmul(g.input(a.wq_gate), h);  // [2 * hd * nh, n]
    const size_t f = sizeof(float);
    const std::array<size_t, 3> strides{2 * size_t(hd) * f, 2 * size_t(hd * nh) * f, 2 * size_t(hd * nh * n) * f};
    int32_t q = g.strided_copy(qg, {hd, nh, n, 1}, strides, 0);
    int32_t gate = g.strided_copy(qg, {hd, nh, n, 1}, strides, size_t(hd) * f);
    int32_t k = g.reshape(g.matmul(g.input(a.wk), h), {hd, info_.n_head_kv, n});
    int32_t v = g.reshape(g.matmul(g.input(a.wv), h), {hd, info_.n_head_kv, n});
    q = g.rms_norm(q, g.input(a.q_norm), info_.rms_eps);
    k = g.rms_norm(k, g.input(a.k_norm), info_.rms_eps);
    q = g.rope_multi(q, pos, int(info_.rope_dims), sections_, info_.rope_freq_base, info_.rope_freq_scale);
    k = g.rope_multi(k, pos, int(info_.rope_dims), sections_, info_.rope_freq_base, info_.rope_freq_scale);
    int32_t att = paged_attention(g, kv, L.cache_layer, b, q, k, v, 1.0f / std::sqrt(float(hd)));
    int32_t gated = g.mul(g.reshape(att, {hd * nh, n}), g.sigmoid(g.reshape(gate, {hd * nh, n})));
    return g.matmul(g.input(a.wo), gated);
  }

  // SwiGLU shared expert scaled by sigmoid(w . h), one gate value per token.
  int32_t shared_expert(GraphBuilder& g, const SharedExpertWeights& s, int32_t h) const {
    const int32_t gate = g.matmul(g.input(s.gate), h);  // in this order, whatever the compiler's
    const int32_t up = g.matmul(g.input(s.up), h);      // argument evaluation order
    int32_t y = g.matmul(g.input(s.down), g.swiglu(gate, up));
    return g.mul(y, g.sigmoid(g.matmul(g.input(s.gate_inp), h)));  // [n_embd, n] * [1, n]
  }

  int64_t n_ff_shexp_ = 0, d_conv_ = 0, head_dim_ssm_ = 0, n_k_heads_ = 0, n_v_heads_ = 0;
  std::array<int32_t, 4> sections_{};
  int n_attention_ = 0, n_recurrent_ = 0;
  EmbeddingWeights embd_;
  std::vector<Qwen35MoeLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_qwen35moe(const ModelDescription& d) { return std::make_unique<Qwen35MoeModel>(d); }

}  // namespace tessera::models
