// The cpu_scalar backend: reference implementation of every op in graph.h.
//
// Arithmetic conventions (those of llama.cpp's CPU backend, see the shared fixtures
// README), op by op:
//  - GetRows:   quant::dequantize_row of the selected table row.
//  - RmsNorm:   sum of float squares accumulated in double, mean and scale in float
//               (scale = 1/sqrtf(mean + eps)), y = x * scale, then y * weight.
//  - MatMul:    each activation column converted once to quant::vec_dot_type(weight)
//               (F32 as is; F16/BF16 rounding; Q8_0/Q8_1/Q8_K blocks), then quant::vec_dot
//               per weight row.
//  - Rope:      ggml's cache: theta starts at p and is multiplied by
//               theta_scale = powf(base, -2/n_dims) per pair; angle = freq_scale*theta
//               (freq_scale*(theta/ff[i]) with src2's frequency factors ff).
//  - KvWrite:   F32 -> F16 (round to nearest even).
//  - Attention: q rounded to F16, score = scale * (F32 sum of f16(q)*K), online
//               ("flash") softmax in F32, the V (F16) weighted sum kept in F16 (llama.cpp).
//  - Softmax:   max in float, exp in float, sum in double, scale = 1/sum.
//  - Silu:      x / (1 + expf(-x)); SwiGlu: silu(gate) * up.
//  - GeGlu:     gelu(gate) * up, gelu from llama.cpp's F16 table: 0 below -10, x above 10,
//               else f16(0.5 x (1 + tanhf(sqrt(2/pi) x (1 + 0.044715 x^2)))) of x rounded to F16.
//  - NormalizeRows: row sum in double, rounded to float, max(sum, f[1]); x / sum * f[0].
//  - SwiGluOai: g = min(gate, limit), u = clamp(up, -limit, limit), g / (1 + expf(alpha (-g))) * (u + 1).
//  - Attention sinks: after the positions, the sink joins the online softmax in F32 (the
//    F16 sum converted to F32 first), as a score with no value.
//  - Argmax:    first maximum.
//  - Concat:    copies.
//  - GroupLimit: group score = largest + second largest in float; kept groups by score,
//    lower group first on equal scores; the others' values -infinity.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cpu_scalar_backend.h"
#include "tessera/error.h"
#include "tessera/group_limit.h"
#include "tessera/paged_rows.h"
#include "tessera/pool_ref.h"
#include "tessera/rope_table.h"
#include "tessera/graph.h"
#include "tessera/kv_access.h"
#include "tessera/op_schema.h"
#include "tessera/range_backend.h"
#include "tessera/quant.h"

