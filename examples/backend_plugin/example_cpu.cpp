// example_cpu: a small but complete tessera backend, built out of tree against the
// installed SDK (see README.md here and docs/plugins.md). It runs a few ops natively
// on plain F32 tensors — Add, Mul, Silu, SwiGlu, Softmax, RmsNorm and MatMul with F32
// weights — and declines every other node with the reason, so the scheduler gives
// those to the next backend by rank. `tessera conformance --backend example_cpu`
// checks every case it accepts against cpu_scalar.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/plugin_abi.h"

namespace {

using namespace tessera;

// The one deliberate bug of the conformance mutation test: built with
// EXAMPLE_CPU_MUTANT, MatMul adds 1e-3 to one output element.
#ifdef EXAMPLE_CPU_MUTANT
constexpr bool kMutant = true;
#else
constexpr bool kMutant = false;
#endif

const Tensor& T(const Graph& g, int32_t i) { return g.tensor(i); }

// Dense F32 rows: what every kernel below indexes as r * ne[0] + i.
bool dense_f32(const Tensor& t) { return t.type == DType::F32 && t.is_contiguous(); }

class ExampleCpu final : public Backend {
 public:
  std::string name() const override { return kMutant ? "example_cpu_mutant" : "example_cpu"; }

  OpSupport supports(const Graph& g, const Node& n) const override {
    auto all_dense = [&](std::initializer_list<int32_t> ts) -> OpSupport {
      for (int32_t t : ts) {
        if (t < 0) return OpSupport::no("a source or the destination is missing");
        if (!dense_f32(T(g, t))) return OpSupport::no("only contiguous F32 tensors");
      }
      return OpSupport::yes();
    };
    auto same_shape = [&](int32_t a, int32_t b) {
      for (int d = 0; d < Tensor::kMaxDims; ++d)
        if (T(g, a).ne[d] != T(g, b).ne[d]) return false;
      return true;
    };
    switch (n.op) {
      case Op::Add:
      case Op::Mul:
      case Op::SwiGlu: {
        OpSupport s = all_dense({n.src[0], n.src[1], n.dst});
        if (!s.supported) return s;
        if (!same_shape(n.src[0], n.src[1]) || !same_shape(n.src[0], n.dst))
          return OpSupport::no("only operands of one shape (no broadcasting)");
        return s;
      }
      case Op::Silu:
      case Op::Softmax: {
        OpSupport s = all_dense({n.src[0], n.dst});
        if (s.supported && !same_shape(n.src[0], n.dst)) return OpSupport::no("source and destination differ in shape");
        return s;
      }
      case Op::RmsNorm: {
        OpSupport s = all_dense({n.src[0], n.dst});
        if (!s.supported) return s;
        if (!same_shape(n.src[0], n.dst)) return OpSupport::no("source and destination differ in shape");
        if (n.src[1] >= 0 && (!dense_f32(T(g, n.src[1])) || T(g, n.src[1]).nelements() != T(g, n.src[0]).ne[0]))
          return OpSupport::no("the weight must be F32 [K]");
        if (!(n.f[0] >= 0.0f) || !std::isfinite(n.f[0])) return OpSupport::no("eps must be finite and >= 0");
        return s;
      }
      case Op::MatMul: {
        OpSupport s = all_dense({n.src[0], n.src[1], n.dst});
        if (!s.supported) return OpSupport::no("MatMul: only F32 weights and activations (" + s.reason + ")");
        const Tensor &w = T(g, n.src[0]), &x = T(g, n.src[1]), &d = T(g, n.dst);
        if (w.ne[2] != 1 || w.ne[3] != 1) return OpSupport::no("MatMul: the weight must be 2-D");
        if (x.ne[0] != w.ne[0]) return OpSupport::no("MatMul: activation rows are not K long");
        if (d.ne[0] != w.ne[1] || d.nrows() != x.nrows()) return OpSupport::no("MatMul: destination is not [N, rows]");
        if (d.data != nullptr && d.data == x.data) return OpSupport::no("MatMul: destination aliases the activation");
        return s;
      }
      default:
        return OpSupport::no(std::string("op ") + std::string(op_name(n.op)) + " is not implemented by example_cpu");
    }
  }

