// The op schema (see op_schema.h): each op's contract, checked once per plan, and the
// run-time state checked before each run.
#include "tessera/op_schema.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/kv_access.h"
#include "tessera/quant_blocks.h"

namespace tessera::op_schema {
namespace {

std::atomic<uint64_t> g_checks{0};

std::string shape_str(const Tensor& t) {
  std::string s = "[";
  int last = Tensor::kMaxDims - 1;
  while (last > 0 && t.ne[last] == 1) --last;
  for (int d = 0; d <= last; ++d) {
    if (d) s += ", ";
    s += std::to_string(t.ne[d]);
  }
  return s + "]";
}

std::string desc(const Tensor& t) {
  std::string s(dtype_name(t.type));
  s += shape_str(t);
  if (!t.name.empty()) s += " '" + t.name + "'";
  return s;
}

bool same_shape(const Tensor& a, const Tensor& b) {
  for (int d = 0; d < Tensor::kMaxDims; ++d)
    if (a.ne[d] != b.ne[d]) return false;
  return true;
}

// b can be broadcast (repeated) over a: every dimension of b divides a's.
bool can_repeat(const Tensor& b, const Tensor& a) {
  for (int d = 0; d < Tensor::kMaxDims; ++d)
    if (b.ne[d] <= 0 || a.ne[d] % b.ne[d] != 0) return false;
  return true;
}

// The weight / table dtypes the ops take (every one cpu_scalar computes).
bool known_matrix_type(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
    case DType::MXFP4:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

int64_t block_elems(DType t) { return dtype_traits(t).block_elems; }


// The plan-time contract: returns an empty string when the node is fine, the reason
// otherwise.

class Checker {
 public:
  Checker(const Graph& g, const Node& n) : g_(g), n_(n) {}

  std::string run() const {
    switch (n_.op) {
      case Op::GetRows: return get_rows();
      case Op::RmsNorm: return rms_norm();
      case Op::MatMul: return mat_mul();
      case Op::Rope: return rope();
      case Op::KvWrite: return kv_write();
      case Op::Attention: return attention();
      case Op::Softmax:
      case Op::Silu: return unary();
      case Op::SwiGlu: return swiglu();
      case Op::Add:
      case Op::Mul: return binary();
      case Op::Argmax: return argmax();
      case Op::TopK: return top_k();
      case Op::GatherCols: return gather_cols();
      case Op::MatMulId: return mat_mul_id();
      case Op::MoeCombine: return moe_combine();
      case Op::Sigmoid:
      case Op::Softplus: return unary();
      case Op::Cont: return cont();
      case Op::SsmConv: return ssm_conv();
      case Op::GatedDeltaNet: return gated_delta_net();
      case Op::GeGlu: return swiglu();
      case Op::NormalizeRows: return normalize_rows();
      case Op::SwiGluOai: return swiglu_oai();
      case Op::Concat: return concat();
      case Op::GroupLimit: return group_limit();
      case Op::Count: break;
    }
    return "unknown op " + std::to_string(int(n_.op));
  }

 private:
  // Tensor index checks.
  std::string need(int32_t idx, const char* what) const {
    if (idx < 0) return std::string("missing ") + what;
    if (size_t(idx) >= g_.tensor_count())
      return std::string(what) + " tensor index " + std::to_string(idx) + " out of range";
    return {};
  }
  const Tensor& t(int32_t idx) const { return g_.tensor(idx); }

  // F32/I32 tensors must have contiguous rows (element stride = element size).
  static std::string plain(const Tensor& x, DType type, const char* what) {
    if (x.type != type)
      return std::string(what) + " must be " + std::string(dtype_name(type)) + ", got " + desc(x);
    if (x.nb[0] != dtype_traits(type).block_bytes)
      return std::string(what) + " " + desc(x) + " has non-contiguous rows (nb[0] = " + std::to_string(x.nb[0]) + ")";
    return {};
  }

#define TRY(expr)                      \
  do {                                 \
    std::string _r = (expr);           \
    if (!_r.empty()) return _r;        \
  } while (0)

  std::string get_rows() const {
    TRY(need(n_.src[0], "table (src0)"));
    TRY(need(n_.src[1], "ids (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &tab = t(n_.src[0]), &ids = t(n_.src[1]), &dst = t(n_.dst);
    if (!known_matrix_type(tab.type)) return "unsupported table dtype " + desc(tab);
    if (tab.ne[0] % block_elems(tab.type) != 0)
      return "table row length " + std::to_string(tab.ne[0]) + " is not a multiple of the " +
             std::string(dtype_name(tab.type)) + " block size";
    if (tab.ne[2] != 1 || tab.ne[3] != 1) return "table must be 2-D, got " + desc(tab);
    TRY(plain(ids, DType::I32, "ids"));
    if (ids.ne[1] != 1 || ids.ne[2] != 1 || ids.ne[3] != 1) return "ids must be 1-D, got " + desc(ids);
    TRY(plain(dst, DType::F32, "dst"));
    if (dst.ne[0] != tab.ne[0] || dst.ne[1] != ids.ne[0] || dst.ne[2] != 1 || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [" + std::to_string(tab.ne[0]) + ", " + std::to_string(ids.ne[0]) + "]";
    return {};
  }

  std::string rms_norm() const {
    TRY(need(n_.src[0], "x (src0)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(dst, DType::F32, "dst"));
    if (!same_shape(x, dst)) return "dst " + desc(dst) + " must have the shape of x " + desc(x);
    if (n_.src[1] >= 0) {
      TRY(need(n_.src[1], "weight (src1)"));
      const Tensor& w = t(n_.src[1]);
      TRY(plain(w, DType::F32, "weight"));
      if (w.ne[0] != x.ne[0] || w.nrows() != 1) return "weight " + desc(w) + " must be [" + std::to_string(x.ne[0]) + "]";
    }
    if (!(n_.f[0] >= 0.0f) || !std::isfinite(n_.f[0])) return "eps (f[0]) must be a finite value >= 0";
    return {};
  }

  std::string mat_mul() const {
    TRY(need(n_.src[0], "weight (src0)"));
    TRY(need(n_.src[1], "x (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &w = t(n_.src[0]), &x = t(n_.src[1]), &dst = t(n_.dst);
    if (!known_matrix_type(w.type)) return "unsupported weight dtype " + desc(w);
    if (w.ne[2] != 1 || w.ne[3] != 1) return "weight must be 2-D, got " + desc(w);
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(dst, DType::F32, "dst"));
    const int64_t K = w.ne[0];
    if (x.ne[0] != K) return "x " + desc(x) + " does not match weight " + desc(w) + " (ne[0] differs)";
    const DType vdt = quant::vec_dot_type(w.type);
    if (K % block_elems(w.type) != 0 || K % block_elems(vdt) != 0)
      return "row length " + std::to_string(K) + " is not a multiple of the block sizes of " +
             std::string(dtype_name(w.type)) + " / " + std::string(dtype_name(vdt));
    if (dst.ne[0] != w.ne[1] || dst.ne[1] != x.ne[1] || dst.ne[2] != x.ne[2] || dst.ne[3] != x.ne[3])
      return "dst " + desc(dst) + " must be [" + std::to_string(w.ne[1]) + ", " + std::to_string(x.ne[1]) + ", " +
             std::to_string(x.ne[2]) + ", " + std::to_string(x.ne[3]) + "] (weight rows by x columns)";
    return {};
  }

  std::string rope() const {
    TRY(need(n_.src[0], "x (src0)"));
    TRY(need(n_.src[1], "pos (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &pos = t(n_.src[1]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(dst, DType::F32, "dst"));
    TRY(plain(pos, DType::I32, "pos"));
    if (x.ne[3] != 1) return "x must be [head_dim, heads, n], got " + desc(x);
    if (!same_shape(x, dst)) return "dst " + desc(dst) + " must have the shape of x " + desc(x);
    if (pos.ne[0] != x.ne[2] || pos.nrows() != 1)
      return "pos " + desc(pos) + " must be [" + std::to_string(x.ne[2]) + "] (one per token)";
    const int32_t n_dims = n_.i[0], mode = n_.i[1];
    if (n_dims <= 0 || n_dims > x.ne[0] || n_dims % 2 != 0)
      return "n_dims (i[0]) = " + std::to_string(n_dims) + " must be even and in (0, " + std::to_string(x.ne[0]) + "]";
    if (mode != kRopeNormal && mode != kRopeNeox && mode != kRopeImrope)
      return "unsupported rope mode (i[1]) " + std::to_string(mode);
    if (mode == kRopeImrope) {
      int32_t total = 0;
      for (int j = 2; j < 6; ++j) {
        if (n_.i[size_t(j)] < 0) return "rope section i[" + std::to_string(j) + "] is negative";
        total += n_.i[size_t(j)];
      }
      if (n_.i[2] + n_.i[3] + n_.i[4] <= 0) return "multi-section rope needs a t, h or w section (i[2..4])";
      if (total > n_dims / 2) return "rope sections (i[2..5]) cover more than the n_dims / 2 rotated pairs";
    }
    if (n_.src[2] >= 0) {
      TRY(need(n_.src[2], "frequency factors (src2)"));
      const Tensor& ff = t(n_.src[2]);
      TRY(plain(ff, DType::F32, "frequency factors (src2)"));
      if (ff.ne[0] < n_dims / 2 || ff.nrows() != 1)
        return "frequency factors " + desc(ff) + " must be [" + std::to_string(n_dims / 2) + "] (one per rotated pair)";
    }
    if (!(n_.f[0] > 0.0f) || !std::isfinite(n_.f[0])) return "freq_base (f[0]) must be > 0";
    if (!(n_.f[1] > 0.0f) || !std::isfinite(n_.f[1])) return "freq_scale (f[1]) must be > 0";
    if (n_.f[2] != 0.0f) {  // YaRN
      if (!std::isfinite(n_.f[2]) || !std::isfinite(n_.f[3])) return "YaRN ext_factor (f[2]) and attn_factor (f[3]) must be finite";
      if (mode == kRopeImrope) return "YaRN is not defined for multi-section rope";
      if (n_.i[6] < 0 || n_.i[7] < n_.i[6] || n_.i[7] > n_dims)
        return "YaRN correction dimensions (i[6], i[7]) = " + std::to_string(n_.i[6]) + ", " + std::to_string(n_.i[7]) +
               " must satisfy 0 <= low <= high <= n_dims";
    }
    return {};
  }

  // One layer's K or V storage (KvCache::k_storage): F16 rows of n_kv*hd in pages.
  static std::string kv_storage(const Tensor& c, int64_t hd, const char* what) {
    if (c.type != DType::F16) return std::string(what) + " must be F16, got " + desc(c);
    if (c.nb[0] != 2 || c.ne[3] != 1)
      return std::string(what) + " " + desc(c) + " must be 3-D with contiguous rows";
    if (hd <= 0 || c.ne[0] % hd != 0)
      return std::string(what) + " " + desc(c) + ": rows of " + std::to_string(c.ne[0]) +
             " are not whole heads of " + std::to_string(hd);
    if (c.nb[1] < size_t(c.ne[0]) * 2 || c.nb[2] < c.nb[1] * size_t(c.ne[1]))
      return std::string(what) + " " + desc(c) + ": rows or pages overlap";
    if (!c.data && !c.buffer) return std::string(what) + " " + desc(c) + " has neither data nor a buffer";
    return {};
  }

  std::string kv_write() const {
    TRY(need(n_.src[0], "x (src0)"));
    TRY(need(n_.src[1], "slots (src1)"));
    TRY(need(n_.dst, "dst (the cache storage)"));
    const Tensor &x = t(n_.src[0]), &slots = t(n_.src[1]), &c = t(n_.dst);
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(slots, DType::I32, "slots"));
    if (x.ne[3] != 1) return "x must be 3-D, got " + desc(x);
    TRY(kv_storage(c, x.ne[0], "dst"));
    if (x.ne[0] * x.ne[1] != c.ne[0])
      return "x " + desc(x) + ": rows of " + std::to_string(x.ne[0] * x.ne[1]) + " elements, the storage's hold " +
             std::to_string(c.ne[0]);
    if (slots.ne[0] != x.ne[2] || slots.nelements() != x.ne[2])
      return "slots " + desc(slots) + " must be [" + std::to_string(x.ne[2]) + "] (one per token)";
    return {};
  }

  std::string attention() const {
    TRY(need(n_.src[0], "q (src0)"));
    TRY(need(n_.src[1], "K storage (src1)"));
    TRY(need(n_.src[2], "V storage (src2)"));
    TRY(need(n_.src[3], "sequence table (src3)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &q = t(n_.src[0]), &kc = t(n_.src[1]), &vc = t(n_.src[2]), &st = t(n_.src[3]), &dst = t(n_.dst);
    TRY(plain(q, DType::F32, "q"));
    TRY(plain(dst, DType::F32, "dst"));
    if (q.ne[3] != 1) return "q must be 3-D, got " + desc(q);
    TRY(kv_storage(kc, q.ne[0], "K storage"));
    // Value heads of dv = dst.ne[0] values: V's rows hold as many heads as K's.
    const int64_t n_kv = kc.ne[0] / q.ne[0], dv = dst.ne[0];
    TRY(kv_storage(vc, dv, "V storage"));
    if (vc.ne[0] != n_kv * dv)
      return "V storage " + desc(vc) + " must hold " + std::to_string(n_kv) + " heads of " + std::to_string(dv) +
             " values per row (K storage " + desc(kc) + ")";
    if (kc.ne[1] != vc.ne[1] || kc.ne[2] != vc.ne[2] || kc.nb[1] != vc.nb[1] || kc.nb[2] != vc.nb[2])
      return "K storage " + desc(kc) + " and V storage " + desc(vc) + " differ in layout";
    if (q.ne[1] % n_kv != 0)
      return "q " + desc(q) + ": " + std::to_string(q.ne[1]) + " heads is not a multiple of the storage's " +
             std::to_string(n_kv) + " KV heads";
    TRY(plain(st, DType::I32, "sequence table"));
    if (st.ne[0] <= kSeqTableHeader || st.ne[2] != 1 || st.ne[3] != 1 || st.nb[1] != size_t(st.ne[0]) * 4)
      return "sequence table " + desc(st) + " must be a contiguous [" + std::to_string(kSeqTableHeader) +
             " + pages, sequences] with at least one page";
    if (dst.ne[1] != q.ne[1] || dst.ne[2] != q.ne[2] || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [dv, " + std::to_string(q.ne[1]) + ", " + std::to_string(q.ne[2]) +
             "] (q " + desc(q) + ")";
    if (!std::isfinite(n_.f[0]) || !(n_.f[0] > 0.0f)) return "scale (f[0]) must be > 0";
    if (n_.i[0] < 0) return "sliding window (i[0]) must be >= 0, got " + std::to_string(n_.i[0]);
    if (n_.src[4] >= 0) {
      TRY(need(n_.src[4], "sinks (src4)"));
      const Tensor& s = t(n_.src[4]);
      TRY(plain(s, DType::F32, "sinks"));
      if (s.ne[0] != q.ne[1] || s.nrows() != 1)
        return "sinks " + desc(s) + " must be [" + std::to_string(q.ne[1]) + "] (one per query head)";
    }
    return {};
  }

  std::string swiglu_oai() const {
    TRY(swiglu());
    if (!std::isfinite(n_.f[0])) return "alpha (f[0]) must be finite";
    if (!std::isfinite(n_.f[1]) || !(n_.f[1] > 0.0f)) return "limit (f[1]) must be > 0";
    return {};
  }

  std::string concat() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.src[1], "src1"));
    TRY(need(n_.dst, "dst"));
    const Tensor &a = t(n_.src[0]), &b = t(n_.src[1]), &dst = t(n_.dst);
    TRY(plain(a, DType::F32, "src0"));
    TRY(plain(b, DType::F32, "src1"));
    TRY(plain(dst, DType::F32, "dst"));
    for (int d = 1; d < Tensor::kMaxDims; ++d)
      if (a.ne[d] != b.ne[d] || dst.ne[d] != a.ne[d])
        return "src0 " + desc(a) + ", src1 " + desc(b) + " and dst " + desc(dst) + " differ beyond dimension 0";
    if (dst.ne[0] != a.ne[0] + b.ne[0])
      return "dst " + desc(dst) + " must have " + std::to_string(a.ne[0] + b.ne[0]) + " values per row";
    return {};
  }

  std::string group_limit() const {
    TRY(unary());
    const int64_t e = t(n_.src[0]).ne[0], groups = n_.i[0], kept = n_.i[1];
    if (groups < 1 || e % groups != 0)
      return "groups (i[0]) = " + std::to_string(groups) + " must divide the row of " + std::to_string(e);
    if (kept < 1 || kept > groups)
      return "kept groups (i[1]) = " + std::to_string(kept) + " must be 1 .. " + std::to_string(groups);
    return {};
  }

  std::string normalize_rows() const {
    TRY(unary());
    if (!std::isfinite(n_.f[0])) return "scale (f[0]) must be finite";
    if (!std::isfinite(n_.f[1]) || !(n_.f[1] > 0.0f)) return "minimum sum (f[1]) must be > 0";
    return {};
  }

  std::string unary() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "src0"));
    TRY(plain(dst, DType::F32, "dst"));
    if (!same_shape(x, dst)) return "dst " + desc(dst) + " must have the shape of src0 " + desc(x);
    return {};
  }

  std::string swiglu() const {
    TRY(unary());
    TRY(need(n_.src[1], "up (src1)"));
    const Tensor &g = t(n_.src[0]), &u = t(n_.src[1]);
    TRY(plain(u, DType::F32, "up"));
    if (!same_shape(g, u)) return "gate " + desc(g) + " and up " + desc(u) + " differ in shape";
    return {};
  }

  std::string binary() const {
    TRY(unary());
    TRY(need(n_.src[1], "src1"));
    const Tensor &a = t(n_.src[0]), &b = t(n_.src[1]);
    TRY(plain(b, DType::F32, "src1"));
    if (!can_repeat(b, a))
      return "src1 " + desc(b) + " cannot be broadcast over src0 " + desc(a) +
             " (needs the same shape, or dimensions dividing src0's)";
    return {};
  }

  std::string argmax() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "src0"));
    TRY(plain(dst, DType::I32, "dst"));
    if (dst.ne[0] != x.nrows() || dst.nrows() != 1)
      return "dst " + desc(dst) + " must be [" + std::to_string(x.nrows()) + "] (one per row of " + desc(x) + ")";
    return {};
  }
  std::string top_k() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "src0"));
    TRY(plain(dst, DType::I32, "dst"));
    if (x.ne[2] != 1 || x.ne[3] != 1) return "src0 must be 2-D, got " + desc(x);
    if (dst.ne[0] < 1 || dst.ne[0] > x.ne[0] || dst.ne[1] != x.ne[1] || dst.ne[2] != 1 || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [k, " + std::to_string(x.ne[1]) + "] with 1 <= k <= " + std::to_string(x.ne[0]);
    return {};
  }

  std::string gather_cols() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.src[1], "ids (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &ids = t(n_.src[1]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "src0"));
    TRY(plain(ids, DType::I32, "ids"));
    TRY(plain(dst, DType::F32, "dst"));
    if (x.ne[2] != 1 || x.ne[3] != 1 || ids.ne[2] != 1 || ids.ne[3] != 1 || ids.ne[1] != x.ne[1])
      return "src0 " + desc(x) + " and ids " + desc(ids) + " must be 2-D with the same column count";
    if (!same_shape(ids, dst)) return "dst " + desc(dst) + " must have the shape of ids " + desc(ids);
    return {};
  }

  std::string mat_mul_id() const {
    TRY(need(n_.src[0], "weights (src0)"));
    TRY(need(n_.src[1], "x (src1)"));
    TRY(need(n_.src[2], "ids (src2)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &w = t(n_.src[0]), &x = t(n_.src[1]), &ids = t(n_.src[2]), &dst = t(n_.dst);
    if (!known_matrix_type(w.type)) return "unsupported weight dtype " + desc(w);
    if (w.ne[3] != 1) return "weights must be [K, N, experts], got " + desc(w);
    if (n_.i[1] > 0 && (n_.i[0] < 0 || n_.i[0] >= n_.i[1] || n_.i[1] > w.ne[2]))
      return "expert range [" + std::to_string(n_.i[0]) + ", " + std::to_string(n_.i[1]) + ") is not inside [0, " +
             std::to_string(w.ne[2]) + ")";
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(ids, DType::I32, "ids"));
    TRY(plain(dst, DType::F32, "dst"));
    const int64_t K = w.ne[0];
    const DType vdt = quant::vec_dot_type(w.type);
    if (K % block_elems(w.type) != 0 || K % block_elems(vdt) != 0)
      return "row length " + std::to_string(K) + " is not a multiple of the block sizes of " +
             std::string(dtype_name(w.type)) + " / " + std::string(dtype_name(vdt));
    if (ids.ne[2] != 1 || ids.ne[3] != 1) return "ids must be [k, n], got " + desc(ids);
    if (x.ne[0] != K || x.ne[2] != ids.ne[1] || x.ne[3] != 1 || (x.ne[1] != 1 && x.ne[1] != ids.ne[0]))
      return "x " + desc(x) + " must be [" + std::to_string(K) + ", 1 or k, " + std::to_string(ids.ne[1]) + "]";
    if (dst.ne[0] != w.ne[1] || dst.ne[1] != ids.ne[0] || dst.ne[2] != ids.ne[1] || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [" + std::to_string(w.ne[1]) + ", " + std::to_string(ids.ne[0]) + ", " +
             std::to_string(ids.ne[1]) + "]";
    return {};
  }

  std::string moe_combine() const {
    TRY(need(n_.src[0], "experts (src0)"));
    TRY(need(n_.src[1], "weights (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &e = t(n_.src[0]), &w = t(n_.src[1]), &dst = t(n_.dst);
    TRY(plain(e, DType::F32, "experts"));
    TRY(plain(w, DType::F32, "weights"));
    TRY(plain(dst, DType::F32, "dst"));
    if (e.ne[3] != 1 || w.ne[0] != e.ne[1] || w.ne[1] != e.ne[2] || w.ne[2] != 1 || w.ne[3] != 1)
      return "weights " + desc(w) + " must be [k, n] for experts " + desc(e);
    if (dst.ne[0] != e.ne[0] || dst.ne[1] != e.ne[2] || dst.ne[2] != 1 || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [" + std::to_string(e.ne[0]) + ", " + std::to_string(e.ne[2]) + "]";
    return {};
  }
  std::string cont() const {
    TRY(need(n_.src[0], "src0"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "src0"));
    TRY(plain(dst, DType::F32, "dst"));
    if (!dst.is_contiguous()) return "dst " + desc(dst) + " must be contiguous";
    if (!same_shape(x, dst)) return "dst " + desc(dst) + " must have the shape of src0 " + desc(x);
    return {};
  }

  std::string recurrent_common() const {
    if (!n_.kv) return "no KV cache (node.kv is null)";
    const TesseraRecurrentInfo& rc = n_.kv->recurrent_config();
    if (rc.n_layers == 0) return "the KV cache has no recurrent state";
    if (n_.i[0] < 0 || n_.i[0] >= rc.n_layers)
      return "recurrent layer (i[0]) " + std::to_string(n_.i[0]) + " out of range [0, " + std::to_string(rc.n_layers) + ")";
    return {};
  }

  std::string ssm_conv() const {
    TRY(recurrent_common());
    TRY(need(n_.src[0], "x (src0)"));
    TRY(need(n_.src[1], "kernel (src1)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &x = t(n_.src[0]), &w = t(n_.src[1]), &dst = t(n_.dst);
    TRY(plain(x, DType::F32, "x"));
    TRY(plain(w, DType::F32, "kernel"));
    TRY(plain(dst, DType::F32, "dst"));
    if (x.ne[2] != 1 || x.ne[3] != 1) return "x must be [channels, n], got " + desc(x);
    if (w.ne[0] < 1 || w.ne[1] != x.ne[0] || w.ne[2] != 1 || w.ne[3] != 1)
      return "kernel " + desc(w) + " must be [d_conv, " + std::to_string(x.ne[0]) + "]";
    if (!same_shape(x, dst)) return "dst " + desc(dst) + " must have the shape of x " + desc(x);
    const int64_t need_elems = (w.ne[0] - 1) * x.ne[0];
    if (n_.kv->recurrent_config().conv_elems != need_elems)
      return "the cache's conv state holds " + std::to_string(n_.kv->recurrent_config().conv_elems) +
             " floats per layer, this convolution needs " + std::to_string(need_elems);
    return {};
  }

  std::string gated_delta_net() const {
    TRY(recurrent_common());
    TRY(need(n_.src[0], "qkv (src0)"));
    TRY(need(n_.src[1], "g (src1)"));
    TRY(need(n_.src[2], "beta (src2)"));
    TRY(need(n_.dst, "dst"));
    const Tensor &qkv = t(n_.src[0]), &gt = t(n_.src[1]), &beta = t(n_.src[2]), &dst = t(n_.dst);
    TRY(plain(qkv, DType::F32, "qkv"));
    TRY(plain(gt, DType::F32, "g"));
    TRY(plain(beta, DType::F32, "beta"));
    TRY(plain(dst, DType::F32, "dst"));
    const int64_t Hk = n_.i[2], S = n_.i[3], Hv = dst.ne[1], n = qkv.ne[1];
    if (Hk <= 0 || S <= 0) return "key heads (i[2]) and head size (i[3]) must be positive";
    if (dst.ne[0] != S || dst.ne[2] != n || dst.ne[3] != 1)
      return "dst " + desc(dst) + " must be [" + std::to_string(S) + ", value heads, " + std::to_string(n) + "]";
    if (Hv % Hk != 0) return std::to_string(Hv) + " value heads is not a multiple of " + std::to_string(Hk) + " key heads";
    if (qkv.ne[0] != (2 * Hk + Hv) * S || qkv.ne[2] != 1 || qkv.ne[3] != 1)
      return "qkv " + desc(qkv) + " must be [" + std::to_string((2 * Hk + Hv) * S) + ", " + std::to_string(n) + "]";
    for (const Tensor* x : {&gt, &beta})
      if (x->ne[0] != Hv || x->ne[1] != n || x->ne[2] != 1 || x->ne[3] != 1)
        return "g and beta must be [" + std::to_string(Hv) + ", " + std::to_string(n) + "], got " + desc(*x);
    if (n_.kv->recurrent_config().state_elems != S * S * Hv)
      return "the cache's recurrent state holds " + std::to_string(n_.kv->recurrent_config().state_elems) +
             " floats per layer, this layer needs " + std::to_string(S * S * Hv);
    if (!(n_.f[0] >= 0.0f) || !std::isfinite(n_.f[0])) return "eps (f[0]) must be a finite value >= 0";
    return {};
  }
#undef TRY

  const Graph& g_;
  const Node& n_;
};

// A KvWrite's slots lie in its storage.
std::string kv_slots(const Graph& g, const Node& n) {
  const Tensor &slots = g.tensor(n.src[1]), &c = g.tensor(n.dst);
  if (!slots.data) return "slots (src1) have no data";
  const int64_t capacity = c.ne[1] * c.ne[2];
  const int32_t* s = static_cast<const int32_t*>(slots.data);
  for (int64_t t = 0; t < slots.ne[0]; ++t)
    if (s[t] < 0 || s[t] >= capacity)
      return "slot " + std::to_string(s[t]) + " (token " + std::to_string(t) + ") outside the storage's [0, " +
             std::to_string(capacity) + ")";
  return {};
}

// An Attention's sequence table: each used column's token rows lie inside q and do not
// overlap another's, and the pages its positions need are in the storage.
std::string seq_table(const Graph& g, const Node& n) {
  const Tensor &q = g.tensor(n.src[0]), &c = g.tensor(n.src[1]), &st = g.tensor(n.src[3]);
  if (!st.data) return "sequence table (src3) has no data";
  const int64_t P = st.ne[0] - kSeqTableHeader, pt = c.ne[1], n_pages = c.ne[2], rows = q.ne[2];
  int64_t covered = 0;
  for (int64_t s = 0; s < st.ne[1]; ++s) {
    const int32_t* col = st.row<int32_t>(s);
    const int64_t first = col[kSeqFirst], count = col[kSeqCount], pos0 = col[kSeqPos0];
    if (count == 0) continue;
    const std::string seq = "sequence table column " + std::to_string(s);
    if (count < 0 || first < 0 || first > rows - count)
      return seq + ": token rows [" + std::to_string(first) + ", +" + std::to_string(count) + ") outside q's " +
             std::to_string(rows);
    if (pos0 < 0) return seq + ": negative first position " + std::to_string(pos0);
    const int64_t pages = (pos0 + count + pt - 1) / pt;
    if (pages > P)
      return seq + ": positions [0, " + std::to_string(pos0 + count) + ") need " + std::to_string(pages) +
             " pages, the table has " + std::to_string(P);
    // A sliding window reads nothing before pos0 - window + 1: those pages may be released.
    const int64_t window = n.i[0], seen = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
    for (int64_t p = seen / pt; p < pages; ++p)
      if (col[kSeqTableHeader + p] < 0 || col[kSeqTableHeader + p] >= n_pages)
        return seq + ": page " + std::to_string(col[kSeqTableHeader + p]) + " (entry " + std::to_string(p) +
               ") outside the storage's [0, " + std::to_string(n_pages) + ")";
    for (int64_t o = 0; o < s; ++o) {  // few sequences per step: quadratic is fine
      const int32_t* other = st.row<int32_t>(o);
      if (other[kSeqCount] > 0 && first < other[kSeqFirst] + other[kSeqCount] && other[kSeqFirst] < first + count)
        return seq + ": token rows overlap column " + std::to_string(o) + "'s";
    }
    covered += count;
  }
  if (covered != rows)
    return "the sequence table covers " + std::to_string(covered) + " of q's " + std::to_string(rows) + " token rows";
  return {};
}

}  // namespace

std::string check(const Graph& graph, const Node& node) {
  g_checks.fetch_add(1, std::memory_order_relaxed);
  std::string why = Checker(graph, node).run();
  if (why.empty()) return why;
  return std::string(op_name(node.op)) + ": " + why;
}

std::string check_run_state(const Graph& graph, const Node& node) {
  switch (node.op) {
    case Op::KvWrite: {
      std::string why = kv_slots(graph, node);
      if (!why.empty()) return why;
      break;
    }
    case Op::Attention: {
      std::string why = seq_table(graph, node);
      if (!why.empty()) return why;
      break;
    }
    case Op::SsmConv:
    case Op::GatedDeltaNet:
      if (!node.kv->has_sequence(node.i[1]))
        return "sequence " + std::to_string(node.i[1]) + " does not exist in the KV cache";
      break;
    default: break;
  }
  // A tensor in a backend's device memory has no host address but a buffer.
  auto placed = [&](int32_t i) { return graph.tensor(i).data || graph.tensor(i).buffer; };
  for (size_t s = 0; s < node.src.size(); ++s)
    if (node.src[s] >= 0 && !placed(node.src[s])) return "src" + std::to_string(s) + " has no data";
  if (node.dst >= 0 && !placed(node.dst)) return "dst has no data";
  return {};
}

void check_range(const char* backend, const Graph& graph, size_t first, size_t count) {
  const size_t n = graph.nodes().size();
  if (first > n || count > n - first)
    throw Error(std::string(backend) + ": node range [" + std::to_string(first) + ", " + std::to_string(first + count) +
                ") exceeds the graph's " + std::to_string(n) + " nodes");
}

void validate_for_execute(const Backend& be, const Graph& graph, size_t first, size_t count) {
  const std::string name = be.name();
  check_range(name.c_str(), graph, first, count);
  for (size_t k = first; k < first + count; ++k) {
    const Node& n = graph.nodes()[k];
    std::string why = check(graph, n);
    if (why.empty()) why = check_run_state(graph, n);
    if (why.empty()) {
      const OpSupport s = be.supports(graph, n);
      if (!s.supported) why = s.reason.empty() ? std::string(op_name(n.op)) + ": not supported" : s.reason;
    }
    if (!why.empty()) throw Error(name + ": " + describe_node(graph, k) + ": " + why);
  }
}

uint64_t checks_made() { return g_checks.load(std::memory_order_relaxed); }

std::string tensor_desc(const Tensor& t) { return desc(t); }

}  // namespace tessera::op_schema
