// The `deepseek2` architecture (DeepSeek-V3, DeepSeek-R1, Kimi-K2, DeepSeek-V2 and
// their GGUF conversions with separate attn_k_b / attn_v_b tensors): multi-head latent
// attention, leading dense layers, then mixture-of-experts layers with shared experts;
// routing by sigmoid scores in expert groups (V3 and its descendants) or by softmax
// scores (V2).
//
// Latent attention, absorbed: each token caches one row per layer, its normed KV
// latent (kv_lora_rank values) followed by its roped key part (rope dims), shared by
// every head. A head's query is its non-roped part carried into latent space by
// attn_k_b, followed by its roped part; attention over the cache is then
// multi-query attention with keys of kv_lora_rank + rope values and values that are the
// latent (the leading kv_lora_rank values of the same rows), and attn_v_b carries each
// head's result out of latent space. The cache holds kv_lora_rank + rope values per
// token and layer, not heads x (key + value).
#include <cmath>
#include <mutex>

#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

struct LatentAttentionWeights {
  Tensor norm;
  Tensor wq;              // without a query latent (q_lora_rank 0)
  Tensor wq_a, q_a_norm, wq_b;  // with one
  Tensor wkv_a, kv_a_norm;      // x -> latent + roped key part; the latent's norm
  Tensor k_b, v_b;              // per head: nope -> latent, latent -> value
  Tensor wo;
};

struct Deepseek2Layer {
  LatentAttentionWeights attn;
  Tensor ffn_norm;
  FfnWeights dense;       // leading dense layers
  ExpertWeights experts;  // the others
  ScoredRouting routing;
  FfnWeights shared;
};

