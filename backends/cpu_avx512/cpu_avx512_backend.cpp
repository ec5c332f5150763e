// The cpu_avx512 backend object: validation, scheduling over the FastPool and
// dispatch into the AVX-512 kernels. This file is compiled WITHOUT ISA flags; the
// kernels (kernels_*.cpp) are only entered after usable() said yes (make_backend
// refuses otherwise).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_avx512_backend.h"
#include "kernels.h"
#include "kernels_deltanet.h"
#include "product_planner.h"
#include "tensor_layout.h"
#include "weight_store.h"
#include "tessera/error.h"
#include "tessera/group_limit.h"
#include "tessera/paged_rows.h"
#include "tessera/pool_ref.h"
#include "tessera/rope_table.h"
#include "tessera/graph.h"
#include "tessera/hwprobe.h"
#include "tessera/kv_access.h"
#include "tessera/membw.h"
#include "tessera/op_schema.h"
#include "tessera/range_backend.h"
#include "tessera/quant.h"
#include "tessera/work_split.h"

namespace tessera::cpu_avx512 {

bool usable(std::string* why) {
  const CpuFeatures& f = cpu_features();
  std::string missing;
  auto need = [&](bool ok, const char* name) {
    if (!ok) missing += missing.empty() ? name : std::string(", ") + name;
  };
  need(f.avx512f, "avx512f");
  need(f.avx512bw, "avx512bw");
  need(f.avx512vl, "avx512vl");
  need(f.avx512dq, "avx512dq");
  need(f.avx512vnni, "avx512vnni");
  need(f.avx512bf16, "avx512bf16");
  need(f.fma, "fma");
  need(f.f16c, "f16c");
  need(f.os_avx512, "OS support for AVX-512 state (XCR0 opmask/ZMM)");
  if (missing.empty()) return true;
  if (why) *why = "missing " + missing;
  return false;
}

namespace {

inline char* row_ptr(const Tensor& t, int64_t r) { return t.flat_row<char>(r); }
inline float* frow(const Tensor& t, int64_t r) { return t.flat_row<float>(r); }

// Row of b that broadcasts onto row r of a (the schema's rule: every dimension of b
// divides a's), as the reference reads it.
inline const float* bcast_row(const Tensor& b, const Tensor& a, int64_t r) {
  const int64_t i1 = r % a.ne[1];
  const int64_t i2 = (r / a.ne[1]) % a.ne[2];
  const int64_t i3 = r / (a.ne[1] * a.ne[2]);
  return reinterpret_cast<const float*>(static_cast<const char*>(b.data) + (i1 % b.ne[1]) * int64_t(b.nb[1]) +
                                        (i2 % b.ne[2]) * int64_t(b.nb[2]) + (i3 % b.ne[3]) * int64_t(b.nb[3]));
}

// The strides the delta-net kernel takes: evenly spaced token rows (a view of the
// convolution output is) and contiguous heads in dst.
bool delta_net_strides_ok(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& dst, int64_t S) {
  const int64_t Hv = dst.ne[1];
  return qkv.nb[0] == sizeof(float) && g.nb[0] == sizeof(float) && beta.nb[0] == sizeof(float) &&
         dst.nb[0] == sizeof(float) && g.nb[1] == beta.nb[1] && dst.nb[2] == dst.nb[1] * size_t(Hv) &&
         qkv.nb[1] % sizeof(float) == 0 && g.nb[1] % sizeof(float) == 0 && dst.nb[1] == size_t(S) * sizeof(float);
}

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

class CpuAvx512Backend final : public RangeBackend {
 public:
  CpuAvx512Backend(PoolRef pool, bool repack, int decode_tiles, bool decode_prefetch)
      : pool_(pool),
        weights_(pool, repack),
        decode_tiles_(decode_tiles),
        decode_prefetch_(decode_prefetch) {}
  // The pool outlives its backends; its workers may still read a repacked copy.
  ~CpuAvx512Backend() override {
    if (pool_) pool_.cancel_idle_prefetch();
  }
  // A group of up to kMaxGroup products over one input (mat_mul_repacked_group), or two
  // products and the SwiGlu that reads them; each also checks for overlaps itself and
  // runs node by node when it finds one, so the window only lets the groups form.
  int32_t fusion_window() const override { return kMaxGroup; }

  void prepare_weight(Tensor& w) override { weights_.prepare(w); }

  std::span<const std::byte> weight_bytes(const Tensor& w) override {
    const std::span<const std::byte> repacked = weights_.repacked_bytes(w);
    return repacked.empty() ? Backend::weight_bytes(w) : repacked;
  }

  std::string name() const override { return "cpu_avx512"; }

  // Every op has a kernel here; declined are only the shapes those kernels do not take
  // (the scheduler then runs the node on the next backend by rank).
  OpSupport supports(const Graph& graph, const Node& node) const override {
    auto T = [&](int32_t i) -> const Tensor& { return graph.tensor(i); };
    switch (node.op) {
      case Op::MatMul: {
        const Tensor &w = T(node.src[0]), &d = T(node.dst);
        if (!kern::matmul_type_supported(w.type))
          return OpSupport::no("MatMul: no AVX-512 kernel for weight dtype " + std::string(dtype_name(w.type)));
        if (!uniform_rows(d) || d.nb[1] % sizeof(float) != 0)
          return OpSupport::no("MatMul: dst rows are not evenly spaced");
        return OpSupport::yes();
      }
      case Op::MatMulId: {
        const DType wt = T(node.src[0]).type;
        if (!kern::matmul_type_supported(wt))
          return OpSupport::no("MatMulId: no AVX-512 kernel for weight dtype " + std::string(dtype_name(wt)));
        return OpSupport::yes();
      }
      case Op::Attention:
        if (T(node.src[0]).ne[0] > 1024) return OpSupport::no("Attention: head_dim above 1024");
        if (T(node.dst).ne[0] > T(node.src[0]).ne[0])
          return OpSupport::no("Attention: value heads wider than key heads");
        return OpSupport::yes();
      case Op::GatedDeltaNet:
        if (!delta_net_strides_ok(T(node.src[0]), T(node.src[1]), T(node.src[2]), T(node.dst), node.i[3]))
          return OpSupport::no("GatedDeltaNet: token rows not evenly spaced or heads not contiguous");
        return OpSupport::yes();
      case Op::MoeCombine:
        if (T(node.src[0]).ne[1] > 64) return OpSupport::no("MoeCombine: more than 64 experts per token");
        return OpSupport::yes();
      default: return OpSupport::yes();
    }
  }

