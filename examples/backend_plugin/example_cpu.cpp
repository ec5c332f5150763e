// example_cpu: a small but complete tessera backend plugin, built out of tree against
// the installed SDK (see README.md here and docs/plugins.md). It speaks only the C
// plugin ABI (tessera/plugin_abi.h): it includes no other tessera header and links no
// tessera library, so it may be built with any C++ compiler, standard library or
// std::string ABI. Inside it is ordinary C++; at the boundary only C structs cross, and
// every function catches its exceptions and turns them into a return code and a
// message.
//
// It runs a few ops natively on plain F32 tensors — Add, Mul, Silu, SwiGlu, Softmax,
// RmsNorm and MatMul with F32 weights — and declines every other node with the reason,
// so the scheduler gives those to the next backend by rank. MatMul is split over the
// host's worker pool when the host passed one. `tessera conformance --backend
// example_cpu` checks every case it accepts against cpu_scalar.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "tessera/plugin_abi.h"

namespace {

// The one deliberate bug of the conformance mutation test: built with
// EXAMPLE_CPU_MUTANT, MatMul adds 1e-3 to one output element.
#ifdef EXAMPLE_CPU_MUTANT
constexpr bool kMutant = true;
#else
constexpr bool kMutant = false;
#endif
constexpr const char* kName = kMutant ? "example_cpu_mutant" : "example_cpu";

// ---- Helpers ----

// Every message goes into the caller's buffer, truncated and NUL-terminated. Formatting
// allocates nothing, so the catch handlers below cannot throw again.
__attribute__((format(printf, 3, 4))) void say(char* buf, size_t size, const char* format, ...) noexcept {
  if (!buf || !size) return;
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, size, format, args);
  va_end(args);
}
void put(char* buf, size_t size, const char* text) noexcept { say(buf, size, "%s", text); }

const char* op_name(uint32_t op) {
  static const char* const kNames[TESSERA_OP_COUNT] = {
      "get_rows", "rms_norm", "mat_mul", "rope", "kv_write", "attention", "softmax",
      "silu", "swiglu", "add", "mul", "argmax", "top_k", "gather_cols", "mat_mul_id",
      "moe_combine", "sigmoid", "softplus", "cont", "ssm_conv", "gated_delta_net",
      "geglu", "normalize_rows", "swiglu_oai", "concat", "group_limit"};
  // A name missing here (an op added to the ABI after this table) stays NULL.
  return op < TESSERA_OP_COUNT && kNames[op] ? kNames[op] : "unknown";
}