class Deepseek2Model final : public Model {
 public:
  explicit Deepseek2Model(const ModelDescription& desc) {
    WeightSource w(desc, weights_);
    ModelInfo& i = info_;
    // key_length / value_length are the cached row's sizes (latent + rope, latent).
    read_decoder_hparams(w, i, {163840, 1e-6f, 10000.f, /*own_value_length=*/true});
    if (i.n_head_kv != 1)
      w.refuse("attention.head_count_kv", std::to_string(i.n_head_kv),
               "must be 1 (the latent-attention conversion; files with attn_kv_b are not supported)");
    kv_lora_ = w.hp_size("attention.kv_lora_rank");
    q_lora_ = w.hp_int("attention.q_lora_rank", 0);
    if (q_lora_ < 0) w.refuse("attention.q_lora_rank", std::to_string(q_lora_), "must be >= 0");
    rope_ = i.rope_dims;
    if (i.head_dim != kv_lora_ + rope_)
      w.refuse("attention.key_length", std::to_string(i.head_dim),
               "must be kv_lora_rank + rope.dimension_count = " + std::to_string(kv_lora_ + rope_));
    if (const int64_t vl = w.hp_int("attention.value_length", kv_lora_); vl != kv_lora_)
      w.refuse("attention.value_length", std::to_string(vl), "must be kv_lora_rank " + std::to_string(kv_lora_));
    const int64_t head_k = w.hp_size("attention.key_length_mla");
    if (head_k <= rope_)
      w.refuse("attention.key_length_mla", std::to_string(head_k),
               "must exceed rope.dimension_count " + std::to_string(rope_));
    nope_ = head_k - rope_;
    head_v_ = w.hp_size("attention.value_length_mla");
    n_dense_ = w.hp_int("leading_dense_block_count", 0);
    if (n_dense_ < 0 || n_dense_ > i.n_layer)
      w.refuse("leading_dense_block_count", std::to_string(n_dense_), "must be 0 .. block_count");
    if (const int64_t nextn = w.hp_int("nextn_predict_layers", 0); nextn != 0)
      w.refuse("nextn_predict_layers", std::to_string(nextn), "multi-token prediction layers are not supported yet");
    const bool moe = n_dense_ < i.n_layer;
    const int64_t n_ff_dense = w.hp_size("feed_forward_length");
    int64_t n_shared = 0;
    float routed_scale = 1.f;
    ExpertGroups groups;
    RouterScore score = RouterScore::Sigmoid;
    bool normalize = true;
    if (moe) {
      read_expert_hparams(w, i);
      n_shared = w.hp_int("expert_shared_count", 0);
      if (n_shared < 0 || n_shared > 64)
        w.refuse("expert_shared_count", std::to_string(n_shared), "must be 0 .. 64");
      // llama.cpp's values: 1 softmax (the default: DeepSeek-V2's files predate the
      // key), 2 sigmoid.
      const int64_t gating = w.hp_int("expert_gating_func", 1);
      if (gating != 1 && gating != 2)
        w.refuse("expert_gating_func", std::to_string(gating), "must be 1 (softmax, DeepSeek-V2) or 2 (sigmoid, DeepSeek-V3)");
      score = gating == 1 ? RouterScore::Softmax : RouterScore::Sigmoid;
      // V2 leaves its weights as they are (norm_topk_prob false); V3 normalises them.
      normalize = w.hp_bool("expert_weights_norm").value_or(false);
      if (!normalize && score == RouterScore::Sigmoid)
        w.refuse("expert_weights_norm", "false", "un-normalised sigmoid routing weights are not supported");
      routed_scale = w.hp_positive_float("expert_weights_scale", 1.f);
      groups = read_expert_groups(w, i);
      // V2's group-limited greedy routing ranks a group by its best expert, not by the
      // sum of its two best as GroupLimit does for V3.
      if (score == RouterScore::Softmax && groups.groups > 1)
        w.refuse("expert_group_count", std::to_string(groups.groups),
                 "with softmax routing (DeepSeek-V2's group-limited greedy choice) is not supported yet");
    }

    // YaRN as the reference applies it to this family: the rotation keeps unit
    // magnitude, and the magnitude correction goes into the attention scale, squared.
    yarn_ = read_rope_scaling(w, i);
    float attn_factor = 1.f;
    if (yarn_.ext_factor != 0.f) {
      const float factor = 1.f / i.rope_freq_scale;
      const float log_mul = w.hp_has("rope.scaling.yarn_log_multiplier")
                                ? w.hp_positive_float("rope.scaling.yarn_log_multiplier", 1.f) / 0.1f
                                : 0.f;
      const float unscaled = factor <= 1.f ? 1.f : 1.f + 0.1f * std::log(factor);
      yarn_.attn_factor = log_mul != 0.f ? 1.f / unscaled : 1.f;
      attn_factor = (log_mul != 0.f ? 1.f : unscaled) * (1.f + 0.1f * log_mul * std::log(factor));
    }
    scale_ = attn_factor * attn_factor / std::sqrt(float(head_k));

    load_embedding(w, embd_, i);
    const int64_t E = i.n_embd, H = i.n_head, qk = nope_ + rope_;
    layers_.resize(size_t(i.n_layer));
    for (int64_t l = 0; l < i.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Deepseek2Layer& L = layers_[size_t(l)];
      LatentAttentionWeights& a = L.attn;
      w.load(a.norm, p + "attn_norm.weight", {E});
      if (q_lora_ > 0) {
        w.load(a.wq_a, p + "attn_q_a.weight", {E, q_lora_});
        w.load(a.q_a_norm, p + "attn_q_a_norm.weight", {q_lora_});
        w.load(a.wq_b, p + "attn_q_b.weight", {q_lora_, w.mul(H, qk, "head_count x key_length_mla")});
      } else {
        w.load(a.wq, p + "attn_q.weight", {E, w.mul(H, qk, "head_count x key_length_mla")});
      }
      w.load(a.wkv_a, p + "attn_kv_a_mqa.weight", {E, kv_lora_ + rope_});
      w.load(a.kv_a_norm, p + "attn_kv_a_norm.weight", {kv_lora_});
      w.load(a.k_b, p + "attn_k_b.weight", {nope_, kv_lora_, H});
      w.load(a.v_b, p + "attn_v_b.weight", {kv_lora_, head_v_, H});
      w.load(a.wo, p + "attn_output.weight", {w.mul(H, head_v_, "head_count x value_length_mla"), E});
      w.load(L.ffn_norm, p + "ffn_norm.weight", {E});
      if (l < n_dense_) {
        load_ffn(w, L.dense, p, "", E, n_ff_dense);
        continue;
      }
      load_experts(w, L.experts, p, i);
      L.routing.score = score;
      // V3's selection bias; V2 has none.
      if (score == RouterScore::Sigmoid || w.has(p + "exp_probs_b.bias"))
        w.load_f32(L.routing.correction_bias, p + "exp_probs_b.bias", {i.n_expert});
      L.routing.scale = routed_scale;
      L.routing.normalize = normalize;
      L.routing.groups = groups.groups;
      L.routing.groups_kept = groups.kept;
      if (n_shared > 0) load_ffn(w, L.shared, p, "_shexp", E, w.mul(n_shared, i.n_ff, "expert_shared_count x n_ff"));
    }
  }

