#include "models/decoder_blocks.h"

#include <cmath>

#include "tessera/error.h"

namespace tessera::models {

void load_embedding(WeightSource& w, EmbeddingWeights& e, ModelInfo& info) {
  const TensorInfo* emb = w.find("token_embd.weight");
  if (!emb || emb->ne.size() != 2) throw Error("model is missing tensor 'token_embd.weight' (2-D)");
  info.n_vocab = emb->ne[1];
  const int64_t E = info.n_embd, V = info.n_vocab;
  w.load(e.tok_embd, "token_embd.weight", {E, V});
  w.load(e.output_norm, "output_norm.weight", {E});
  if (w.has("output.weight"))
    w.load(e.output, "output.weight", {E, V});
  else
    w.tie(e.output, e.tok_embd);
}

void load_attention(WeightSource& w, AttentionWeights& a, const std::string& p, const ModelInfo& info,
                    bool qk_norms, bool qkv_bias) {
  const int64_t E = info.n_embd, hd = info.head_dim;
  const int64_t Q = w.mul(info.n_head, hd, "attention.head_count x attention.key_length");
  const int64_t KV = w.mul(info.n_head_kv, hd, "attention.head_count_kv x attention.key_length");
  w.load(a.norm, p + "attn_norm.weight", {E});
  w.load(a.wq, p + "attn_q.weight", {E, Q});
  w.load(a.wk, p + "attn_k.weight", {E, KV});
  w.load(a.wv, p + "attn_v.weight", {E, KV});
  w.load(a.wo, p + "attn_output.weight", {Q, E});
  if (qk_norms) {
    w.load(a.q_norm, p + "attn_q_norm.weight", {hd});
    w.load(a.k_norm, p + "attn_k_norm.weight", {hd});
  }
  if (qkv_bias) {
    w.load_f32(a.bq, p + "attn_q.bias", {Q});
    w.load_f32(a.bk, p + "attn_k.bias", {KV});
    w.load_f32(a.bv, p + "attn_v.bias", {KV});
  }
}

void load_experts(WeightSource& w, ExpertWeights& e, const std::string& p, const ModelInfo& i) {
  const int64_t E = i.n_embd, F = i.n_ff, X = i.n_expert;
  w.load(e.router, p + "ffn_gate_inp.weight", {E, X});
  w.load(e.up_exps, p + "ffn_up_exps.weight", {E, F, X});
  w.load(e.gate_exps, p + "ffn_gate_exps.weight", {E, F, X});
  w.load(e.down_exps, p + "ffn_down_exps.weight", {F, E, X});
}

void load_ffn(WeightSource& w, FfnWeights& f, const std::string& p, const std::string& suffix, int64_t E,
              int64_t F) {
  w.load(f.gate, p + "ffn_gate" + suffix + ".weight", {E, F});
  w.load(f.up, p + "ffn_up" + suffix + ".weight", {E, F});
  w.load(f.down, p + "ffn_down" + suffix + ".weight", {F, E});
}

BatchInputs embed_batch(GraphBuilder& g, const EmbeddingWeights& e, const ForwardBatch& b) {
  const int64_t n = int64_t(b.tokens.size());
  int32_t ids = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.tokens.data())));
  int32_t pos = g.input(Tensor::contiguous(DType::I32, {n}, const_cast<int32_t*>(b.positions.data())));
  if (b.stage_input)  // the previous rank's output
    return {pos, g.input(Tensor::contiguous(DType::F32, {e.tok_embd.ne[0], n}, const_cast<float*>(b.stage_input)))};
  return {pos, g.get_rows(g.input(e.tok_embd), ids)};
}