  void execute(Graph& g, size_t first, size_t count) override {
    for (size_t k = first; k < first + count; ++k) {
      const Node& n = g.nodes()[k];
      if (OpSupport s = supports(g, n); !s.supported)
        throw Error("example_cpu: node " + std::to_string(k) + " (" + std::string(op_name(n.op)) + "): " + s.reason);
      run(g, n);
    }
  }

 private:
  static const float* in(const Graph& g, int32_t t) { return static_cast<const float*>(T(g, t).data); }
  static float* out(const Graph& g, int32_t t) { return static_cast<float*>(T(g, t).data); }
  static float silu(float x) { return x / (1.0f + std::exp(-x)); }

  static void run(Graph& g, const Node& n) {
    const Tensor& d = T(g, n.dst);
    const int64_t K = d.ne[0], rows = d.nrows(), ne = d.nelements();
    float* y = out(g, n.dst);
    switch (n.op) {
      case Op::Add:
        for (int64_t i = 0; i < ne; ++i) y[i] = in(g, n.src[0])[i] + in(g, n.src[1])[i];
        break;
      case Op::Mul:
        for (int64_t i = 0; i < ne; ++i) y[i] = in(g, n.src[0])[i] * in(g, n.src[1])[i];
        break;
      case Op::SwiGlu:
        for (int64_t i = 0; i < ne; ++i) y[i] = silu(in(g, n.src[0])[i]) * in(g, n.src[1])[i];
        break;
      case Op::Silu:
        for (int64_t i = 0; i < ne; ++i) y[i] = silu(in(g, n.src[0])[i]);
        break;
      case Op::Softmax:
        for (int64_t r = 0; r < rows; ++r) {
          const float* x = in(g, n.src[0]) + r * K;
          float mx = -INFINITY;
          for (int64_t i = 0; i < K; ++i) mx = std::fmax(mx, x[i]);
          double sum = 0.0;
          for (int64_t i = 0; i < K; ++i) sum += double(y[r * K + i] = std::exp(x[i] - mx));
          const float inv = float(1.0 / sum);
          for (int64_t i = 0; i < K; ++i) y[r * K + i] *= inv;
        }
        break;
      case Op::RmsNorm: {
        const float* w = n.src[1] >= 0 ? in(g, n.src[1]) : nullptr;
        for (int64_t r = 0; r < rows; ++r) {
          const float* x = in(g, n.src[0]) + r * K;
          double sum = 0.0;
          for (int64_t i = 0; i < K; ++i) sum += double(x[i] * x[i]);
          const float scale = 1.0f / std::sqrt(float(sum / double(K)) + n.f[0]);
          for (int64_t i = 0; i < K; ++i) y[r * K + i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
        }
        break;
      }
      case Op::MatMul: {
        const Tensor& w = T(g, n.src[0]);
        const int64_t Kw = w.ne[0], N = w.ne[1];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < N; ++o) {
            const float* wr = in(g, n.src[0]) + o * Kw;
            const float* x = in(g, n.src[1]) + r * Kw;
            double s = 0.0;
            for (int64_t i = 0; i < Kw; ++i) s += double(wr[i] * x[i]);
            y[r * N + o] = float(s);
          }
        if (kMutant && ne > 0) y[ne / 2] += 1e-3f;
        break;
      }
      default:
        throw Error("example_cpu: unreachable op");
    }
  }
};

int32_t probe(char* reason, size_t size) {
  std::snprintf(reason, size, "portable C++, F32 only; an example to build plugins from");
  return 2;  // below cpu_scalar (10): used by default only for what is asked of it by name
}

void* create(const TesseraCreateArgs*, char* error, size_t size) {
  try {
    return static_cast<Backend*>(new ExampleCpu());  // the host casts void* back to Backend*
  } catch (const std::exception& e) {
    std::snprintf(error, size, "%s", e.what());
    return nullptr;
  }
}

void destroy(void* p) { delete static_cast<Backend*>(p); }

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, sizeof(TesseraPluginDescriptor),
    kMutant ? "example_cpu_mutant" : "example_cpu", TESSERA_PLUGIN_BACKEND,
    "example: F32 add/mul/silu/swiglu/softmax/rms_norm/mat_mul", probe, create, destroy};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
