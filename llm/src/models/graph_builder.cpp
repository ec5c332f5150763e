#include "models/graph_builder.h"

#include "tessera/error.h"

namespace tessera::models {

int32_t GraphBuilder::same_shape_f32(int32_t like) {
  const Tensor& t = g_.tensor(like);
  return g_.new_tensor(DType::F32, {t.ne[0], t.ne[1], t.ne[2], t.ne[3]});
}

int32_t GraphBuilder::node(Op op, int32_t dst, std::initializer_list<int32_t> src) {
  Node n;
  n.op = op;
  n.dst = dst;
  size_t i = 0;
  for (int32_t s : src) n.src[i++] = s;
  g_.add_node(n);
  return dst;
}

int32_t GraphBuilder::get_rows(int32_t table, int32_t ids) {
  int32_t dst = g_.new_tensor(DType::F32, {g_.tensor(table).ne[0], g_.tensor(ids).ne[0]});
  return node(Op::GetRows, dst, {table, ids});
}

int32_t GraphBuilder::rms_norm(int32_t x, int32_t weight, float eps) {
  Node n;
  n.op = Op::RmsNorm;
  n.dst = same_shape_f32(x);
  n.src = {x, weight, -1, -1, -1};
  n.f[0] = eps;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::matmul(int32_t weight, int32_t x) {
  int32_t dst = g_.new_tensor(DType::F32, {g_.tensor(weight).ne[1], g_.tensor(x).ne[1]});
  return node(Op::MatMul, dst, {weight, x});
}

int32_t GraphBuilder::rope(int32_t x, int32_t pos, int n_dims, int mode, float base, float scale, int32_t factors,
                          const RopeYarn& yarn) {
  Node n;
  n.op = Op::Rope;
  n.dst = same_shape_f32(x);
  n.src = {x, pos, factors, -1, -1};
  n.i[0] = n_dims;
  n.i[1] = mode;
  n.f[0] = base;
  n.f[1] = scale;
  if (yarn.ext_factor != 0.f) {
    n.f[2] = yarn.ext_factor;
    n.f[3] = yarn.attn_factor;
    n.i[6] = yarn.corr_dims[0];
    n.i[7] = yarn.corr_dims[1];
  }
  g_.add_node(n);
  return n.dst;
}

void GraphBuilder::kv_write(int32_t storage, int32_t x, int32_t slots) { node(Op::KvWrite, storage, {x, slots}); }

int32_t GraphBuilder::attention(int32_t q, int32_t k_storage, int32_t v_storage, int32_t seq_table, float scale,
                                int32_t window, int32_t sinks) {
  Node n;
  n.op = Op::Attention;
  // Value heads as wide as V's rows hold per KV head (the key heads' size but in latent
  // attention, whose V is the leading part of each K row).
  const Tensor &qt = g_.tensor(q), &kt = g_.tensor(k_storage), &vt = g_.tensor(v_storage);
  const int64_t dv = qt.ne[0] * vt.ne[0] / kt.ne[0];
  n.dst = vt.ne[0] == kt.ne[0] ? same_shape_f32(q) : g_.new_tensor(DType::F32, {dv, qt.ne[1], qt.ne[2]});
  n.src = {q, k_storage, v_storage, seq_table, sinks};
  n.f[0] = scale;
  n.i[0] = window;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::swiglu(int32_t gate, int32_t up) { return node(Op::SwiGlu, same_shape_f32(gate), {gate, up}); }

int32_t GraphBuilder::geglu(int32_t gate, int32_t up) { return node(Op::GeGlu, same_shape_f32(gate), {gate, up}); }

int32_t GraphBuilder::swiglu_oai(int32_t gate, int32_t up, float alpha, float limit) {
  Node n;
  n.op = Op::SwiGluOai;
  n.dst = same_shape_f32(gate);
  n.src = {gate, up, -1, -1, -1};
  n.f[0] = alpha;
  n.f[1] = limit;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::normalize_rows(int32_t x, float scale, float min_sum) {
  Node n;
  n.op = Op::NormalizeRows;
  n.dst = same_shape_f32(x);
  n.src = {x, -1, -1, -1, -1};
  n.f[0] = scale;
  n.f[1] = min_sum;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::concat(int32_t a, int32_t b) {
  const Tensor &x = g_.tensor(a), &y = g_.tensor(b);
  return node(Op::Concat, g_.new_tensor(DType::F32, {x.ne[0] + y.ne[0], x.ne[1], x.ne[2]}), {a, b});
}

int32_t GraphBuilder::group_limit(int32_t x, int64_t groups, int64_t kept) {
  Node n;
  n.op = Op::GroupLimit;
  n.dst = same_shape_f32(x);
  n.src = {x, -1, -1, -1, -1};
  n.i[0] = int32_t(groups);
  n.i[1] = int32_t(kept);
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::add(int32_t a, int32_t b) { return node(Op::Add, same_shape_f32(a), {a, b}); }

int32_t GraphBuilder::softmax(int32_t x) { return node(Op::Softmax, same_shape_f32(x), {x}); }

int32_t GraphBuilder::top_k(int32_t x, int64_t k) {
  return node(Op::TopK, g_.new_tensor(DType::I32, {k, g_.tensor(x).ne[1]}), {x});
}

int32_t GraphBuilder::gather_cols(int32_t x, int32_t ids) {
  const Tensor& i = g_.tensor(ids);
  return node(Op::GatherCols, g_.new_tensor(DType::F32, {i.ne[0], i.ne[1]}), {x, ids});
}

int32_t GraphBuilder::mat_mul_id(int32_t weights, int32_t x, int32_t ids) {
  const Tensor& i = g_.tensor(ids);
  return node(Op::MatMulId, g_.new_tensor(DType::F32, {g_.tensor(weights).ne[1], i.ne[0], i.ne[1]}), {weights, x, ids});
}

int32_t GraphBuilder::moe_combine(int32_t experts, int32_t weights) {
  const Tensor& e = g_.tensor(experts);
  return node(Op::MoeCombine, g_.new_tensor(DType::F32, {e.ne[0], e.ne[2]}), {experts, weights});
}

int32_t GraphBuilder::mul(int32_t a, int32_t b) { return node(Op::Mul, same_shape_f32(a), {a, b}); }

int32_t GraphBuilder::silu(int32_t x) { return node(Op::Silu, same_shape_f32(x), {x}); }

int32_t GraphBuilder::sigmoid(int32_t x) { return node(Op::Sigmoid, same_shape_f32(x), {x}); }

int32_t GraphBuilder::softplus(int32_t x) { return node(Op::Softplus, same_shape_f32(x), {x}); }

int32_t GraphBuilder::strided_copy(int32_t x, std::array<int64_t, 4> ne, std::array<size_t, 3> nb, size_t offset) {
  int32_t v = g_.view(x, ne, nb, offset);
  return node(Op::Cont, g_.new_tensor(DType::F32, {ne[0], ne[1], ne[2], ne[3]}), {v});
}

int32_t GraphBuilder::rope_multi(int32_t x, int32_t pos, int n_dims, const std::array<int32_t, 4>& sections,
                                 float base, float scale) {
  Node n;
  n.op = Op::Rope;
  n.dst = same_shape_f32(x);
  n.src = {x, pos, -1, -1, -1};
  n.i = {n_dims, kRopeImrope, sections[0], sections[1], sections[2], sections[3], 0, 0};
  n.f[0] = base;
  n.f[1] = scale;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::ssm_conv(KvCache& kv, int layer, int32_t seq, int32_t x, int32_t kernel, int32_t dst) {
  Node n;
  n.op = Op::SsmConv;
  n.dst = dst >= 0 ? dst : same_shape_f32(x);
  n.src = {x, kernel, -1, -1, -1};
  n.i[0] = layer;
  n.i[1] = seq;
  n.kv = &kv;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::gated_delta_net(KvCache& kv, int layer, int32_t seq, int32_t qkv, int32_t g, int32_t beta,
                                      int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim, float eps, int32_t dst) {
  Node n;
  n.op = Op::GatedDeltaNet;
  n.dst = dst >= 0 ? dst : g_.new_tensor(DType::F32, {head_dim, n_v_heads, g_.tensor(qkv).ne[1]});
  n.src = {qkv, g, beta, -1, -1};
  n.i[0] = layer;
  n.i[1] = seq;
  n.i[2] = int32_t(n_k_heads);
  n.i[3] = int32_t(head_dim);
  n.f[0] = eps;
  n.kv = &kv;
  g_.add_node(n);
  return n.dst;
}

int32_t GraphBuilder::token_rows(int32_t x, int64_t first, int64_t count) {
  const Tensor& t = g_.tensor(x);
  if (t.ne[2] == 1 && t.ne[3] == 1) return g_.view_rows(x, first, count);
  const int64_t a = t.ne[0], b = t.ne[1];
  if (t.ne[3] != 1) throw Error("token_rows: 4-D tensor");
  const int32_t rows = g_.view_rows(g_.reshape(x, {a * b, t.ne[2]}), first, count);
  return g_.reshape(rows, {a, b, count});
}

}  // namespace tessera::models