int64_t nelements(const TesseraTensor& t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }
int64_t nrows(const TesseraTensor& t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

// Dense F32 rows: what every kernel below indexes as r * ne[0] + i.
bool dense_f32(const TesseraTensor& t) {
  if (t.type != TESSERA_DTYPE_F32 || t.nb[0] != sizeof(float)) return false;
  for (int d = 1; d < 4; ++d)
    if (t.nb[d] != t.nb[d - 1] * size_t(t.ne[d - 1])) return false;
  return true;
}

bool same_shape(const TesseraTensor& a, const TesseraTensor& b) {
  for (int d = 0; d < 4; ++d)
    if (a.ne[d] != b.ne[d]) return false;
  return true;
}

// One backend instance: what create() returns as `self`.
struct Instance {
  TesseraPool* pool = nullptr;  // the host's worker pool, or NULL: run on the caller
};

// ---- supports: "" when the node runs here, else why not ----

// The host asks only about nodes that satisfy the core's op schema (arity, dtypes,
// shapes as the op defines them); this says what example_cpu adds to that. The answer
// depends only on dtypes, shapes, strides and parameters (the host caches it).
std::string decline_reason(const TesseraGraph& g, const TesseraNode& n) {
  auto T = [&](int32_t i) -> const TesseraTensor& { return g.tensors[i]; };
  auto all_dense = [&](std::initializer_list<int32_t> ts) -> std::string {
    for (int32_t t : ts) {
      if (t < 0 || size_t(t) >= g.tensor_count) return "a source or the destination is missing";
      if (!dense_f32(T(t))) return "only contiguous F32 tensors";
    }
    return "";
  };
  switch (n.op) {
    case TESSERA_OP_ADD:
    case TESSERA_OP_MUL:
    case TESSERA_OP_SWIGLU: {
      if (std::string why = all_dense({n.src[0], n.src[1], n.dst}); !why.empty()) return why;
      if (!same_shape(T(n.src[0]), T(n.src[1])) || !same_shape(T(n.src[0]), T(n.dst)))
        return "only operands of one shape (no broadcasting)";
      return "";
    }
    case TESSERA_OP_SILU:
    case TESSERA_OP_SOFTMAX: {
      if (std::string why = all_dense({n.src[0], n.dst}); !why.empty()) return why;
      if (!same_shape(T(n.src[0]), T(n.dst))) return "source and destination differ in shape";
      return "";
    }
    case TESSERA_OP_RMS_NORM: {
      if (std::string why = all_dense({n.src[0], n.dst}); !why.empty()) return why;
      if (!same_shape(T(n.src[0]), T(n.dst))) return "source and destination differ in shape";
      if (n.src[1] >= 0 && (!dense_f32(T(n.src[1])) || nelements(T(n.src[1])) != T(n.src[0]).ne[0]))
        return "the weight must be F32 [K]";
      return "";
    }
    case TESSERA_OP_MAT_MUL: {
      if (std::string why = all_dense({n.src[0], n.src[1], n.dst}); !why.empty())
        return "MatMul: only F32 weights and activations (" + why + ")";
      const TesseraTensor &w = T(n.src[0]), &x = T(n.src[1]), &d = T(n.dst);
      if (w.ne[2] != 1 || w.ne[3] != 1) return "MatMul: the weight must be 2-D";
      if (x.ne[0] != w.ne[0]) return "MatMul: activation rows are not K long";
      if (d.ne[0] != w.ne[1] || nrows(d) != nrows(x)) return "MatMul: destination is not [N, rows]";
      // Decided on shapes alone: the data pointers are not part of what the host caches.
      return "";
    }
    default:
      return std::string("op ") + op_name(n.op) + " is not implemented by " + kName;
  }
}

// ---- The worker pool ----

// body(begin, end) over [0, n), split into one contiguous chunk per executor of the
// host's pool, or run on the caller without one. A task must not throw across the
// host's dispatch, so each catches and reports; the first failure is rethrown here.
template <typename Body>
void parallel_for(TesseraPool* pool, int64_t n, const Body& body) {
  constexpr int kMaxParts = 64;
  int parts = 1;
  if (pool && TESSERA_HAS_FIELD(pool->api, TesseraPoolApi, dispatch) && pool->api->dispatch)
    parts = pool->executors < kMaxParts ? pool->executors : kMaxParts;
  if (int64_t(parts) > n) parts = int(n);
  if (parts <= 1) {
    if (n > 0) body(int64_t(0), n);
    return;
  }
  struct Ctx {
    const Body* body;
    int64_t n;
    int parts;
    bool failed[kMaxParts];
  } ctx{&body, n, parts, {}};
  TesseraTask tasks[kMaxParts];
  for (int i = 0; i < parts; ++i)
    tasks[i] = {[](void* p, int index) {
                  auto* c = static_cast<Ctx*>(p);
                  try {
                    (*c->body)(c->n * index / c->parts, c->n * (index + 1) / c->parts);
                  } catch (...) {
                    c->failed[index] = true;
                  }
                },
                &ctx};
  char error[256] = {};
  if (pool->api->dispatch(pool, tasks, size_t(parts), error, sizeof error) != 0)
    throw std::runtime_error(std::string("worker pool: ") + error);
  for (int i = 0; i < parts; ++i)
    if (ctx.failed[i]) throw std::runtime_error("a MatMul task failed");
}

// ---- Kernels ----

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void run(const Instance& self, const TesseraGraph& g, const TesseraNode& n) {
  auto in = [&](int32_t t) { return static_cast<const float*>(g.tensors[t].data); };
  const TesseraTensor& d = g.tensors[n.dst];
  const int64_t K = d.ne[0], rows = nrows(d), ne = nelements(d);
  float* y = static_cast<float*>(d.data);
  switch (n.op) {
    case TESSERA_OP_ADD:
      for (int64_t i = 0; i < ne; ++i) y[i] = in(n.src[0])[i] + in(n.src[1])[i];
      break;
    case TESSERA_OP_MUL:
      for (int64_t i = 0; i < ne; ++i) y[i] = in(n.src[0])[i] * in(n.src[1])[i];
      break;
    case TESSERA_OP_SWIGLU:
      for (int64_t i = 0; i < ne; ++i) y[i] = silu(in(n.src[0])[i]) * in(n.src[1])[i];
      break;
    case TESSERA_OP_SILU:
      for (int64_t i = 0; i < ne; ++i) y[i] = silu(in(n.src[0])[i]);
      break;
    case TESSERA_OP_SOFTMAX:
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = in(n.src[0]) + r * K;
        float mx = -INFINITY;
        for (int64_t i = 0; i < K; ++i) mx = std::fmax(mx, x[i]);
        double sum = 0.0;
        for (int64_t i = 0; i < K; ++i) sum += double(y[r * K + i] = std::exp(x[i] - mx));
        const float inv = float(1.0 / sum);
        for (int64_t i = 0; i < K; ++i) y[r * K + i] *= inv;
      }
      break;
    case TESSERA_OP_RMS_NORM: {
      const float* w = n.src[1] >= 0 ? in(n.src[1]) : nullptr;
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = in(n.src[0]) + r * K;
        double sum = 0.0;
        for (int64_t i = 0; i < K; ++i) sum += double(x[i] * x[i]);
        const float scale = 1.0f / std::sqrt(float(sum / double(K)) + n.f[0]);
        for (int64_t i = 0; i < K; ++i) y[r * K + i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
      }
      break;
    }
    case TESSERA_OP_MAT_MUL: {
      const TesseraTensor& w = g.tensors[n.src[0]];
      const int64_t Kw = w.ne[0], N = w.ne[1];
      const float* W = in(n.src[0]);
      const float* X = in(n.src[1]);
      // The kernel writes outputs as it goes, so a destination that is the activation
      // itself (a view of it) would be read after being overwritten: refuse it. This
      // is decided here, not in supports(): it depends on data pointers.
      if (static_cast<const void*>(y) == static_cast<const void*>(X))
        throw std::runtime_error("MatMul: destination aliases the activation");
      // Each executor computes whole outputs over every row, so the result does not
      // depend on how many executors there are.
      parallel_for(self.pool, N, [&](int64_t o0, int64_t o1) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = o0; o < o1; ++o) {
            const float* wr = W + o * Kw;
            const float* x = X + r * Kw;
            double s = 0.0;
            for (int64_t i = 0; i < Kw; ++i) s += double(wr[i] * x[i]);
            y[r * N + o] = float(s);
          }
      });
      if (kMutant && ne > 0) y[ne / 2] += 1e-3f;
      break;
    }
    default:  // the host ran supports() on every node it passes
      throw std::runtime_error(std::string("op ") + op_name(n.op) + " is not implemented");
  }
}