namespace tessera::cpu_scalar {
namespace {

// ---------------------------------------------------------------------------
// Helpers

// Row r (flattened over dims 1..3) of a tensor.
inline char* row_ptr(const Tensor& t, int64_t r) { return t.flat_row<char>(r); }
inline float* frow(const Tensor& t, int64_t r) { return t.flat_row<float>(r); }

// Row of b that broadcasts onto row r of a (can_repeat(b, a) holds).
inline const float* bcast_row(const Tensor& b, const Tensor& a, int64_t r) {
  const int64_t i1 = r % a.ne[1];
  const int64_t i2 = (r / a.ne[1]) % a.ne[2];
  const int64_t i3 = r / (a.ne[1] * a.ne[2]);
  return reinterpret_cast<const float*>(static_cast<const char*>(b.data) + (i1 % b.ne[1]) * int64_t(b.nb[1]) +
                                        (i2 % b.ne[2]) * int64_t(b.nb[2]) + (i3 % b.ne[3]) * int64_t(b.nb[3]));
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// ---------------------------------------------------------------------------
// The backend

class CpuScalarBackend final : public RangeBackend {
 public:
  explicit CpuScalarBackend(PoolRef pool) : pool_(pool) {}

  std::string name() const override { return "cpu_scalar"; }

  // Every node the op schema accepts: the reference computes every op. (Answering
  // with the schema itself keeps it safe to ask about any node, as conformance does.)
  OpSupport supports(const Graph& graph, const Node& node) const override {
    std::string why = op_schema::check(graph, node);
    if (why.empty()) return OpSupport::yes();
    return OpSupport::no(std::move(why));
  }

 private:
  void run_range(Graph& graph, size_t first, size_t count) override {
    const auto& nodes = graph.nodes();
    for (size_t k = first; k < first + count; ++k) {
      try {
        run_node(graph, nodes[k]);
      } catch (const Error& e) {
        fail(graph, k, e.what());
      }
    }
  }

  [[noreturn]] static void fail(const Graph& g, size_t k, const std::string& why) {
    throw Error("cpu_scalar: " + describe_node(g, k) + ": " + why);
  }

  template <typename F>
  void parallel_for(int64_t n, F&& f) {
    if (pool_ && pool_.executor_count() > 1 && n > 1) {
      auto fn = f;  // PoolRef::parallel_for takes its functor by value type (an rvalue)
      pool_.parallel_for(n, std::move(fn));
    }
    else if (n > 0)
      f(int64_t(0), n);
  }

  void run_node(Graph& g, const Node& n) {
    switch (n.op) {
      case Op::GetRows: return get_rows(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::RmsNorm:
        return rms_norm(g.tensor(n.src[0]), n.src[1] >= 0 ? &g.tensor(n.src[1]) : nullptr, g.tensor(n.dst), n.f[0]);
      case Op::MatMul: return mat_mul(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::Rope:
        return rope(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n,
                    n.src[2] >= 0 ? static_cast<const float*>(g.tensor(n.src[2]).data) : nullptr);
      case Op::KvWrite: return kv_write(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::Attention:
        return attention(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.src[3]),
                         g.tensor(n.dst), n.f[0], n.i[0],
                         n.src[4] >= 0 ? static_cast<const float*>(g.tensor(n.src[4]).data) : nullptr);
      case Op::Softmax: return softmax(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::Silu: return silu_op(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::SwiGlu: return swiglu(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::GeGlu: return geglu(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::NormalizeRows: return normalize_rows(g.tensor(n.src[0]), g.tensor(n.dst), n.f[0], n.f[1]);
      case Op::SwiGluOai:
        return swiglu_oai(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n.f[0], n.f[1]);
      case Op::Concat: return concat(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::GroupLimit: return group_limit(g.tensor(n.src[0]), g.tensor(n.dst), n.i[0], n.i[1]);
      case Op::Add: return binary(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), false);
      case Op::Mul: return binary(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), true);
      case Op::Argmax: return argmax(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::TopK: return top_k(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::GatherCols: return gather_cols(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::MatMulId:
        return mat_mul_id(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.dst), n.i[0], n.i[1]);
      case Op::MoeCombine: return moe_combine(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::Sigmoid: return map_rows(g.tensor(n.src[0]), g.tensor(n.dst), [](float x) { return 1.0f / (1.0f + std::exp(-x)); });
      case Op::Softplus:
        return map_rows(g.tensor(n.src[0]), g.tensor(n.dst), [](float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); });
      case Op::Cont: return cont(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::SsmConv: return ssm_conv(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n);
      case Op::GatedDeltaNet:
        return gated_delta_net(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.dst), n);
      case Op::Count: break;
    }
    throw Error("unknown op");
  }

  // --- GetRows -------------------------------------------------------------
  static void get_rows(const Tensor& tab, const Tensor& ids, const Tensor& dst) {
    const int64_t K = tab.ne[0], V = tab.ne[1], n = ids.ne[0];
    const int32_t* id = static_cast<const int32_t*>(ids.data);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = id[i];
      if (r < 0 || r >= V)
        throw Error("row id " + std::to_string(r) + " (ids[" + std::to_string(i) + "]) out of range [0, " +
                    std::to_string(V) + ") of table " + op_schema::tensor_desc(tab));
      quant::dequantize_row(tab.type, static_cast<const char*>(tab.data) + r * int64_t(tab.nb[1]), frow(dst, i), K);
    }
  }

  // --- RmsNorm -------------------------------------------------------------
  static void rms_norm(const Tensor& x, const Tensor* w, const Tensor& dst, float eps) {
    const int64_t K = x.ne[0];
    const float* wp = w ? static_cast<const float*>(w->data) : nullptr;
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      float* yr = frow(dst, r);
      double sum = 0.0;
      for (int64_t i = 0; i < K; ++i) sum += double(xr[i] * xr[i]);
      const float mean = float(sum / double(K));
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < K; ++i) {
        const float y = xr[i] * scale;
        yr[i] = wp ? y * wp[i] : y;
      }
    }
  }

  // --- MatMul --------------------------------------------------------------
  void mat_mul(const Tensor& w, const Tensor& x, const Tensor& dst) {
    const int64_t K = w.ne[0], N = w.ne[1], M = x.nrows();
    const DType vdt = quant::vec_dot_type(w.type);
    const size_t act_bytes = row_bytes(vdt, K);

    // Convert each activation row once (F32 rows are used in place).
    std::vector<const void*> act(size_t(M), nullptr);
    if (vdt == DType::F32) {
      for (int64_t m = 0; m < M; ++m) act[size_t(m)] = row_ptr(x, m);
    } else {
      act_buf_.resize(act_bytes * size_t(M));
      uint8_t* base = act_buf_.data();
      parallel_for(M, [&](int64_t b, int64_t e) {
        for (int64_t m = b; m < e; ++m) quant::quantize_row(vdt, frow(x, m), base + size_t(m) * act_bytes, K);
      });
      for (int64_t m = 0; m < M; ++m) act[size_t(m)] = base + size_t(m) * act_bytes;
    }

    if (dst.data == x.data) throw Error("dst must not alias x (the product is not computed in place)");
    std::vector<float*> out(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) out[size_t(m)] = frow(dst, m);

    const char* wbase = static_cast<const char*>(w.data);
    const int64_t wstride = int64_t(w.nb[1]);
    const DType wt = w.type;
    parallel_for(N, [&](int64_t b, int64_t e) {
      for (int64_t nrow = b; nrow < e; ++nrow) {
        const void* wr = wbase + nrow * wstride;
        for (int64_t m = 0; m < M; ++m) out[size_t(m)][nrow] = quant::vec_dot(wt, K, wr, act[size_t(m)]);
      }
    });
  }

  // --- Rope ----------------------------------------------------------------
  // ff: the optional frequency factors (src2) or null.
  static void rope(const Tensor& x, const Tensor& pos, const Tensor& dst, const Node& n, const float* ff) {
    const int64_t hd = x.ne[0], heads = x.ne[1], T = x.ne[2];
    const int32_t n_dims = n.i[0];
    const bool neox = n.i[1] == kRopeNeox || n.i[1] == kRopeImrope;
    const RopeTable table(n);
    const int32_t* p = static_cast<const int32_t*>(pos.data);
    std::vector<float> cs(static_cast<size_t>(n_dims));  // cos, sin per pair
    for (int64_t t = 0; t < T; ++t) {
      table.cos_sin(p[t], ff, cs.data());
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = x.row<float>(h, t);
        float* out = dst.row<float>(h, t);
        if (!neox) {
          for (int32_t i0 = 0; i0 < n_dims; i0 += 2) {
            const float c = cs[size_t(i0)], s = cs[size_t(i0) + 1];
            const float x0 = src[i0], x1 = src[i0 + 1];
            out[i0] = x0 * c - x1 * s;
            out[i0 + 1] = x0 * s + x1 * c;
          }
        } else {
          const int32_t half = n_dims / 2;
          for (int32_t i0 = 0; i0 < n_dims; i0 += 2) {
            const int32_t ic = i0 / 2;
            const float c = cs[size_t(i0)], s = cs[size_t(i0) + 1];
            const float x0 = src[ic], x1 = src[ic + half];
            out[ic] = x0 * c - x1 * s;
            out[ic + half] = x0 * s + x1 * c;
          }
        }
        if (out != src)
          for (int64_t i = n_dims; i < hd; ++i) out[i] = src[i];
      }
    }
  }

  // --- KvWrite -------------------------------------------------------------
  static void kv_write(const Tensor& x, const Tensor& slots, const Tensor& storage) {
    const int64_t hd = x.ne[0], heads = x.ne[1], T = x.ne[2];
    const int32_t* slot = static_cast<const int32_t*>(slots.data);  // inside storage: check_run_state
    for (int64_t t = 0; t < T; ++t) {
      uint16_t* row = storage_row(storage, slot[t]);
      for (int64_t h = 0; h < heads; ++h) {
        const float* xs = x.row<float>(h, t);
        for (int64_t d = 0; d < hd; ++d) row[h * hd + d] = quant::fp32_to_fp16(xs[d]);
      }
    }
  }

  // --- Attention -----------------------------------------------------------
  void attention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& table, const Tensor& dst,
                 float scale, int64_t window, const float* sinks) {
    const int64_t hd = q.ne[0], n_head = q.ne[1], T = q.ne[2], dv = dst.ne[0];
    const int64_t n_kv = kc.ne[0] / hd;
    const int64_t group = n_head / n_kv;

    // Per token row: its position, and the cache rows of its sequence (gathered once per
    // sequence through the block table; the table was checked by check_run_state).
    std::vector<int64_t> pos(size_t(T), 0), seq_of(size_t(T), 0);
    std::vector<std::vector<const uint16_t*>> krows(size_t(table.ne[1])), vrows(size_t(table.ne[1]));
    for (int64_t s = 0; s < table.ne[1]; ++s) {
      const int32_t* col = table.row<int32_t>(s);
      if (col[kSeqCount] == 0) continue;
      const int64_t L = int64_t(col[kSeqPos0]) + col[kSeqCount];
      krows[size_t(s)].resize(size_t(L));
      vrows[size_t(s)].resize(size_t(L));
      // Rows before the earliest position a window lets any token see are never read
      // (their pages may be released): left null.
      const int64_t seen = window > 0 ? std::max<int64_t>(0, int64_t(col[kSeqPos0]) - window + 1) : 0;
      sequence_rows(kc, col, L, krows[size_t(s)].data(), seen);
      sequence_rows(vc, col, L, vrows[size_t(s)].data(), seen);
      for (int64_t j = 0; j < col[kSeqCount]; ++j) {
        pos[size_t(col[kSeqFirst] + j)] = col[kSeqPos0] + j;
        seq_of[size_t(col[kSeqFirst] + j)] = s;
      }
    }

    // The weighted sum of V is kept in F16 between steps, as llama.cpp's CPU flash
    // attention does for an F16 cache: the reference rounds so, and every fixture is
    // closer to it this way (docs/decisions.md has the figures); the scores, max and sum
    // stay F32.
    auto round_f16 = [](float v) { return quant::fp16_to_fp32(quant::fp32_to_fp16(v)); };
    parallel_for(T * n_head, [&](int64_t b, int64_t e) {
      std::vector<float> qf(static_cast<size_t>(hd)), acc(static_cast<size_t>(dv));
      for (int64_t item = b; item < e; ++item) {
        const int64_t t = item / n_head, h = item % n_head;
        const int64_t kvh = h / group;
        const std::vector<const uint16_t*>& seq_k = krows[size_t(seq_of[size_t(t)])];
        const std::vector<const uint16_t*>& seq_v = vrows[size_t(seq_of[size_t(t)])];
        const float* qs = q.row<float>(h, t);
        for (int64_t d = 0; d < hd; ++d) qf[size_t(d)] = quant::fp16_to_fp32(quant::fp32_to_fp16(qs[d]));
        std::fill(acc.begin(), acc.end(), 0.0f);
        float M = -std::numeric_limits<float>::infinity(), S = 0.0f;
        const int64_t last = pos[size_t(t)];  // causal: positions 0 .. its own (the window's last)
        for (int64_t j = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0; j <= last; ++j) {
          const uint16_t* kr = seq_k[size_t(j)] + kvh * hd;
          float dot = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dot += qf[size_t(d)] * quant::fp16_to_fp32(kr[d]);
          const float s = dot * scale;
          float ms = 1.0f, vs = 1.0f;
          if (s > M) {
            const float Mold = M;
            M = s;
            ms = std::exp(Mold - M);
            for (float& a : acc) a = round_f16(a * ms);
          } else {
            vs = std::exp(s - M);
          }
          const uint16_t* vr = seq_v[size_t(j)] + kvh * dv;
          for (int64_t d = 0; d < dv; ++d) acc[size_t(d)] = round_f16(acc[size_t(d)] + quant::fp16_to_fp32(vr[d]) * vs);
          S = S * ms + vs;
        }
        if (sinks) {
          const float s = sinks[h];
          float ms = 1.0f, vs = 1.0f;
          if (s > M) {
            ms = std::exp(M - s);
            for (float& a : acc) a *= ms;
          } else {
            vs = std::exp(s - M);
          }
          S = S * ms + vs;
        }
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        float* out = dst.row<float>(h, t);
        for (int64_t d = 0; d < dv; ++d) out[d] = acc[size_t(d)] * inv;
      }
    });
  }

  // --- Concat, GroupLimit ------------------------------------------------------
  static void concat(const Tensor& a, const Tensor& b, const Tensor& dst) {
    const int64_t na = a.ne[0], nb = b.ne[0];
    for (int64_t r = 0; r < dst.nrows(); ++r) {
      float* out = dst.flat_row<float>(r);
      std::memcpy(out, a.flat_row<float>(r), size_t(na) * sizeof(float));
      std::memcpy(out + na, b.flat_row<float>(r), size_t(nb) * sizeof(float));
    }
  }

  static void group_limit(const Tensor& x, const Tensor& dst, int64_t groups, int64_t kept) {
    std::vector<float> score;
    std::vector<int64_t> order;
    for (int64_t r = 0; r < x.nrows(); ++r)
      group_limit_row(x.flat_row<float>(r), dst.flat_row<float>(r), x.ne[0], groups, kept, score, order);
  }

  // --- Softmax, Silu, SwiGlu, Add, Mul, Argmax -----------------------------
  static void softmax(const Tensor& x, const Tensor& dst) {
    const int64_t K = x.ne[0];
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      float* yr = frow(dst, r);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < K; ++i) mx = std::max(mx, xr[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < K; ++i) {
        const float e = std::exp(xr[i] - mx);
        sum += double(e);
        yr[i] = e;
      }
      const float inv = float(1.0 / sum);
      for (int64_t i = 0; i < K; ++i) yr[i] *= inv;
    }
  }

  static void silu_op(const Tensor& x, const Tensor& dst) {
    const int64_t K = x.ne[0];
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      float* yr = frow(dst, r);
      for (int64_t i = 0; i < K; ++i) yr[i] = silu(xr[i]);
    }
  }

  static void swiglu(const Tensor& g, const Tensor& u, const Tensor& dst) {
    const int64_t K = g.ne[0];
    for (int64_t r = 0; r < g.nrows(); ++r) {
      const float* gr = frow(g, r);
      const float* ur = frow(u, r);
      float* yr = frow(dst, r);
      for (int64_t i = 0; i < K; ++i) yr[i] = silu(gr[i]) * ur[i];
    }
  }

  static void geglu(const Tensor& g, const Tensor& u, const Tensor& dst) {
    auto gelu = [](float x) {
      if (x <= -10.0f) return 0.0f;
      if (x >= 10.0f) return x;
      const float h = quant::fp16_to_fp32(quant::fp32_to_fp16(x));
      const float y = 0.5f * h * (1.0f + std::tanh(0.79788456080286535588f * h * (1.0f + 0.044715f * h * h)));
      return quant::fp16_to_fp32(quant::fp32_to_fp16(y));
    };
    const int64_t K = g.ne[0];
    for (int64_t r = 0; r < g.nrows(); ++r) {
      const float* gr = frow(g, r);
      const float* ur = frow(u, r);
      float* yr = frow(dst, r);
      for (int64_t i = 0; i < K; ++i) yr[i] = gelu(gr[i]) * ur[i];
    }
  }

  static void swiglu_oai(const Tensor& g, const Tensor& u, const Tensor& dst, float alpha, float limit) {
    const int64_t K = g.ne[0];
    for (int64_t r = 0; r < g.nrows(); ++r) {
      const float* gr = frow(g, r);
      const float* ur = frow(u, r);
      float* yr = frow(dst, r);
      for (int64_t i = 0; i < K; ++i) {
        const float x = std::min(gr[i], limit);
        const float y = std::clamp(ur[i], -limit, limit);
        yr[i] = x / (1.0f + std::exp(alpha * (-x))) * (y + 1.0f);
      }
    }
  }

  static void normalize_rows(const Tensor& x, const Tensor& dst, float scale, float min_sum) {
    const int64_t K = x.ne[0];
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      float* yr = frow(dst, r);
      double sum = 0.0;
      for (int64_t i = 0; i < K; ++i) sum += double(xr[i]);
      const float s = std::max(float(sum), min_sum);
      for (int64_t i = 0; i < K; ++i) yr[i] = xr[i] / s * scale;
    }
  }

  static void binary(const Tensor& a, const Tensor& b, const Tensor& dst, bool mul) {
    const int64_t K = a.ne[0], Kb = b.ne[0];
    for (int64_t r = 0; r < a.nrows(); ++r) {
      const float* ar = frow(a, r);
      const float* br = bcast_row(b, a, r);
      float* yr = frow(dst, r);
      if (mul)
        for (int64_t i = 0; i < K; ++i) yr[i] = ar[i] * br[i % Kb];
      else
        for (int64_t i = 0; i < K; ++i) yr[i] = ar[i] + br[i % Kb];
    }
  }

  template <typename F>
  static void map_rows(const Tensor& x, const Tensor& dst, F f) {
    const int64_t K = x.ne[0];
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      float* yr = frow(dst, r);
      for (int64_t i = 0; i < K; ++i) yr[i] = f(xr[i]);
    }
  }

