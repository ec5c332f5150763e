// Thin helpers that append one node and its output tensor to a Graph, so an
// architecture's forward pass reads like the math.
#pragma once
#include <array>

#include "tessera/graph.h"
#include "tessera/kv_cache.h"

namespace tessera::models {

// YaRN RoPE's parameters (rope_table.h): off while ext_factor is 0.
struct RopeYarn {
  float ext_factor = 0.f, attn_factor = 1.f;
  int32_t corr_dims[2] = {0, 0};
};

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  int32_t input(const Tensor& t) { return g_.add_tensor(t); }
  int32_t get_rows(int32_t table, int32_t ids);
  int32_t rms_norm(int32_t x, int32_t weight, float eps);
  int32_t matmul(int32_t weight, int32_t x);
  // factors: -1, or F32 [n_dims / 2] frequency factors (each pair's angle divided by its factor).
  int32_t rope(int32_t x, int32_t pos, int n_dims, int mode, float base, float scale, int32_t factors = -1,
               const RopeYarn& yarn = {});
  // x [hd, n_kv, n] into rows `slots` (I32 [n]) of a KV storage tensor.
  void kv_write(int32_t storage, int32_t x, int32_t slots);
  // Causal attention of q [hd, n_head, n] over the K/V storage through the sequence table
  // -> [dv, n_head, n] (dv: V's values per KV head);
  // window > 0: each token sees only itself and the window - 1 positions before it.
  // sinks: -1, or F32 [n_head] per-head logits joining each softmax (gpt-oss).
  int32_t attention(int32_t q, int32_t k_storage, int32_t v_storage, int32_t seq_table, float scale,
                    int32_t window = 0, int32_t sinks = -1);
  int32_t swiglu(int32_t gate, int32_t up);
  int32_t geglu(int32_t gate, int32_t up);
  int32_t swiglu_oai(int32_t gate, int32_t up, float alpha, float limit);
  // Rows of a [p, r1, r2] followed by the rows of b [q, r1, r2].
  int32_t concat(int32_t a, int32_t b);
  // x [E, n] with every group of E / groups values outside the `kept` best groups (by
  // the sum of their two largest values) set to -infinity.
  int32_t group_limit(int32_t x, int64_t groups, int64_t kept);
  // Each row divided by max(its sum, min_sum), times scale.
  int32_t normalize_rows(int32_t x, float scale, float min_sum);
  int32_t add(int32_t a, int32_t b);
  int32_t softmax(int32_t x);
  int32_t top_k(int32_t x, int64_t k);
  int32_t gather_cols(int32_t x, int32_t ids);
  int32_t mat_mul_id(int32_t weights, int32_t x, int32_t ids);
  int32_t moe_combine(int32_t experts, int32_t weights);
  int32_t mul(int32_t a, int32_t b);
  int32_t silu(int32_t x);
  int32_t sigmoid(int32_t x);
  int32_t softplus(int32_t x);
  // A contiguous copy of the strided view of x (shape ne, byte strides nb[1..3], offset bytes).
  int32_t strided_copy(int32_t x, std::array<int64_t, 4> ne, std::array<size_t, 3> nb, size_t offset);
  int32_t rope_multi(int32_t x, int32_t pos, int n_dims, const std::array<int32_t, 4>& sections, float base,
                     float scale);
  int32_t ssm_conv(KvCache& kv, int layer, int32_t seq, int32_t x, int32_t kernel, int32_t dst = -1);
  int32_t gated_delta_net(KvCache& kv, int layer, int32_t seq, int32_t qkv, int32_t g, int32_t beta, int64_t n_k_heads,
                          int64_t n_v_heads, int64_t head_dim, float eps, int32_t dst = -1);
  int32_t reshape(int32_t x, std::initializer_list<int64_t> shape) { return g_.reshape(x, shape); }
  int32_t last_row(int32_t x) { return g_.view_rows(x, g_.tensor(x).ne[1] - 1, 1); }
  // Token rows [first, first + count) of x [a, n] or [a, b, n] (contiguous), sharing its storage.
  int32_t token_rows(int32_t x, int64_t first, int64_t count);
  // A new F32 tensor of x's shape.
  int32_t same_shape_f32(int32_t like);

 private:
  int32_t node(Op op, int32_t dst, std::initializer_list<int32_t> src);
  Graph& g_;
};

}  // namespace tessera::models