// ---- The C functions ----

int32_t probe(char* reason, size_t reason_size) {
  try {
    put(reason, reason_size, "portable C++, F32 only; an example to build plugins from");
    return 2;  // below cpu_scalar (10): used by default only for what is asked of it by name
  } catch (...) {
    return 0;
  }
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  try {
    // Read a field of the host's arguments only when the host's struct_size covers it.
    if (TESSERA_HAS_FIELD(args, TesseraCreateArgs, option_count) && args->option_count > 0) {
      // example_cpu takes no options: refuse any, naming it (a typo should not pass).
      const char* key = args->options[0].key ? args->options[0].key : "";
      say(error, error_size, "%s: unknown option '%s' (example_cpu takes none)", kName, key);
      return nullptr;
    }
    auto* self = new Instance();
    if (TESSERA_HAS_FIELD(args, TesseraCreateArgs, pool)) self->pool = args->pool;
    return self;
  } catch (const std::exception& e) {
    say(error, error_size, "%s: %s", kName, e.what());
  } catch (...) {
    say(error, error_size, "%s: create failed", kName);
  }
  return nullptr;
}

void destroy(void* self) { delete static_cast<Instance*>(self); }

int32_t uses_host_memory(void*) { return 1; }  // computes on mapped weights and graph scratch

int32_t supports(void*, const TesseraGraph* graph, size_t node, char* reason, size_t reason_size) {
  try {
    const std::string why = decline_reason(*graph, graph->nodes[node]);
    if (why.empty()) return 1;
    put(reason, reason_size, why.c_str());
  } catch (const std::exception& e) {
    say(reason, reason_size, "supports failed: %s", e.what());
  } catch (...) {
    put(reason, reason_size, "supports failed");
  }
  return 0;
}

int32_t execute(void* self, TesseraGraph* graph, size_t first, size_t count, uint32_t /*flags*/,
                char* error, size_t error_size) {
  size_t k = first;
  try {
    if (first > graph->node_count || count > graph->node_count - first)
      throw std::runtime_error("node range exceeds the graph");
    for (; k < first + count; ++k) run(*static_cast<Instance*>(self), *graph, graph->nodes[k]);
    return 0;
  } catch (const std::exception& e) {
    const uint32_t op = k < graph->node_count ? graph->nodes[k].op : uint32_t(TESSERA_OP_COUNT);
    say(error, error_size, "%s: node %zu (%s): %s", kName, k, op_name(op), e.what());
  } catch (...) {
    say(error, error_size, "%s: node %zu: unknown error", kName, k);
  }
  return -1;
}

// The backend's function table. The optional functions are left NULL: the host then
// uses weights in place, allocates the KV pages in host memory, counts no transfers
// and never calls them.
const TesseraBackendApi kBackendApi = {
    .struct_size = sizeof(TesseraBackendApi),
    .uses_host_memory = uses_host_memory,
    .supports = supports,
    .execute = execute,
    .prepare_weight = nullptr,
    .weight_bytes = nullptr,
    .transfers = nullptr,
    .buffer_alloc = nullptr,
    .buffer_free = nullptr,
    .buffer_set = nullptr,
    .buffer_get = nullptr,
    .buffer_copy = nullptr,
};

const TesseraPluginDescriptor kDescriptor = {
    .abi_version = TESSERA_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(TesseraPluginDescriptor),
    .name = kName,
    .kind = TESSERA_PLUGIN_BACKEND,
    .description = "example: F32 add/mul/silu/swiglu/softmax/rms_norm/mat_mul",
    .probe = probe,
    .create = create,
    .destroy = destroy,
    .backend = &kBackendApi,
    .loader = nullptr,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