  static void cont(const Tensor& x, const Tensor& dst) {
    // Rows of a view may overlap dst only if they alias it, which a graph never does.
    const int64_t K = x.ne[0];
    for (int64_t r = 0; r < x.nrows(); ++r) std::memcpy(frow(dst, r), frow(x, r), size_t(K) * sizeof(float));
  }

  // --- Gated delta-net ------------------------------------------------------
  // Causal depthwise convolution: channel c sees its d_conv-1 previous inputs (the
  // state, oldest first) followed by this batch; products summed in kernel order.
  void ssm_conv(const Tensor& x, const Tensor& w, const Tensor& dst, const Node& n) {
    const int64_t C = x.ne[0], T = x.ne[1], dc = w.ne[0], hist = dc - 1;
    float* state = n.kv->conv_state(n.i[0], n.i[1]);  // [hist, C]: channel c at state + c * hist
    parallel_for(C, [&](int64_t c0, int64_t c1) {
      std::vector<float> win(static_cast<size_t>(hist + T));
      for (int64_t c = c0; c < c1; ++c) {
        float* st = state + c * hist;
        for (int64_t j = 0; j < hist; ++j) win[size_t(j)] = st[j];
        for (int64_t t = 0; t < T; ++t) win[size_t(hist + t)] = frow(x, t)[c];
        const float* wc = frow(w, c);
        for (int64_t t = 0; t < T; ++t) {
          float sum = 0.0f;
          for (int64_t j = 0; j < dc; ++j) sum += win[size_t(t + j)] * wc[j];
          frow(dst, t)[c] = sum;
        }
        for (int64_t j = 0; j < hist; ++j) st[j] = win[size_t(T + j)];
      }
    });
  }

