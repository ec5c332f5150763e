// Pieces shared by the decoder architectures: the token embedding and output head,
// and the pre-normed grouped-query self-attention sublayer (optional per-head q/k
// RMS norms, RoPE, paged KV cache) — loading their weights and building their graph.
#pragma once
#include <string>
#include <vector>

#include "models/graph_builder.h"
#include "models/model_loader_util.h"
#include "tessera/model.h"

namespace tessera::models {

struct EmbeddingWeights {
  Tensor tok_embd, output_norm, output;  // output is tok_embd when the file ties them
};

// A routed mixture-of-experts feed-forward (SwiGLU experts).
struct ExpertWeights {
  Tensor router, up_exps, gate_exps, down_exps;
};

// A dense gated feed-forward: down(act(gate x) * up x).
struct FfnWeights {
  Tensor gate, up, down;
};
enum class Glu { Silu, GeluTanh };

// DeepSeek-style routing (deepseek2, glm4moe): each expert's score is the sigmoid of its
// router logit, or the softmax over all experts' logits; experts are chosen by score
// plus the correction bias, when there is one (among the experts of the groups_kept
// best of `groups` groups, when groups > 1), and weighted by their unbiased scores,
// normalised to sum 1 when `normalize`, times scale.
enum class RouterScore { Sigmoid, Softmax };
struct ScoredRouting {
  RouterScore score = RouterScore::Sigmoid;
  Tensor correction_bias;  // F32 [n_expert] (exp_probs_b), or empty
  float scale = 1.0f;
  bool normalize = true;  // false only with softmax scores (their chosen sum is at most 1)
  int64_t groups = 1, groups_kept = 1;
};

struct AttentionWeights {
  Tensor norm, wq, wk, wv, wo;
  Tensor q_norm, k_norm;  // empty unless the architecture has per-head q/k norms
  Tensor bq, bk, bv;      // empty unless the architecture adds biases to q, k and v
};

// The weights are loaded into `into` (WeightSource::load).
// token_embd.weight (its rows set info.n_vocab), output_norm.weight, output.weight.
void load_embedding(WeightSource& w, EmbeddingWeights& into, ModelInfo& info);
// blk.N.attn_{norm,q,k,v,output}.weight (and attn_{q,k}_norm.weight if qk_norms,
// attn_{q,k,v}.bias if qkv_bias).
void load_attention(WeightSource& w, AttentionWeights& into, const std::string& prefix, const ModelInfo& info,
                    bool qk_norms, bool qkv_bias = false);
// blk.N.ffn_gate_inp.weight and blk.N.ffn_{up,gate,down}_exps.weight (info.n_ff per expert).
void load_experts(WeightSource& w, ExpertWeights& into, const std::string& prefix, const ModelInfo& info);
// blk.N.ffn_{gate,up,down}<suffix>.weight of width n_ff ("" for a dense layer, "_shexp"
// for a shared expert).
void load_ffn(WeightSource& w, FfnWeights& into, const std::string& prefix, const std::string& suffix,
              int64_t n_embd, int64_t n_ff);

struct BatchInputs {
  int32_t pos;     // I32 [n] positions
  int32_t embd;    // F32 [n_embd, n] token embeddings
};
// The token embeddings, or b.stage_input when the step starts from a previous rank's output.
BatchInputs embed_batch(GraphBuilder& g, const EmbeddingWeights& e, const ForwardBatch& b);

// norm -> q/k/v (+ biases) -> (q/k norms) -> RoPE -> KV write -> attention -> wo; the
// caller adds the result to the residual. rope_factors: -1, or the graph tensor of the
// F32 [rope_dims / 2] frequency factors (Llama 3.1's rope_freqs.weight).
int32_t self_attention(GraphBuilder& g, const AttentionWeights& a, const ModelInfo& info, KvCache& kv, int layer,
                       const ForwardBatch& b, int32_t x, int32_t pos, int rope_mode, int32_t rope_factors = -1);

// The same with what varies per layer spelled out: RoPE base and scale, the attention
// scale (0: 1/sqrt(head_dim)) and a sliding window (0: none).
struct AttentionSpec {
  int rope_mode = kRopeNormal;
  float rope_base = 10000.f, rope_scale = 1.f;
  int32_t rope_factors = -1;
  float scale = 0.f;
  int32_t window = 0;
  RopeYarn yarn;
  int32_t sinks = -1;  // graph tensor of F32 [n_head] sink logits, or -1
};
int32_t self_attention(GraphBuilder& g, const AttentionWeights& a, const ModelInfo& info, KvCache& kv, int layer,
                       const ForwardBatch& b, int32_t x, int32_t pos, const AttentionSpec& spec);

// down(act(gate h) * up h) for normed input h [n_embd, n].
int32_t gated_ffn(GraphBuilder& g, const FfnWeights& f, int32_t h, Glu act = Glu::Silu);

// Routed experts with DeepSeek-style routing (ScoredRouting) for normed input h.
int32_t routed_experts_scored(GraphBuilder& g, const ExpertWeights& e, const ScoredRouting& r, const ModelInfo& info,
                              int32_t h);

// Routing and experts for normed input h [n_embd, n]: top-k on the raw router logits,
// softmax over the k chosen (llama.cpp's softmax over all experts renormalized to the
// chosen ones, with k exponentials instead of n_expert), SwiGLU experts, weighted sum.
int32_t routed_experts(GraphBuilder& g, const ExpertWeights& e, const ModelInfo& info, int32_t h);

// KV writes of k, v [hd, n_kv, n] and attention of q [hd, n_head, n] for every sequence
// of the batch at once (two KvWrite nodes and one Attention, over b.paged); returns the
// attention output [dv, n_head, n]. v = -1: the cache reads V out of K's rows
// (KvCacheConfig::v_in_k), so only k is written.
int32_t paged_attention(GraphBuilder& g, KvCache& kv, int layer, const ForwardBatch& b, int32_t q, int32_t k,
                        int32_t v, float scale, int32_t window = 0, int32_t sinks = -1);

// Final norm and output matrix for the batch's output rows (the last row by default);
// with b.hidden_output only the norm (the rows' final hidden states); with
// b.stage_output x itself (a rank's part of the layers ends there).
int32_t output_logits(GraphBuilder& g, const EmbeddingWeights& e, const ModelInfo& info, int32_t x,
                      const ForwardBatch& b);

}  // namespace tessera::models