int32_t paged_attention(GraphBuilder& g, KvCache& kv, int layer, const ForwardBatch& b, int32_t q, int32_t k,
                        int32_t v, float scale, int32_t window, int32_t sinks) {
  const PagedInputs& p = b.paged;
  if (int64_t(p.slots.size()) != int64_t(b.tokens.size()) || p.seqs <= 0 ||
      int64_t(p.seq_table.size()) != (kSeqTableHeader + p.pages) * p.seqs)
    throw Error("internal: the forward batch has no paged-attention inputs (make_paged_inputs)");
  // Every sequence of the step in one KvWrite per K and V and one Attention: the
  // tokens' slots and the sequences' block tables are inputs, not node parameters. A
  // sliding-window layer's pages are in the window pool, through its own table.
  const bool windowed = kv.windowed(layer);
  if (windowed && (window != kv.config().window || p.window_slots.size() != p.slots.size()))
    throw Error("internal: layer " + std::to_string(layer) + " keeps a window's KV, but its attention window or the "
                "step's window inputs do not match it");
  const std::span<const int32_t> slot_ids = windowed ? p.window_slots : p.slots;
  const std::span<const int32_t> table_ids = windowed ? p.window_seq_table : p.seq_table;
  const int32_t slots = g.input(Tensor::contiguous(DType::I32, {int64_t(slot_ids.size())}, const_cast<int32_t*>(slot_ids.data())));
  const int32_t table =
      g.input(Tensor::contiguous(DType::I32, {kSeqTableHeader + p.pages, p.seqs}, const_cast<int32_t*>(table_ids.data())));
  const int32_t ks = g.input(kv.k_storage(layer)), vs = g.input(kv.v_storage(layer));
  g.kv_write(ks, k, slots);
  if (v >= 0) g.kv_write(vs, v, slots);
  return g.attention(q, ks, vs, table, scale, window, sinks);
}

int32_t self_attention(GraphBuilder& g, const AttentionWeights& a, const ModelInfo& i, KvCache& kv, int layer,
                       const ForwardBatch& b, int32_t x, int32_t pos, int rope_mode, int32_t rope_factors) {
  AttentionSpec s;
  s.rope_mode = rope_mode;
  s.rope_base = i.rope_freq_base;
  s.rope_scale = i.rope_freq_scale;
  s.rope_factors = rope_factors;
  return self_attention(g, a, i, kv, layer, b, x, pos, s);
}

int32_t self_attention(GraphBuilder& g, const AttentionWeights& a, const ModelInfo& i, KvCache& kv, int layer,
                       const ForwardBatch& b, int32_t x, int32_t pos, const AttentionSpec& s) {
  const int64_t n = int64_t(b.tokens.size()), hd = i.head_dim;
  int32_t h = g.rms_norm(x, g.input(a.norm), i.rms_eps);
  // The three products adjacent (a backend may run them as one group), then the biases
  // if any (one row broadcast over the batch's rows).
  int32_t q = g.matmul(g.input(a.wq), h);
  int32_t k = g.matmul(g.input(a.wk), h);
  int32_t v = g.matmul(g.input(a.wv), h);
  if (a.bq.data) {
    q = g.add(q, g.input(a.bq));
    k = g.add(k, g.input(a.bk));
    v = g.add(v, g.input(a.bv));
  }
  q = g.reshape(q, {hd, i.n_head, n});
  k = g.reshape(k, {hd, i.n_head_kv, n});
  v = g.reshape(v, {hd, i.n_head_kv, n});
  if (a.q_norm.data) {
    q = g.rms_norm(q, g.input(a.q_norm), i.rms_eps);
    k = g.rms_norm(k, g.input(a.k_norm), i.rms_eps);
  }
  q = g.rope(q, pos, int(i.rope_dims), s.rope_mode, s.rope_base, s.rope_scale, s.rope_factors, s.yarn);
  k = g.rope(k, pos, int(i.rope_dims), s.rope_mode, s.rope_base, s.rope_scale, s.rope_factors, s.yarn);
  const float scale = s.scale > 0.f ? s.scale : 1.0f / std::sqrt(float(hd));
  int32_t att = paged_attention(g, kv, layer, b, q, k, v, scale, s.window, s.sinks);
  return g.matmul(g.input(a.wo), g.reshape(att, {hd * i.n_head, n}));
}