  // The delta rule, token by token, one value head per task. State row j (value
  // index) holds the key-space vector S[:, j], as the reference stores it.
  void gated_delta_net(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& dst, const Node& n) {
    const int64_t Hk = n.i[2], S = n.i[3], Hv = dst.ne[1], T = qkv.ne[1];
    const float eps = n.f[0], scale = 1.0f / std::sqrt(float(S));
    float* state_all = n.kv->recurrent_state(n.i[0], n.i[1]);
    auto l2_normalized = [&](const float* x, float* y) {
      double sum = 0.0;
      for (int64_t i = 0; i < S; ++i) sum += double(x[i] * x[i]);
      const float inv = 1.0f / std::max(std::sqrt(float(sum)), eps);
      for (int64_t i = 0; i < S; ++i) y[i] = x[i] * inv;
    };
    parallel_for(Hv, [&](int64_t h0, int64_t h1) {
      std::vector<float> q(static_cast<size_t>(S)), k(static_cast<size_t>(S)), d(static_cast<size_t>(S));
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h % Hk;
        float* M = state_all + h * S * S;
        for (int64_t t = 0; t < T; ++t) {
          const float* row = frow(qkv, t);
          l2_normalized(row + kh * S, q.data());
          l2_normalized(row + (Hk + kh) * S, k.data());
          const float* v = row + (2 * Hk + h) * S;
          const float decay = std::exp(frow(g, t)[h]), b = frow(beta, t)[h];
          for (int64_t e = 0; e < S * S; ++e) M[e] *= decay;
          for (int64_t j = 0; j < S; ++j) {
            double sk = 0.0;
            for (int64_t i = 0; i < S; ++i) sk += double(M[j * S + i] * k[size_t(i)]);
            d[size_t(j)] = (v[j] - float(sk)) * b;
          }
          for (int64_t j = 0; j < S; ++j)
            for (int64_t i = 0; i < S; ++i) M[j * S + i] += k[size_t(i)] * d[size_t(j)];
          float* out = dst.row<float>(h, t);
          for (int64_t j = 0; j < S; ++j) {
            double o = 0.0;
            for (int64_t i = 0; i < S; ++i) o += double(M[j * S + i] * q[size_t(i)]);
            out[j] = float(o) * scale;
          }
        }
      }
    });
  }