  // One cached row per token and layer: the latent, then the roped key part; V is the
  // latent read out of the same row.
  KvCacheConfig kv_config(int64_t n_ctx, int page_tokens) const override {
    KvCacheConfig c = paged_kv_config(info_, n_ctx, page_tokens);
    c.v_in_k = int(kv_lora_);
    return c;
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const Deepseek2Layer& L = layers_[size_t(l)];
      x = g.add(x, latent_attention(g, L.attn, kv, int(l), b, x, pos));
      const int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      if (l < n_dense_) {
        x = g.add(x, gated_ffn(g, L.dense, h));
        continue;
      }
      int32_t ff = routed_experts_scored(g, L.experts, L.routing, info_, h);
      if (L.shared.gate.data) ff = g.add(ff, gated_ffn(g, L.shared, h));
      x = g.add(x, ff);
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  int32_t latent_attention(GraphBuilder& g, const LatentAttentionWeights& a, KvCache& kv, int layer,
                           const ForwardBatch& b, int32_t x, int32_t pos) const {
    const int64_t n = int64_t(b.tokens.size()), H = info_.n_head, qk = nope_ + rope_;
    const int32_t h = g.rms_norm(x, g.input(a.norm), info_.rms_eps);
    int32_t q;
    if (q_lora_ > 0) {
      q = g.rms_norm(g.matmul(g.input(a.wq_a), h), g.input(a.q_a_norm), info_.rms_eps);
      q = g.matmul(g.input(a.wq_b), q);
    } else {
      q = g.matmul(g.input(a.wq), h);
    }
    q = g.reshape(q, {qk, H, n});
    const int32_t kv_a = g.matmul(g.input(a.wkv_a), h);  // [kv_lora + rope, n]
    const size_t f = sizeof(float);
    const int32_t q_nope = g.strided_copy(q, {nope_, H, n, 1}, {qk * f, qk * H * f, qk * H * n * f}, 0);
    const int32_t q_pe = g.strided_copy(q, {rope_, H, n, 1}, {qk * f, qk * H * f, qk * H * n * f}, size_t(nope_) * f);
    const size_t row = size_t(kv_lora_ + rope_) * f;
    const int32_t latent = g.strided_copy(kv_a, {kv_lora_, n, 1, 1}, {row, row * n, row * n}, 0);
    const int32_t k_pe = g.strided_copy(kv_a, {rope_, 1, n, 1}, {row, row, row * n}, size_t(kv_lora_) * f);
    const int32_t q_rot = g.rope(q_pe, pos, int(rope_), kRopeNormal, info_.rope_freq_base, info_.rope_freq_scale, -1, yarn_);
    const int32_t k_rot = g.rope(k_pe, pos, int(rope_), kRopeNormal, info_.rope_freq_base, info_.rope_freq_scale, -1, yarn_);
    const int32_t latent_normed = g.rms_norm(latent, g.input(a.kv_a_norm), info_.rms_eps);

    // Each head's non-roped query carried into latent space: one product per head (the
    // heads as the "experts" of a MatMulId whose token t picks expert j for row j).
    const int32_t heads = g.input(Tensor::contiguous(DType::I32, {H, n}, head_ids(H, n)));
    const int32_t q_latent = g.mat_mul_id(g.input(a.k_b), q_nope, heads);  // [kv_lora, H, n]
    const int32_t q_full = g.concat(q_latent, q_rot);                        // [kv_lora + rope, H, n]
    const int32_t k_row = g.concat(g.reshape(latent_normed, {kv_lora_, 1, n}), k_rot);  // [kv_lora + rope, 1, n]

    const int32_t att = paged_attention(g, kv, layer, b, q_full, k_row, /*v=*/-1, scale_);  // [kv_lora, H, n]
    const int32_t out = g.mat_mul_id(g.input(a.v_b), att, heads);              // [head_v, H, n]
    return g.matmul(g.input(a.wo), g.reshape(out, {head_v_ * H, n}));
  }

  // I32 [H, n] with row j of every column = j, valid until the next call with a larger
  // n (graphs are built and run one at a time).
  int32_t* head_ids(int64_t H, int64_t n) const {
    std::lock_guard lock(ids_mutex_);
    if (int64_t(head_ids_.size()) < H * n) {
      head_ids_.resize(size_t(H * n));
      for (size_t k = 0; k < head_ids_.size(); ++k) head_ids_[k] = int32_t(int64_t(k) % H);
    }
    return head_ids_.data();
  }

  int64_t kv_lora_ = 0, q_lora_ = 0, rope_ = 0, nope_ = 0, head_v_ = 0, n_dense_ = 0;
  float scale_ = 1.f;
  RopeYarn yarn_;
  EmbeddingWeights embd_;
  std::vector<Deepseek2Layer> layers_;
  mutable std::mutex ids_mutex_;
  mutable std::vector<int32_t> head_ids_;
};

}  // namespace

std::unique_ptr<Model> make_deepseek2(const ModelDescription& d) { return std::make_unique<Deepseek2Model>(d); }

}  // namespace tessera::models