 private:
  // Every node of [first, first + count) is valid and supported (range_backend.h).
  void run_range(Graph& graph, size_t first, size_t count) override {
    const auto& nodes = graph.nodes();
    struct RowHints {  // hints into the caller's tensors end with the call, whatever it throws
      CpuAvx512Backend& be;
      ~RowHints() {
        if (be.row_hints_ && be.pool_) be.pool_.cancel_idle_prefetch();
        be.row_hints_ = false;
      }
    } row_hints{*this};
    act_key_.valid = false;  // x may have been written since the last call
    next_.node = SIZE_MAX;    // found in another graph or call
    const size_t end = first + count;
    for (size_t k = first; k < end; ++k) {
      const Node& n = nodes[k];
      if (n.op == Op::MatMul && k + 1 < end && nodes[k + 1].op == Op::MatMul) {
        const ProductGroup grp = next_.node == k ? next_ : planner_.repacked_group(graph, k, end);
        if (grp.n == 0) {  // products of the format-kernel types (row kernels) as one dispatch
          const Tensor* rws[kMaxGroup];
          const Tensor* rdsts[kMaxGroup];
          const int rn = planner_.row_group(graph, k, end, rws, rdsts);
          if (rn > 1) {
            prepare_next_product(graph, k + size_t(rn), first, end);
            try {
              mat_mul_rows_group(rws, rdsts, rn, graph.tensor(n.src[1]), n.src[1]);
            } catch (const Error& e) {
              fail(graph, k, e.what());
            }
            k += size_t(rn) - 1;
            continue;
          }
        }
        const size_t after = k + size_t(std::max(grp.n, 1)) + (grp.swiglu ? 1 : 0);
        prepare_next_product(graph, after, first, end);
        if (grp.n > 1) {
          try {
            mat_mul_repacked_group(grp.rps, grp.ws, grp.dsts, grp.n, graph.tensor(n.src[1]), n.src[1], grp.swiglu);
          } catch (const Error& e) {
            fail(graph, k, e.what());
          }
          if (grp.swiglu) act_key_.valid = false;
          k = after - 1;
          continue;
        }
      }
      if (n.op != Op::MatMul) act_key_.valid = false;
      else if (k + 1 >= end || nodes[k + 1].op != Op::MatMul) prepare_next_product(graph, k + 1, first, end);
      bool done = false;
      try {
        done = run_node(graph, n);
      } catch (const Error& e) {
        fail(graph, k, e.what());
      }
      if (!done) fail(graph, k, "no native path for this node (supports() should have declined it)");
    }
  }

  [[noreturn]] static void fail(const Graph& g, size_t k, const std::string& why) {
    throw Error("cpu_avx512: " + describe_node(g, k) + ": " + why);
  }

  template <typename F>
  void parallel_for(int64_t n, F&& f) {
    cpu_avx512::parallel_for(pool_, n, std::forward<F>(f));
  }

  // ---- Small ops ----------------------------------------------------------------
  // Row- or element-parallel on the pool only above a size where the split pays for
  // the dispatch and the cache-line traffic; below it the caller runs them
  // alone (a 2048-element decode row of Add costs less than one dispatch). Thresholds
  // are elements of the op, measured with BM_SmallOp (bench/bench_matmul.cpp, see
  // docs/performance.md). Every element is computed by the same code whatever the
  // split, so results do not depend on the thread count.
  static constexpr int64_t kParCheap = 32768;  // Add, Mul, RmsNorm, Rope, GetRows, KvWrite
  // Silu, SwiGlu, Softmax (exp16): splitting pays from a few thousand elements.
  static constexpr int64_t kParExp = 4096;

  bool pool_split() const { return pool_ && pool_.executor_count() > 1; }

  // f(r0, r1) over [0, rows), split by rows when the op has at least `threshold` elements.
  template <typename F>
  void rows_par(int64_t rows, int64_t elems, int64_t threshold, F&& f) {
    if (rows >= 2 && elems >= threshold && pool_split())
      parallel_for(rows, f);
    else if (rows > 0)
      f(int64_t(0), rows);
  }
  // f(e0, e1) over the flat elements [0, total), split in 16-element units.
  template <typename F>
  void elems_par(int64_t total, int64_t threshold, F&& f) {
    if (total >= threshold && total >= 32 && pool_split())
      parallel_for((total + 15) / 16, [&](int64_t u0, int64_t u1) { f(u0 * 16, std::min(total, u1 * 16)); });
    else if (total > 0)
      f(int64_t(0), total);
  }