  // --- Mixture of experts ---------------------------------------------------
  static void top_k(const Tensor& x, const Tensor& dst) {
    const int64_t E = x.ne[0], k = dst.ne[0];
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < x.ne[1]; ++t) {
      const float* xr = frow(x, t);
      // NaN ranks last; ties go to the lower id.
      auto key = [&](int32_t i) { return std::isnan(xr[i]) ? -INFINITY : xr[i]; };
      for (int64_t i = 0; i < E; ++i) order[size_t(i)] = int32_t(i);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
      });
      int32_t* out = reinterpret_cast<int32_t*>(row_ptr(dst, t));
      for (int64_t j = 0; j < k; ++j) out[j] = order[size_t(j)];
    }
  }

  static void gather_cols(const Tensor& x, const Tensor& ids, const Tensor& dst) {
    for (int64_t t = 0; t < ids.ne[1]; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(row_ptr(ids, t));
      for (int64_t j = 0; j < ids.ne[0]; ++j) {
        if (id[j] < 0 || id[j] >= x.ne[0])
          throw Error("gather_cols: id " + std::to_string(id[j]) + " out of range [0, " + std::to_string(x.ne[0]) + ")");
        frow(dst, t)[j] = frow(x, t)[id[j]];
      }
    }
  }

  // Tokens are grouped by expert so each expert's rows are read once per call; each
  // output is one vec_dot, so results do not depend on grouping or thread count.
  // Experts [first, end) only when end > 0: the other slots' rows are zero.
  void mat_mul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& dst, int64_t first, int64_t end) {
    const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2], k = ids.ne[0], n = ids.ne[1], b = x.ne[1];
    if (end <= 0) first = 0, end = E;
    const DType vdt = quant::vec_dot_type(w.type);
    const size_t act_bytes = row_bytes(vdt, K);
    act_buf_.resize(act_bytes * size_t(b * n));
    for (int64_t r = 0; r < b * n; ++r) {  // every activation row converted once
      const float* xr = frow(x, r);
      if (vdt == DType::F32) std::memcpy(act_buf_.data() + size_t(r) * act_bytes, xr, act_bytes);
      else quant::quantize_row(vdt, xr, act_buf_.data() + size_t(r) * act_bytes, K);
    }
    std::vector<std::vector<std::pair<int64_t, int64_t>>> by_expert(static_cast<size_t>(E));  // (j, t)
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(row_ptr(ids, t));
      for (int64_t j = 0; j < k; ++j) {
        if (id[j] < 0 || id[j] >= E)
          throw Error("mat_mul_id: expert id " + std::to_string(id[j]) + " out of range [0, " + std::to_string(E) + ")");
        if (id[j] >= first && id[j] < end) by_expert[size_t(id[j])].emplace_back(j, t);
        else std::memset(frow(dst, t * k + j), 0, size_t(N) * sizeof(float));
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      const auto& pairs = by_expert[size_t(e)];
      if (pairs.empty()) continue;
      const char* we = static_cast<const char*>(w.data) + e * int64_t(w.nb[2]);
      parallel_for(N, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const void* wr = we + r * int64_t(w.nb[1]);
          for (const auto& [j, t] : pairs) {
            const uint8_t* act = act_buf_.data() + size_t((t * b + (j % b))) * act_bytes;
            frow(dst, t * k + j)[r] = quant::vec_dot(w.type, K, wr, act);
          }
        }
      });
    }
  }

  // Products first, then a running sum in expert-slot order (the reference's
  // multiply-then-add of views).
  static void moe_combine(const Tensor& e, const Tensor& w, const Tensor& dst) {
    const int64_t N = e.ne[0], k = e.ne[1];
    for (int64_t t = 0; t < e.ne[2]; ++t) {
      const float* wt = frow(w, t);
      float* out = frow(dst, t);
      for (int64_t i = 0; i < N; ++i) {
        float acc = frow(e, t * k)[i] * wt[0];
        for (int64_t j = 1; j < k; ++j) acc = acc + frow(e, t * k + j)[i] * wt[j];
        out[i] = acc;
      }
    }
  }

  static void argmax(const Tensor& x, const Tensor& dst) {
    const int64_t K = x.ne[0];
    int32_t* out = static_cast<int32_t*>(dst.data);
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* xr = frow(x, r);
      int64_t best = 0;
      for (int64_t i = 1; i < K; ++i)
        if (xr[i] > xr[best]) best = i;
      out[r] = int32_t(best);
    }
  }

  PoolRef pool_ = nullptr;
  std::vector<uint8_t> act_buf_;  // converted activations of the current MatMul
};

}  // namespace

std::unique_ptr<Backend> make_backend(PoolRef pool) { return std::make_unique<CpuScalarBackend>(pool); }

}  // namespace tessera::cpu_scalar