int32_t routed_experts(GraphBuilder& g, const ExpertWeights& e, const ModelInfo& i, int32_t h) {
  const int64_t n = g.graph().tensor(h).ne[1];
  int32_t logits = g.matmul(g.input(e.router), h);             // [n_expert, n]
  int32_t chosen = g.top_k(logits, i.n_expert_used);           // [k, n]
  int32_t weights = g.softmax(g.gather_cols(logits, chosen));  // [k, n]
  int32_t x3 = g.reshape(h, {i.n_embd, 1, n});
  int32_t up = g.mat_mul_id(g.input(e.up_exps), x3, chosen);  // [ff, k, n]
  int32_t gate = g.mat_mul_id(g.input(e.gate_exps), x3, chosen);
  int32_t down = g.mat_mul_id(g.input(e.down_exps), g.swiglu(gate, up), chosen);  // [embd, k, n]
  return g.moe_combine(down, weights);
}

int32_t gated_ffn(GraphBuilder& g, const FfnWeights& f, int32_t h, Glu act) {
  // gate's product first, then up's (one statement per node: the graph's order does not
  // depend on the compiler's argument evaluation order).
  const int32_t gate = g.matmul(g.input(f.gate), h);
  const int32_t up = g.matmul(g.input(f.up), h);
  const int32_t ff = act == Glu::Silu ? g.swiglu(gate, up) : g.geglu(gate, up);
  return g.matmul(g.input(f.down), ff);
}

int32_t routed_experts_scored(GraphBuilder& g, const ExpertWeights& e, const ScoredRouting& r, const ModelInfo& i,
                              int32_t h) {
  const int64_t n = g.graph().tensor(h).ne[1];
  const int32_t logits = g.matmul(g.input(e.router), h);  // [n_expert, n]
  const int32_t scores = r.score == RouterScore::Softmax ? g.softmax(logits) : g.sigmoid(logits);
  int32_t selection = r.correction_bias.data ? g.add(scores, g.input(r.correction_bias)) : scores;
  if (r.groups > 1) selection = g.group_limit(selection, r.groups, r.groups_kept);
  const int32_t chosen = g.top_k(selection, i.n_expert_used);  // [k, n]
  // Normalised: the reference's floor on the sum of the chosen weights (an F16
  // epsilon). Not normalised (softmax scores only): the chosen scores sum to at most 1,
  // so a floor of 1 leaves them as they are, times scale.
  const float min_sum = r.normalize ? 6.103515625e-5f : 1.0f;
  const int32_t weights = g.normalize_rows(g.gather_cols(scores, chosen), r.scale, min_sum);
  const int32_t x3 = g.reshape(h, {i.n_embd, 1, n});
  const int32_t up = g.mat_mul_id(g.input(e.up_exps), x3, chosen);  // [ff, k, n]
  const int32_t gate = g.mat_mul_id(g.input(e.gate_exps), x3, chosen);
  const int32_t down = g.mat_mul_id(g.input(e.down_exps), g.swiglu(gate, up), chosen);  // [embd, k, n]
  return g.moe_combine(down, weights);
}

int32_t output_logits(GraphBuilder& g, const EmbeddingWeights& e, const ModelInfo& i, int32_t x, const ForwardBatch& b) {
  if (b.stage_output) return x;  // a rank's part of the layers: every token's hidden state, for the next rank
  const int64_t n = int64_t(b.tokens.size());
  const auto& rows = b.output_rows;
  if (rows.empty()) {
    x = g.last_row(x);
  } else if (int64_t(rows.back()) - rows.front() + 1 == int64_t(rows.size())) {
    if (int64_t(rows.size()) != n) x = g.graph().view_rows(x, rows.front(), int64_t(rows.size()));  // consecutive rows
  } else {
    const int32_t ids = g.input(Tensor::contiguous(DType::I32, {int64_t(rows.size())}, const_cast<int32_t*>(rows.data())));
    x = g.get_rows(x, ids);
  }
  x = g.rms_norm(x, g.input(e.output_norm), i.rms_eps);
  if (b.hidden_output) return x;
  return g.matmul(g.input(e.output), x);
}

}  // namespace tessera::models