  // Returns false only for a node supports() declines (never reached from the scheduler).
  bool run_node(Graph& g, const Node& n) {
    switch (n.op) {
      case Op::MatMul: return mat_mul(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n.src[1]);
      case Op::MatMulId:
        return mat_mul_id(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.dst), n.i[0],
                          n.i[1] > 0 ? n.i[1] : g.tensor(n.src[0]).ne[2]);
      case Op::Attention:
        return attention(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.src[3]),
                         g.tensor(n.dst), n.f[0], n.i[0],
                         n.src[4] >= 0 ? static_cast<const float*>(g.tensor(n.src[4]).data) : nullptr);
      case Op::GatedDeltaNet:
        return gated_delta_net(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.src[2]), g.tensor(n.dst), n);
      case Op::RmsNorm: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        const float* w = n.src[1] >= 0 ? static_cast<const float*>(g.tensor(n.src[1]).data) : nullptr;
        const int64_t K = x.ne[0];
        rows_par(x.nrows(), x.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) kern::rms_norm_row(frow(x, r), w, frow(y, r), K, n.f[0]);
        });
        return true;
      }
      case Op::Softmax: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        const int64_t K = x.ne[0];
        rows_par(x.nrows(), x.nelements(), kParExp, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) kern::softmax_row(frow(x, r), frow(y, r), K);
        });
        return true;
      }
      case Op::Silu: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        if (flat(x) && flat(y)) {
          const float *xp = static_cast<const float*>(x.data);
          float* yp = static_cast<float*>(y.data);
          elems_par(x.nelements(), kParExp, [&](int64_t e0, int64_t e1) { kern::silu_row(xp + e0, yp + e0, e1 - e0); });
        } else {
          rows_par(x.nrows(), x.nelements(), kParExp, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) kern::silu_row(frow(x, r), frow(y, r), x.ne[0]);
          });
        }
        return true;
      }
      case Op::SwiGlu: return gated(g, n, kern::swiglu_row);
      case Op::GeGlu: return gated(g, n, kern::geglu_row);
      case Op::SwiGluOai: {
        const float alpha = n.f[0], limit = n.f[1];
        return gated(g, n, [=](const float* a, const float* b, float* y, int64_t K) {
          kern::swiglu_oai_row(a, b, y, K, alpha, limit);
        });
      }
      case Op::NormalizeRows: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        const float scale = n.f[0], min_sum = n.f[1];
        rows_par(x.nrows(), x.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) kern::normalize_row(frow(x, r), frow(y, r), x.ne[0], scale, min_sum);
        });
        return true;
      }
      case Op::Concat: {
        const Tensor &a = g.tensor(n.src[0]), &b = g.tensor(n.src[1]), &y = g.tensor(n.dst);
        const size_t na = size_t(a.ne[0]) * sizeof(float), nb = size_t(b.ne[0]) * sizeof(float);
        rows_par(y.nrows(), y.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            std::memcpy(frow(y, r), frow(a, r), na);
            std::memcpy(reinterpret_cast<char*>(frow(y, r)) + na, frow(b, r), nb);
          }
        });
        return true;
      }
      case Op::GroupLimit: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        std::vector<float> score;
        std::vector<int64_t> order;
        for (int64_t r = 0; r < x.nrows(); ++r) group_limit_row(frow(x, r), frow(y, r), x.ne[0], n.i[0], n.i[1], score, order);
        return true;
      }
      case Op::Add:
      case Op::Mul: {
        const Tensor &a = g.tensor(n.src[0]), &b = g.tensor(n.src[1]), &y = g.tensor(n.dst);
        const bool same = same_shape(a, b);
        const bool add = n.op == Op::Add;
        if (!same && !(b.nrows() == 1 && b.ne[0] == a.ne[0])) {
          // General broadcast (e.g. qwen3.5's [n_embd, n] * [1, n] shared-expert gate):
          // the reference's loop, rows split above the threshold.
          const int64_t K = a.ne[0], Kb = b.ne[0];
          rows_par(a.nrows(), a.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              const float* ar = frow(a, r);
              const float* br = bcast_row(b, a, r);
              float* yr = frow(y, r);
              if (add)
                for (int64_t i = 0; i < K; ++i) yr[i] = ar[i] + br[i % Kb];
              else
                for (int64_t i = 0; i < K; ++i) yr[i] = ar[i] * br[i % Kb];
            }
          });
          return true;
        }
        if (same && flat(a) && flat(b) && flat(y)) {
          const float *ap = static_cast<const float*>(a.data), *bp = static_cast<const float*>(b.data);
          float* yp = static_cast<float*>(y.data);
          elems_par(a.nelements(), kParCheap, [&](int64_t e0, int64_t e1) {
            if (add)
              kern::add_row(ap + e0, bp + e0, yp + e0, e1 - e0);
            else
              kern::mul_row(ap + e0, bp + e0, yp + e0, e1 - e0);
          });
          return true;
        }
        rows_par(a.nrows(), a.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const float* br = same ? frow(b, r) : static_cast<const float*>(b.data);
            if (add)
              kern::add_row(frow(a, r), br, frow(y, r), a.ne[0]);
            else
              kern::mul_row(frow(a, r), br, frow(y, r), a.ne[0]);
          }
        });
        return true;
      }
      case Op::Argmax: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        int32_t* out = static_cast<int32_t*>(y.data);
        rows_par(x.nrows(), x.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) out[r] = int32_t(kern::argmax_row(frow(x, r), x.ne[0]));
        });
        return true;
      }
      case Op::Rope:
        return rope(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n,
                    n.src[2] >= 0 ? static_cast<const float*>(g.tensor(n.src[2]).data) : nullptr);
      case Op::GetRows: return get_rows(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::KvWrite: return kv_write(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::MoeCombine: {
        const Tensor &e = g.tensor(n.src[0]), &w = g.tensor(n.src[1]), &y = g.tensor(n.dst);
        const int64_t N = e.ne[0], k = e.ne[1], T = e.ne[2];
        if (k > 64) return false;
        rows_par(T, e.nelements(), kParCheap, [&](int64_t t0, int64_t t1) {
          const float* rows[64];
          for (int64_t t = t0; t < t1; ++t) {
            for (int64_t j = 0; j < k; ++j) rows[j] = frow(e, t * k + j);
            kern::moe_combine_row(rows, frow(w, t), k, frow(y, t), N);
          }
        });
        return true;
      }
      case Op::TopK: return top_k(g.tensor(n.src[0]), g.tensor(n.dst));
      case Op::GatherCols: return gather_cols(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst));
      case Op::Sigmoid:
        return map_rows(g.tensor(n.src[0]), g.tensor(n.dst), [](float x) { return 1.0f / (1.0f + std::exp(-x)); });
      case Op::Softplus:
        return map_rows(g.tensor(n.src[0]), g.tensor(n.dst),
                        [](float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); });
      case Op::Cont: {
        const Tensor &x = g.tensor(n.src[0]), &y = g.tensor(n.dst);
        const size_t row = size_t(x.ne[0]) * sizeof(float);
        rows_par(x.nrows(), x.nelements(), kParCheap, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) std::memcpy(frow(y, r), frow(x, r), row);
        });
        return true;
      }
      case Op::SsmConv: return ssm_conv(g.tensor(n.src[0]), g.tensor(n.src[1]), g.tensor(n.dst), n);
      case Op::Count: break;
    }
    return false;
  }

  // SwiGlu, GeGlu, SwiGluOai: row(g, u, y, count) over the whole arrays when they are
  // contiguous, else per row.
  template <typename F>
  bool gated(Graph& g, const Node& n, F row) {
    const Tensor &a = g.tensor(n.src[0]), &b = g.tensor(n.src[1]), &y = g.tensor(n.dst);
    if (flat(a) && flat(b) && flat(y)) {
      const float *ap = static_cast<const float*>(a.data), *bp = static_cast<const float*>(b.data);
      float* yp = static_cast<float*>(y.data);
      elems_par(a.nelements(), kParExp, [&](int64_t e0, int64_t e1) { row(ap + e0, bp + e0, yp + e0, e1 - e0); });
    } else {
      rows_par(a.nrows(), a.nelements(), kParExp, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) row(frow(a, r), frow(b, r), frow(y, r), a.ne[0]);
      });
    }
    return true;
  }

  // Sigmoid, Softplus: the reference's scalar formula per element (libm exp / log, so
  // results equal cpu_scalar's), rows split above the threshold. They gate qwen3.5's
  // heads: a few thousand elements per token.
  template <typename F>
  bool map_rows(const Tensor& x, const Tensor& y, F f) {
    const int64_t K = x.ne[0];
    rows_par(x.nrows(), x.nelements(), kParExp, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = frow(x, r);
        float* yr = frow(y, r);
        for (int64_t i = 0; i < K; ++i) yr[i] = f(xr[i]);
      }
    });
    return true;
  }

  // TopK: ids of the k largest values per row, largest first, lower id on ties, NaN
  // last (the reference's order). Router rows are short (E <= 512): one thread.
  bool top_k(const Tensor& x, const Tensor& dst) {
    const int64_t E = x.ne[0], k = dst.ne[0];
    topk_order_.resize(size_t(E));
    for (int64_t t = 0; t < x.ne[1]; ++t) {
      const float* xr = frow(x, t);
      auto key = [&](int32_t i) { return std::isnan(xr[i]) ? -INFINITY : xr[i]; };
      for (int64_t i = 0; i < E; ++i) topk_order_[size_t(i)] = int32_t(i);
      std::partial_sort(topk_order_.begin(), topk_order_.begin() + k, topk_order_.end(), [&](int32_t a, int32_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
      });
      int32_t* out = reinterpret_cast<int32_t*>(row_ptr(dst, t));
      for (int64_t j = 0; j < k; ++j) out[j] = topk_order_[size_t(j)];
    }
    return true;
  }

  // GatherCols: dst[j, t] = x[ids[j, t], t]; ids are data, checked here.
  static bool gather_cols(const Tensor& x, const Tensor& ids, const Tensor& dst) {
    for (int64_t t = 0; t < ids.ne[1]; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(row_ptr(ids, t));
      for (int64_t j = 0; j < ids.ne[0]; ++j) {
        if (id[j] < 0 || id[j] >= x.ne[0])
          throw Error("gather_cols: id " + std::to_string(id[j]) + " out of range [0, " + std::to_string(x.ne[0]) + ")");
        frow(dst, t)[j] = frow(x, t)[id[j]];
      }
    }
    return true;
  }

  // SsmConv: causal depthwise convolution over the sequence's conv state, channels
  // split over the pool; each channel's products are summed in kernel order, as the
  // reference does, so results equal cpu_scalar's for any thread count.
  bool ssm_conv(const Tensor& x, const Tensor& w, const Tensor& dst, const Node& n) {
    const int64_t C = x.ne[0], T = x.ne[1], dc = w.ne[0], hist = dc - 1;
    float* state = n.kv->conv_state(n.i[0], n.i[1]);  // [hist, C]: channel c at state + c * hist
    rows_par(C, C * (T + hist) * dc, kParCheap, [&](int64_t c0, int64_t c1) {
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
    return true;
  }

  // GetRows: quant::dequantize_row per id (the reference's code), rows split above
  // the threshold.
  bool get_rows(const Tensor& tab, const Tensor& ids, const Tensor& dst) {
    const int64_t K = tab.ne[0], V = tab.ne[1], cnt = ids.ne[0];
    const int32_t* id = static_cast<const int32_t*>(ids.data);
    for (int64_t i = 0; i < cnt; ++i)
      if (id[i] < 0 || id[i] >= V)
        throw Error("row id " + std::to_string(id[i]) + " (ids[" + std::to_string(i) + "]) out of range [0, " +
                    std::to_string(V) + ") of table '" + tab.name + "'");
    rows_par(cnt, cnt * K, kParCheap, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i)
        quant::dequantize_row(tab.type, static_cast<const char*>(tab.data) + id[i] * int64_t(tab.nb[1]), frow(dst, i), K);
    });
    return true;
  }

  // Rope, normal, NeoX and multi-section (qwen3.5's imrope, rotated NeoX-style). The
  // reference's arithmetic exactly: per token the (cos, sin) table of ggml's cache
  // (theta multiplied by theta_scale per pair, libm cosf/sinf; with frequency factors
  // ff (src2, Llama 3.1's rope_freqs) pair i's angle is freq_scale * (theta / ff[i]);
  // multi-section: pairs outside the t, h and w sections rotate by position 0), then
  // x0 c - x1 s, x0 s + x1 c in float (this file is compiled without FMA). Items
  // (token, head) split above the threshold.
  bool rope(const Tensor& x, const Tensor& pos, const Tensor& dst, const Node& n, const float* ff) {
    const int32_t mode = n.i[1];
    if (mode != kRopeNormal && mode != kRopeNeox && mode != kRopeImrope) return false;
    const int64_t hd = x.ne[0], heads = x.ne[1], T = x.ne[2];
    const int32_t n_dims = n.i[0];
    const bool neox = mode != kRopeNormal;
    const RopeTable table(n);
    const int32_t* p = static_cast<const int32_t*>(pos.data);
    rope_cs_.resize(size_t(T * n_dims));
    auto tables = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) table.cos_sin(p[t], ff, rope_cs_.data() + t * n_dims);
    };
    rows_par(T, T * n_dims * 8, kParCheap, tables);  // cosf + sinf per pair: ~8 element ops
    rows_par(T * heads, x.nelements(), kParCheap, [&](int64_t i0_, int64_t i1_) {
      for (int64_t item = i0_; item < i1_; ++item) {
        const int64_t t = item / heads, h = item % heads;
        const float* cs = rope_cs_.data() + t * n_dims;
        const float* src = x.row<float>(h, t);
        float* out = dst.row<float>(h, t);
        if (!neox) {
          for (int32_t i0 = 0; i0 < n_dims; i0 += 2) {
            const float c = cs[i0], s = cs[i0 + 1];
            const float x0 = src[i0], x1 = src[i0 + 1];
            out[i0] = x0 * c - x1 * s;
            out[i0 + 1] = x0 * s + x1 * c;
          }
        } else {
          const int32_t half = n_dims / 2;
          for (int32_t i0 = 0; i0 < n_dims; i0 += 2) {
            const int32_t ic = i0 / 2;
            const float c = cs[i0], s = cs[i0 + 1];
            const float x0 = src[ic], x1 = src[ic + half];
            out[ic] = x0 * c - x1 * s;
            out[ic + half] = x0 * s + x1 * c;
          }
        }
        if (out != src)
          for (int64_t i = n_dims; i < hd; ++i) out[i] = src[i];
      }
    });
    return true;
  }

  // KvWrite: F32 -> F16 (round to nearest even, NaN as quant::fp32_to_fp16) into the
  // storage rows of the tokens' slots (inside the storage: check_run_state), tokens
  // split above the threshold.
  bool kv_write(const Tensor& x, const Tensor& slots, const Tensor& storage) {
    const int64_t hd = x.ne[0], heads = x.ne[1], T = x.ne[2];
    const int32_t* slot = static_cast<const int32_t*>(slots.data);
    rows_par(T, x.nelements(), kParCheap, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        uint16_t* row = storage_row(storage, slot[t]);
        for (int64_t h = 0; h < heads; ++h) kern::f32_to_f16_row(x.row<float>(h, t), row + h * hd, hd);
      }
    });
    return true;
  }

  // A weight whose dtype has tiles and whose layout the repacking reads (rows of whole
  // blocks, experts that do not overlap).
  // A 64-byte aligned buffer that grows to the largest size asked for.
  struct Scratch {
    std::unique_ptr<uint8_t[], AlignedFree> p;
    size_t cap = 0;
    uint8_t* get(size_t bytes, const char* what) {
      if (bytes > cap) {
        const size_t c = (bytes + 4095) & ~size_t(4095);
        p.reset(static_cast<uint8_t*>(std::aligned_alloc(64, c)));
        cap = p ? c : 0;
        if (!p) throw Error("out of memory for " + std::to_string(c) + " bytes of " + what);
      }
      return p.get();
    }
    uint8_t* data() const { return p.get(); }
  };

  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> copies_;  // copy_to_streamed_pages

  // The prepared (quantized) activation of the last MatMul is reused by the next
  // MatMul node that reads the same x tensor the same way (q/k/v, gate/up): valid
  // only between consecutive MatMul nodes of one execute() call, and dropped when a
  // product's dst overlaps its x.
  struct ActKey {
    bool valid = false;
    int32_t x = -1;
    const void* data = nullptr;
    DType wt = DType::F32;
    bool repacked = false;
    int64_t K = 0, M = 0;
  };
  uint8_t* prepared_act(const Tensor& x, int32_t xi, DType wt, bool repacked, int64_t K, size_t ab) {
    const int64_t M = x.nrows();
    const ActKey& c = act_key_;
    if (c.valid && c.x == xi && c.data == x.data && c.wt == wt && c.repacked == repacked && c.K == K && c.M == M)
      return act_.data();
    act_key_.valid = false;
    uint8_t* act = act_.get(ab * size_t(M), "activations");
    auto prep = [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m) {
        if (repacked)
          kern::prep_act_repacked(wt, frow(x, m), K, act + size_t(m) * ab);
        else
          kern::prep_act(wt, frow(x, m), K, act + size_t(m) * ab);
      }
    };
    if (M == 1) prep(0, 1); else parallel_for(M, prep);
    act_key_ = ActKey{xi >= 0, xi, x.data, wt, repacked, K, M};
    return act;
  }
  // After a product: its dst overlapping x would make the cached activation stale.
  void check_act_key(const Tensor& x, const Tensor& dst) {
    const char *x0 = static_cast<const char*>(x.data), *d0 = static_cast<const char*>(dst.data);
    if (d0 < end_of(x) && x0 < end_of(dst)) act_key_.valid = false;
  }

  // Products of one x by up to kMaxGroup repacked weights of one dtype and K, as one
  // dispatch over all their tiles (claims never cross from one product into the
  // next): q/k/v and gate/up then wait for the slower executor once, not per product.
  // Every tile is computed by the same code as alone, so results do not change.
  //
  // The copies come from WeightStore::lookup, unchecked: their fingerprints are
  // checked here, by the first worker before it claims tiles (three cache misses per
  // weight, in parallel with the caller's streaming instead of before the dispatch). A
  // product whose weight turns out stale has its copy dropped and is computed again
  // from the tensor.
  //
  // With `swiglu` (see fused_swiglu: count is 2, gate then up, of equal N) the items
  // are row tiles of both products, and whoever computes a tile of gate and up also
  // writes silu(gate) * up for its rows into *swiglu: the SwiGlu node needs no
  // dispatch of its own, and no executor reads the other's outputs for it.
  void mat_mul_repacked_group(const Repacked* const* rps, const Tensor* const* ws, const Tensor* const* dsts,
                              int count, const Tensor& x, int32_t xi, const Tensor* swiglu = nullptr) {
    const DType type = rps[0]->type;
    const int64_t K = rps[0]->K, M = x.nrows();
    const size_t ab = kern::act_bytes_repacked(type, K);
    uint8_t* act = prepared_act(x, xi, type, true, K, ab);
    struct Ctx {
      kern::MatMulJob job[kMaxGroup];
      int64_t N[kMaxGroup];
      int64_t end[kMaxGroup];  // tile index one past each product, in the group's numbering
      int count;
      int64_t tiles;
      const Tensor* w[kMaxGroup];
      uint64_t fp[kMaxGroup];
      unsigned stale = 0;  // bit i: product i's weight no longer matches its copy
      WorkSplit* split = nullptr;
      float* y = nullptr;  // fused SwiGlu output (rows of y_stride floats)
      int64_t y_stride = 0;
      void check_fingerprints() {
        for (int i = 0; i < count; ++i)
          if (fingerprint(*w[i]) != fp[i]) stale |= 1u << i;
      }
      void swiglu(int64_t r0, int64_t r1) const {
        for (int64_t m = 0; m < job[0].M; ++m)
          kern::swiglu_row(job[0].col_out(m) + r0, job[1].col_out(m) + r0, y + m * y_stride + r0, r1 - r0);
      }
      // Tiles [b, e) of the group: each product's part in its own tile numbering
      // (fused SwiGlu: tiles [b, e) of gate and of up, then their SwiGlu rows).
      void run(int64_t b, int64_t e) const {
        if (y) {
          kern::matmul_tiles_repacked(job[0], N[0], b, e);
          kern::matmul_tiles_repacked(job[1], N[1], b, e);
          swiglu(b * kern::kTileRows, std::min(N[0], e * kern::kTileRows));
          return;
        }
        for (int i = 0; i < count && b < e; ++i) {
          if (b >= end[i]) continue;
          const int64_t start = i ? end[i - 1] : 0, stop = std::min(e, end[i]);
          kern::matmul_tiles_repacked(job[i], N[i], b - start, stop - start);
          b = stop;
        }
      }
    } ctx;
    ctx.count = count;
    int64_t tiles = 0;
    for (int i = 0; i < count; ++i) {
      check_act_key(x, *dsts[i]);
      ctx.job[i] = kern::MatMulJob{type, K, rps[i]->data.get(), 0, M, act, ab, static_cast<float*>(dsts[i]->data),
                                   int64_t(dsts[i]->nb[1] / sizeof(float))};
      ctx.job[i].decode_tiles = decode_tiles_;
      ctx.job[i].decode_prefetch = decode_prefetch_;
      ctx.N[i] = rps[i]->N;
      ctx.w[i] = ws[i];
      ctx.fp[i] = rps[i]->fp;
      tiles += (rps[i]->N + kern::kTileRows - 1) / kern::kTileRows;
      ctx.end[i] = tiles;
    }
    ctx.tiles = tiles;
    if (swiglu) {
      ctx.y = static_cast<float*>(swiglu->data);
      ctx.y_stride = swiglu->ne[0];
      ctx.tiles = ctx.end[0];  // items: row tiles of gate and up together
    }
    const int execs = pool_ ? pool_.executor_count() : 1;
    if (execs <= 1 || ctx.tiles < 2) {
      ctx.check_fingerprints();
      if (!ctx.stale)
        ctx.run(0, ctx.tiles);
      else
        for (int i = 0; i < count; ++i)  // the products whose copies are still valid
          if (!(ctx.stale & (1u << i)))
            kern::matmul_tiles_repacked(ctx.job[i], ctx.N[i], 0, ctx.end[i] - (i ? ctx.end[i - 1] : 0));
    } else {
      run_group_on_pool(ctx, execs);
    }
    // Stale copies (memory reused by another tensor): drop them, compute from the
    // tensors (and the fused SwiGlu again from the products).
    for (int i = 0; i < count; ++i)
      if (ctx.stale & (1u << i)) {
        weights_.drop(ws[i]->data);
        mat_mul(*ws[i], x, *dsts[i], xi);
      }
    if (swiglu && ctx.stale) ctx.swiglu(0, ctx.N[0]);
  }

  // Tiles handed out by split_ (tessera/work_split.h): each executor streams its own
  // contiguous share in shrinking claims and takes half of the other's remainder when
  // it runs dry, so claims cost no cross-core transfer and the executors still finish
  // together (decode's largest idle time is the wait at the end of a product).
  template <typename Ctx>
  void run_group_on_pool(Ctx& ctx, int execs) {
    split_.reset(ctx.tiles, execs, 1);
    ctx.split = &split_;
    pool_.parallel(
        [](void* p, int index) {
          Ctx& c = *static_cast<Ctx*>(p);
          if (index == 1) c.check_fingerprints();
          int64_t b, e;
          while (c.split->next(index, b, e)) c.run(b, e);
        },
        &ctx);
  }

  // The products of row_group as one dispatch: items are 16-row tiles of each product in
  // turn (claims never cross into the next), each computed by matmul_rows exactly as
  // mat_mul computes it alone.
  void mat_mul_rows_group(const Tensor* const* ws, const Tensor* const* dsts, int n, const Tensor& x, int32_t xi) {
    const DType wt = ws[0]->type;
    const int64_t K = ws[0]->ne[0], M = x.nrows();
    const size_t ab = kern::act_bytes(wt, K);
    uint8_t* act = prepared_act(x, xi, wt, false, K, ab);
    struct Ctx {
      kern::MatMulJob job[kMaxGroup];
      int64_t N[kMaxGroup], tiles[kMaxGroup];
      int n;
      WorkSplit* split;
      void run(int64_t b, int64_t e) const {
        for (int i = 0; i < n && b < e; ++i) {
          if (b >= tiles[i]) {
            b -= tiles[i], e -= tiles[i];
            continue;
          }
          const int64_t t1 = std::min(e, tiles[i]);
          kern::matmul_rows(job[i], b * kern::kTileRows, std::min(N[i], t1 * kern::kTileRows));
          b = 0, e -= tiles[i];
        }
      }
    } ctx;
    ctx.n = n;
    ctx.split = &split_;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      const Tensor& w = *ws[i];
      const Tensor& d = *dsts[i];
      ctx.job[i] = kern::MatMulJob{wt, K, static_cast<const uint8_t*>(w.data), int64_t(w.nb[1]), M, act, ab,
                                   static_cast<float*>(d.data), int64_t(d.nb[1] / sizeof(float))};
      ctx.job[i].decode_prefetch = decode_prefetch_;
      ctx.N[i] = w.ne[1];
      ctx.tiles[i] = (w.ne[1] + kern::kTileRows - 1) / kern::kTileRows;
      total += ctx.tiles[i];
    }
    const int execs = pool_ ? pool_.executor_count() : 1;
    if (execs <= 1 || total < 2) {
      ctx.run(0, total);
      return;
    }
    split_.reset(total, execs, 1);
    pool_.parallel(
        [](void* p, int index) {
          auto* c = static_cast<Ctx*>(p);
          int64_t b, e;
          while (c->split->next(index, b, e)) c->run(b, e);
        },
        &ctx);
  }

  // Sets each worker's idle prefetch (FastPool::set_idle_prefetch): the first bytes of its
  // share (WorkSplit's initial split) of the next repacked product from node `from`
  // on, read into its cache while the caller runs the ops before that product. After
  // the last product of [first, end) it is the first one (the next token's graph is
  // most likely the same). The group found is kept in next_ for execute().
  static constexpr size_t kIdlePrefetchBytes = 256 << 10;
  //
  // Also requests the RmsNorm weights of the ops up to that product into the caller's
  // cache (they are cold each token, which made rms_norm markedly slower).
  // Called before each product's dispatch, so both complete while it streams.
  void prepare_next_product(const Graph& g, size_t from, size_t first, size_t end) {
    const int execs = pool_ ? pool_.executor_count() : 1;
    const auto& nodes = g.nodes();
    size_t j = from;
    while (j < end && nodes[j].op != Op::MatMul) ++j;
    for (size_t i = from; i < j; ++i)
      if (nodes[i].op == Op::RmsNorm && nodes[i].src[1] >= 0) {
        const Tensor& w = g.tensor(nodes[i].src[1]);
        const char* p = static_cast<const char*>(w.data);
        for (size_t o = 0; p && o < std::min<size_t>(w.nbytes(), 64 << 10); o += 64) __builtin_prefetch(p + o, 0, 2);
      }
    if (execs < 2) return;
    if (j == end)
      for (j = first; j < from && nodes[j].op != Op::MatMul;) ++j;
    next_ = ProductGroup{};
    if (j < end && nodes[j].op == Op::MatMul) {
      next_ = planner_.repacked_group(g, j, end);
      if (j >= from) next_.node = j;  // a product of this call still to come
    }
    if (next_.n == 0 && j >= from && j < end && nodes[j].op == Op::MatMul && nodes[j].src[0] >= 0) {
      // A product of the format-kernel types (row kernels on the GGUF layout): the start of
      // each worker's share of its rows, as for a repacked one. Only for a product of
      // this call (the tensor is the caller's; see row_hints_).
      const Tensor& w = g.tensor(nodes[j].src[0]);
      if (w.data && kern::format_supported(w.type) && w.ne[2] == 1 && w.ne[3] == 1) {
        const int64_t N = w.ne[1], tiles = (N + kern::kTileRows - 1) / kern::kTileRows;
        for (int e = 1; e < execs; ++e) {
          PoolRef::PrefetchHint h;
          const int64_t r = tiles * e / execs * kern::kTileRows;  // where worker e's share starts
          if (r < N) {
            h.p = static_cast<const char*>(w.data) + size_t(r) * w.nb[1];
            h.bytes = std::min(kIdlePrefetchBytes, size_t(N - r) * w.nb[1]);
          }
          pool_.set_idle_prefetch(e, h);
        }
        row_hints_ = true;
        return;
      }
    }
    const int parts = next_.swiglu ? 1 : next_.n;  // fused: the share starts in gate and in up alike
    int64_t tiles = 0;
    for (int i = 0; i < parts; ++i) tiles += (next_.rps[i]->N + kern::kTileRows - 1) / kern::kTileRows;
    for (int w = 1; w < execs; ++w) {
      PoolRef::PrefetchHint h;
      int64_t t = tiles * w / execs;  // where worker w's share starts
      for (int i = 0; i < parts; ++i) {
        const Repacked& r = *next_.rps[i];
        const int64_t ti = (r.N + kern::kTileRows - 1) / kern::kTileRows;
        if (t < ti) {
          const size_t tb = kern::repacked_bytes(r.type, r.K, kern::kTileRows);
          h.p = r.data.get() + size_t(t) * tb;
          h.bytes = std::min(kIdlePrefetchBytes, size_t(ti - t) * tb);
          break;
        }
        t -= ti;
      }
      pool_.set_idle_prefetch(w, h);
    }
  }

  bool mat_mul(const Tensor& w, const Tensor& x, const Tensor& dst, int32_t xi = -1) {
    if (!uniform_rows(dst) || dst.nb[1] % sizeof(float) != 0) return false;
    if (dst.data == x.data) throw Error("dst must not alias x (the product is not computed in place)");
    if (const Repacked* rp = weights_.lookup(w)) {
      const Tensor* ws[1] = {&w};
      const Tensor* dsts[1] = {&dst};
      mat_mul_repacked_group(&rp, ws, dsts, 1, x, xi);
      return true;
    }
    const int64_t K = w.ne[0], N = w.ne[1], M = x.nrows();
    const size_t ab = kern::act_bytes(w.type, K);
    uint8_t* act = prepared_act(x, xi, w.type, false, K, ab);
    check_act_key(x, dst);
    kern::MatMulJob job{w.type, K, static_cast<const uint8_t*>(w.data), int64_t(w.nb[1]), M, act, ab,
                        static_cast<float*>(dst.data), int64_t(dst.nb[1] / sizeof(float))};
    job.decode_prefetch = decode_prefetch_;
    // Rows in groups of 16 handed out by split_ (see run_group_on_pool), so an
    // executor that is slowed down (a shared core) does not hold the others back. Each
    // row is computed by the same code whichever executor takes it: results do not
    // depend on the split.
    const int execs = pool_ ? pool_.executor_count() : 1;
    if (execs <= 1 || N < 2) {
      kern::matmul_rows(job, 0, N);
      return true;
    }
    struct Ctx {
      const kern::MatMulJob* job;
      int64_t n;
      WorkSplit* split;
    } ctx{&job, N, &split_};
    split_.reset((N + 15) / 16, execs, 1);
    pool_.parallel(
        [](void* p, int index) {
          auto* c = static_cast<Ctx*>(p);
          int64_t b, e;
          while (c->split->next(index, b, e)) kern::matmul_rows(*c->job, b * 16, std::min(c->n, e * 16));
        },
        &ctx);
    return true;
  }

  // MatMulId: the (token, slot) pairs are grouped by expert (a counting sort, in
  // token order), every activation row is prepared once per layout it is read in, and
  // each chosen expert runs the MatMul kernels over its own columns (gathered through
  // pointer arrays, written straight into their dst rows): one matrix-matrix product
  // per expert in prefill, k matrix-vector products in decode. Work items are (expert,
  // 16-row tiles), claimed from a shared counter. In an expert tensor not repacked at
  // load (streamed from disk), an expert that kern::repacking_columns or more columns
  // use has each tile repacked just before it is computed (kern::matmul_tiles_repacking):
  // the tiles' kernels are several times faster than the row kernels once a tile's
  // repacking is shared by enough columns, and compute the same bits (the row kernels
  // add in the tiles' order). Results match MatMul (and, Q4_0/Q8_0, cpu_scalar bit for
  // bit) and do not depend on the thread count or on which experts were repacked. Only
  // experts in [first, end) are computed (a distributed rank's share); other slots get
  // zero rows.
  bool mat_mul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& dst, int64_t first, int64_t end) {
    if (!kern::matmul_type_supported(w.type)) return false;
    if (dst.data == x.data) throw Error("dst must not alias x (the product is not computed in place)");
    const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2], k = ids.ne[0], n = ids.ne[1], b = x.ne[1];
    // Group the pairs by expert.
    moe_start_.assign(size_t(E) + 1, 0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(row_ptr(ids, t));
      for (int64_t j = 0; j < k; ++j) {
        if (id[j] < 0 || id[j] >= E)
          throw Error("mat_mul_id: expert id " + std::to_string(id[j]) + " out of range [0, " + std::to_string(E) + ")");
        if (id[j] >= first && id[j] < end)
          ++moe_start_[size_t(id[j]) + 1];
        else
          std::memset(frow(dst, t * k + j), 0, size_t(N) * sizeof(float));
      }
    }
    for (int64_t e = 0; e < E; ++e) moe_start_[size_t(e) + 1] += moe_start_[size_t(e)];
    // The copy's fingerprint (nine cold rows for an expert tensor) is checked during the
    // dispatch, as in mat_mul_repacked_group.
    const Repacked* rp = weights_.lookup(w);
    const int64_t tiles = (N + kern::kTileRows - 1) / kern::kTileRows;
    // Experts read as tiles: all when repacked at load; else those used by enough
    // columns, repacked tile by tile into each executor's scratch.
    const bool on_the_fly = !rp && weights_.repacks() && WeightStore::repackable(w);
    auto used = [&](int64_t e) { return moe_start_[size_t(e) + 1] - moe_start_[size_t(e)]; };
    moe_tiled_.assign(size_t(E), rp != nullptr);
    if (on_the_fly)
      for (int64_t e = 0; e < E; ++e) moe_tiled_[size_t(e)] = used(e) >= kern::repacking_columns(w.type);
    bool any_rows = false, any_tiled = false;
    for (int64_t e = 0; e < E; ++e)
      if (used(e) > 0) (moe_tiled_[size_t(e)] ? any_tiled : any_rows) = true;
    const int execs = pool_ ? pool_.executor_count() : 1;
    const size_t tile_bytes =
        on_the_fly && any_tiled ? (kern::repacked_bytes(w.type, K, kern::kTileRows) + 63) & ~size_t(63) : 0;
    uint8_t* tile_scratch = tile_bytes ? tile_scratch_.get(tile_bytes * size_t(execs), "repacked tiles") : nullptr;
    // Every activation row prepared once per layout that some expert reads.
    const size_t ab = kern::act_bytes(w.type, K), abt = any_tiled ? kern::act_bytes_repacked(w.type, K) : 0;
    const int64_t rows = b * n;
    uint8_t* act = any_rows ? act_.get(ab * size_t(rows), "activations") : nullptr;
    uint8_t* act_t = any_tiled ? tiled_act_.get(abt * size_t(rows), "activations") : nullptr;
    auto prep = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (act) kern::prep_act(w.type, frow(x, r), K, act + size_t(r) * ab);
        if (act_t) kern::prep_act_repacked(w.type, frow(x, r), K, act_t + size_t(r) * abt);
      }
    };
    if (rows == 1) prep(0, 1); else parallel_for(rows, prep);
    moe_act_.resize(size_t(k * n));
    moe_out_.resize(size_t(k * n));
    moe_fill_.assign(moe_start_.begin(), moe_start_.end() - 1);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(row_ptr(ids, t));
      for (int64_t j = 0; j < k; ++j) {
        if (id[j] < first || id[j] >= end) continue;
        const size_t at = size_t(moe_fill_[size_t(id[j])]++);
        const int64_t r = t * b + j % b;
        moe_act_[at] = moe_tiled_[size_t(id[j])] ? act_t + size_t(r) * abt : act + size_t(r) * ab;
        moe_out_[at] = frow(dst, t * k + j);
      }
    }
    // One job per chosen expert; items of whole 16-row tiles, never across experts.
    moe_jobs_.clear();
    moe_job_tiled_.clear();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t s0 = moe_start_[size_t(e)], cnt = moe_start_[size_t(e) + 1] - s0;
      if (cnt == 0) continue;
      kern::MatMulJob job{w.type, K, nullptr, int64_t(w.nb[1]), cnt, nullptr, 0, nullptr, 0};
      job.w = rp ? rp->data.get() + size_t(e) * rp->ebytes
                 : static_cast<const uint8_t*>(w.data) + size_t(e) * size_t(w.nb[2]);
      job.act_ptr = moe_act_.data() + s0;
      job.decode_tiles = decode_tiles_;
      job.decode_prefetch = decode_prefetch_;
      job.out_ptr = moe_out_.data() + s0;
      moe_jobs_.push_back(job);
      moe_job_tiled_.push_back(moe_tiled_[size_t(e)]);
    }
    // Items are the chosen experts' tiles in expert order, handed out by split_.
    struct Ctx {
      const CpuAvx512Backend* self;
      int64_t N, tiles, count;
      const Tensor* w;
      const Repacked* rp;
      uint8_t* scratch;  // tile_bytes per executor, for tiles repacked on the fly
      size_t tile_bytes;
      bool stale = false;
      WorkSplit* split;
      // Items [b, e): each expert's part as one call.
      void run(int64_t b, int64_t e, int index) const {
        while (b < e) {
          const int64_t jb = b / tiles, t0 = b % tiles, t1 = std::min(tiles, t0 + (e - b));
          const kern::MatMulJob& job = self->moe_jobs_[size_t(jb)];
          if (self->moe_job_tiled_[size_t(jb)] && !rp)
            kern::matmul_tiles_repacking(job, N, t0, t1, scratch + size_t(index) * tile_bytes);
          else if (self->moe_job_tiled_[size_t(jb)])
            kern::matmul_tiles_repacked(job, N, t0, t1);
          else
            kern::matmul_rows(job, t0 * kern::kTileRows, std::min(N, t1 * kern::kTileRows));
          b += t1 - t0;
        }
      }
    } ctx;
    ctx.self = this;
    ctx.N = N;
    ctx.tiles = tiles;
    ctx.count = tiles * int64_t(moe_jobs_.size());
    ctx.w = &w;
    ctx.rp = rp;
    ctx.scratch = tile_scratch;
    ctx.tile_bytes = tile_bytes;
    ctx.split = &split_;
    auto worker = [](void* p, int index) {
      auto* c = static_cast<Ctx*>(p);
      if (c->rp && index == 1) c->stale = fingerprint(*c->w) != c->rp->fp;
      int64_t b, e;
      while (c->split->next(index, b, e)) c->run(b, e, index);
    };
    const bool alone = execs <= 1 || ctx.count < 2;
    split_.reset(ctx.count, alone ? 1 : execs, 1);
    if (alone) {
      ctx.stale = rp && fingerprint(w) != rp->fp;
      if (!ctx.stale) worker(&ctx, 0);
    } else {
      pool_.parallel(worker, &ctx);
    }
    if (ctx.stale) {  // the memory now holds another tensor: drop the copy, compute from it
      weights_.drop(w.data);
      return mat_mul_id(w, x, ids, dst, first, end);
    }
    return true;
  }

  // Every sequence of the step at once. Items: per sequence, (KV head, a slice of up to
  // 16 of its query heads, a tile of consecutive tokens), 16 query rows where the group
  // allows (kern::attention_tile), in KV head order so an executor's items reuse one
  // head's K/V rows from its caches. Items grow with the token (causal), so they are
  // handed out by split_, which balances the executors by stealing.
  // With a sliding window, or value heads of their own size (latent attention), each
  // item is one token (its rows then share the window's first position and, latent,
  // one block of transposed keys); sinks are per query head.
  bool attention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& table, const Tensor& dst,
                 float scale, int64_t window, const float* sinks) {
    const int64_t hd = q.ne[0], n_head = q.ne[1];
    if (hd > 1024) return false;  // declined by supports()
    const int64_t n_kv = kc.ne[0] / hd;
    const int64_t group = n_head / n_kv;
    if (group <= 0 || q.ne[2] <= 0) return true;
    const int64_t gs = std::min<int64_t>(group, 16), slices = (group + gs - 1) / gs;
    const int64_t dv = dst.ne[0];
    const int64_t tq = window > 0 || dv != hd ? 1 : std::max<int64_t>(1, 16 / gs);
    // Cache row pointers per position of each sequence (a KV head's part starts kvh * hd
    // into a row), gathered on this thread through the block tables (checked by
    // check_run_state) before the dispatch.
    size_t total = 0;
    for (int64_t s = 0; s < table.ne[1]; ++s) {
      const int32_t* col = table.row<int32_t>(s);
      if (col[kSeqCount] > 0) total += 2 * size_t(int64_t(col[kSeqPos0]) + col[kSeqCount]);
    }
    rows_.resize(total);
    attn_seqs_.clear();
    int64_t count = 0;
    size_t off = 0;
    for (int64_t s = 0; s < table.ne[1]; ++s) {
      const int32_t* col = table.row<int32_t>(s);
      if (col[kSeqCount] <= 0) continue;
      const int64_t L = int64_t(col[kSeqPos0]) + col[kSeqCount];
      AttnSeq a;
      a.krows = rows_.data() + off;
      a.vrows = rows_.data() + off + L;
      // Rows before the earliest position the window lets any token see may be released.
      const int64_t seen = window > 0 ? std::max<int64_t>(0, int64_t(col[kSeqPos0]) - window + 1) : 0;
      sequence_rows(kc, col, L, rows_.data() + off, seen);
      sequence_rows(vc, col, L, rows_.data() + off + L, seen);
      off += 2 * size_t(L);
      a.first = col[kSeqFirst];
      a.T = col[kSeqCount];
      a.p0 = col[kSeqPos0];
      a.tiles = (a.T + tq - 1) / tq;
      a.item0 = count;
      count += n_kv * slices * a.tiles;
      attn_seqs_.push_back(a);
    }
    struct Ctx {
      const Tensor *q, *dst;
      const std::vector<AttnSeq>* seqs;
      int64_t hd, dv, group, gs, slices, tq, window;
      float scale;
      const float* sinks;
      WorkSplit* split;
      void run(int64_t b, int64_t e) const {
        const float* qs[16];
        float* outs[16];
        int64_t len[16];
        float sink[16];
        size_t si = 0;
        for (int64_t item = b; item < e; ++item) {
          while (si + 1 < seqs->size() && (*seqs)[si + 1].item0 <= item) ++si;
          while ((*seqs)[si].item0 > item) --si;
          const AttnSeq& a = (*seqs)[si];
          const int64_t local = item - a.item0;
          const int64_t kvh = local / (slices * a.tiles), slice = local / a.tiles % slices, t0 = local % a.tiles * tq;
          const int64_t h0 = kvh * group + slice * gs, nh = std::min(gs, group - slice * gs);
          const int64_t nt = std::min(tq, a.T - t0);
          int n = 0;
          // A window's first position (one token per item): every row starts there.
          const int64_t start = window > 0 ? std::max<int64_t>(0, a.p0 + t0 - window + 1) : 0;
          for (int64_t t = t0; t < t0 + nt; ++t)
            for (int64_t h = h0; h < h0 + nh; ++h, ++n) {
              qs[n] = q->row<float>(h, a.first + t), outs[n] = dst->row<float>(h, a.first + t);
              len[n] = a.p0 + t + 1 - start;
              if (sinks) sink[n] = sinks[h];
            }
          if (dv == hd)
            kern::attention_tile(qs, outs, len, n, hd, a.krows + start, a.vrows + start, kvh * hd, scale,
                                 sinks ? sink : nullptr);
          else  // value heads of their own size (latent attention): one token an item
            kern::attention_heads_dv(qs, outs, n, hd, dv, a.krows + start, a.vrows + start, kvh * hd, kvh * dv,
                                     len[0], scale, sinks ? sink : nullptr);
        }
      }
    } ctx{&q, &dst, &attn_seqs_, hd, dv, group, gs, slices, tq, window, scale, sinks, &split_};
    const int execs = pool_ ? pool_.executor_count() : 1;
    if (execs <= 1 || count < 2) {
      ctx.run(0, count);
      return true;
    }
    split_.reset(count, execs, 1);
    pool_.parallel(
        [](void* p, int index) {
          const Ctx& c = *static_cast<const Ctx*>(p);
          int64_t b, e;
          while (c.split->next(index, b, e)) c.run(b, e);
        },
        &ctx);
    return true;
  }

  // One value head per task; the kernel needs evenly spaced token rows (a view of the
  // convolution output is): supports() declines anything else.
  bool gated_delta_net(const Tensor& qkv, const Tensor& g, const Tensor& beta, const Tensor& dst, const Node& n) {
    const int64_t Hk = n.i[2], S = n.i[3], Hv = dst.ne[1], T = qkv.ne[1];
    if (!delta_net_strides_ok(qkv, g, beta, dst, S) || Hk <= 0 || S <= 0) return false;
    float* state_all = n.kv->recurrent_state(n.i[0], n.i[1]);
    const float* row0 = frow(qkv, 0);
    parallel_for(Hv, [&](int64_t h0, int64_t h1) {
      std::vector<float> scratch(size_t(2 * S));  // normalized q and k, once per executor
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h % Hk;
        kern::DeltaNetHead head;
        head.q = row0 + kh * S;
        head.k = row0 + (Hk + kh) * S;
        head.v = row0 + (2 * Hk + h) * S;
        head.qkv_stride = int64_t(qkv.nb[1] / sizeof(float));
        head.g = frow(g, 0) + h;
        head.beta = frow(beta, 0) + h;
        head.gb_stride = int64_t(g.nb[1] / sizeof(float));
        head.state = state_all + h * S * S;
        head.out = dst.row<float>(h, 0);
        head.out_stride = int64_t(dst.nb[2] / sizeof(float));
        head.S = S;
        head.T = T;
        head.eps = n.f[0];
        head.scratch = scratch.data();
        kern::gated_delta_net_head(head);
      }
    });
    return true;
  }

  PoolRef pool_ = nullptr;
  WeightStore weights_;
  ProductPlanner planner_{weights_};
  Scratch act_;
  ActKey act_key_;
  std::vector<const uint16_t*> rows_;
  std::vector<float> rope_cs_;      // Rope: (cos, sin) per pair per token
  std::vector<int32_t> topk_order_;  // TopK: ids of one row, sorted
  // Attention: one sequence of the step (its cache rows, token rows and first item).
  struct AttnSeq {
    const uint16_t* const* krows = nullptr;
    const uint16_t* const* vrows = nullptr;
    int64_t first = 0, T = 0, p0 = 0, tiles = 0, item0 = 0;
  };
  std::vector<AttnSeq> attn_seqs_;
  // MatMulId scratch (reused between calls).
  std::vector<int64_t> moe_start_, moe_fill_;
  std::vector<const uint8_t*> moe_act_;
  std::vector<float*> moe_out_;
  std::vector<kern::MatMulJob> moe_jobs_;
  std::vector<bool> moe_tiled_;          // per expert: read as repacked tiles this call
  std::vector<bool> moe_job_tiled_;      // per job, likewise
  Scratch tile_scratch_, tiled_act_;
  WorkSplit split_;     // the items of the current product dispatch
  ProductGroup next_;  // the next product's group, found for its idle prefetch
  // An idle-prefetch hint points into a GGUF-layout weight (a row-kernel product of
  // the format-kernel types): cancelled at the end of the execute call, since that memory
  // is the caller's and may be freed after it.
  bool row_hints_ = false;
  int decode_tiles_ = 1;         // MatMulJob::decode_tiles for repacked products
  bool decode_prefetch_ = false;  // MatMulJob::decode_prefetch
  std::unordered_map<const void*, Repacked> repacked_;
};

}  // namespace

int default_decode_tiles() {
  const CpuFeatures& f = cpu_features();
  return f.vendor == "AuthenticAMD" && f.family >= 0x1A ? 4 : 1;
}

bool default_decode_prefetch() {
  const CpuFeatures& f = cpu_features();
  return f.vendor == "AuthenticAMD" && f.family >= 0x1A;
}

std::unique_ptr<Backend> make_backend(PoolRef pool, bool repack, int decode_tiles, int decode_prefetch) {
  std::string why;
  if (!usable(&why)) throw Error("cpu_avx512 cannot run on this CPU: " + why);
  if (decode_tiles == 0) decode_tiles = default_decode_tiles();
  if (decode_tiles != 1 && decode_tiles != 2 && decode_tiles != 4)
    throw Error("cpu_avx512: decode_tiles must be 1, 2 or 4 (got " + std::to_string(decode_tiles) + ")");
  if (decode_prefetch < -1 || decode_prefetch > 1)
    throw Error("cpu_avx512: decode_prefetch must be -1, 0 or 1 (got " + std::to_string(decode_prefetch) + ")");
  const bool pf = decode_prefetch < 0 ? default_decode_prefetch() : decode_prefetch == 1;
  return std::make_unique<CpuAvx512Backend>(pool, repack, decode_tiles, pf);
}

}  // namespace tessera::cpu_avx512
