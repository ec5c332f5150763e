// Matrix-vector (decode) and matrix-matrix (prefill) throughput of one MatMul node
// per backend, weight dtype and shape. Every usable backend in the build's plugin
// folder is included (registered at run time). Names, filter-friendly:
//   BM_MatVec/<backend>/<dtype>/<K>x<N>          M = 1:   bytes/s of weights, FLOP/s
//       (2048x256 stays in L2: the kernel's arithmetic ceiling)
//   BM_MatMul/<backend>/<dtype>/<K>x<N>/m<M>     M = 64:  FLOP/s, bytes/s
//   BM_MatVecDram/<backend>/<dtype>/<K>x<N>      M = 1 over copies of the weight that
//       together exceed the last-level cache, run back to back as one graph (as a
//       decode step runs its products): GB/s from DRAM, a plain streaming read of the same
//       bytes right after each run (probe_GB/s), and the median of their ratios (of_probe)
//   BM_MatMulId/<backend>/<dtype>/<K>x<N>xE<E>/k<k>/n<n>  expert products (MatMulId):
//       bytes/s of the active weights (the distinct experts the ids touch), FLOP/s
//   BM_SmallOp/<backend>/<op>/<K>x<n>            one small op (RmsNorm, Add, SwiGlu, ...)
//       on n rows of K: time per call, to place the pool-split thresholds (run with
//       TESSERA_BENCH_THREADS=1 and 2)
//   BM_Attention/<backend>/hd<D>/h<H>kv<KV>/L<L>   decode attention (one token over L
//       cached positions) in each of 22 layers of one KV cache, run as one graph like a
//       decode step (the cache exceeds L2): time per layer, KV bytes/s
//   BM_AttentionPrefill/<backend>/hd<D>/h<H>kv<KV>/T<T>   prefill attention: one node of
//       T queries from position 0 over a cache of T random positions: time per node,
//       (query, head, position) triples per second (the causal count, T (T + 1) / 2 x H)
// K = inputs (row length), N = output rows. $TESSERA_BENCH_M sets the matmul M
// (comma-separated list, default 64).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "tessera/backend.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/membw.h"
#include "tessera/plugin_config.h"
#include "tessera/plugin_registry.h"
#include "tessera/quant.h"

namespace tessera::bench {
namespace {

struct Shape {
  int64_t K, N;
};
constexpr Shape kShapes[] = {{2048, 2048}, {2048, 5632}, {5632, 2048}, {2048, 32000}, {4096, 14336}};
// BM_MatVec only: a weight that stays in L2 (at most ~0.6 MB per executor with 2, F32
// aside), so the figure is the kernel's arithmetic ceiling, the rate it would stream
// at if memory were free. Decode from DRAM can reach the probe only below it.
constexpr Shape kL2Shape = {2048, 256};
constexpr DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q4_0,
                            DType::Q4_K, DType::Q5_K, DType::Q6_K,
                            // issue #20's formats
                            DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4,
                            DType::Q2_K, DType::Q3_K, DType::IQ4_XS};

// Lives for the whole run: plugins stay loaded while their backends exist.
struct Globals {
  std::unique_ptr<FastPool> pool;
  std::unique_ptr<PluginRegistry> registry;
  std::map<std::string, std::shared_ptr<Backend>> backends;
};
Globals& globals() {
  static Globals g;
  return g;
}

// Deterministic pseudo-random floats in [-1, 1).
void fill_random(float* p, int64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    p[i] = float(int64_t(s >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }
}

// Q2_K, Q3_K and IQ4_XS have no quantizer (read from files only): one row of random
// but valid blocks (every code; F16 scales finite, of a typical magnitude), as
// `tessera-gen` writes them. The kernels' speed does not depend on the values.
bool has_quantizer(DType t) { return t != DType::Q2_K && t != DType::Q3_K && t != DType::IQ4_XS; }
void random_blocks_row(DType t, int64_t K, uint64_t seed, unsigned char* dst) {
  const size_t bytes = row_bytes(t, K), bs = dtype_traits(t).block_bytes;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    dst[i] = static_cast<unsigned char>(s >> 32);
  }
  const uint16_t d = quant::fp32_to_fp16(0.01f);
  for (size_t o = 0; o < bytes; o += bs) {
    unsigned char* b = dst + o;
    if (t == DType::Q2_K) std::memcpy(b + 80, &d, 2), std::memcpy(b + 82, &d, 2);
    if (t == DType::Q3_K) std::memcpy(b + 108, &d, 2);
    if (t == DType::IQ4_XS) std::memcpy(b, &d, 2);
  }
}

// Times every node of g on `be`: skipped (with the reason) if be does not support
// the first node; one warm-up run, then one run per iteration. False when skipped.
bool time_graph(benchmark::State& state, Backend& be, Graph& g) {
  const OpSupport sup = be.supports(g, g.nodes()[0]);
  if (!sup.supported) {
    state.SkipWithError(("unsupported: " + sup.reason).c_str());
    return false;
  }
  be.execute(g, 0, g.nodes().size());
  for (auto _ : state) {
    be.execute(g, 0, g.nodes().size());
    benchmark::ClobberMemory();
  }
  return true;
}

// The quantized weight of the last (dtype, shape) asked for: benchmarks are
// registered dtype-major, shape next, so every backend reuses one quantization.
struct RawWeight {
  DType type{};
  int64_t K = 0, N = 0;
  uint64_t generation = 0;  // bumped each time the bytes are regenerated
  std::vector<unsigned char> bytes;  // N rows of row_bytes(type, K)
};
const RawWeight& raw_weight(DType t, int64_t K, int64_t N) {
  static RawWeight w;
  if (!w.bytes.empty() && w.type == t && w.K == K && w.N == N) return w;
  w.bytes.clear();
  w.bytes.shrink_to_fit();
  w.type = t; w.K = K; w.N = N;
  ++w.generation;
  const size_t rb = row_bytes(t, K);
  w.bytes.resize(rb * size_t(N));
  struct Ctx { RawWeight* w; size_t rb; } c{&w, rb};
  globals().pool->parallel_for(N, [&c](int64_t b, int64_t e) {
    std::vector<float> row(size_t(c.w->K));
    for (int64_t r = b; r < e; ++r) {
      if (!has_quantizer(c.w->type)) {
        random_blocks_row(c.w->type, c.w->K, uint64_t(r) + 1, c.w->bytes.data() + size_t(r) * c.rb);
        continue;
      }
      fill_random(row.data(), c.w->K, uint64_t(r) + 1);
      quant::quantize_row(c.w->type, row.data(), c.w->bytes.data() + size_t(r) * c.rb, c.w->K);
    }
  });
  return w;
}

// Prepared (possibly repacked) weights, one per backend, for the current raw weight.
Tensor prepared_weight(Backend& be, DType t, int64_t K, int64_t N) {
  // backend -> (generation of the raw weight it was prepared from, tensor): a tensor
  // that was not repacked points into the raw bytes, so it is only valid while they are.
  static std::map<std::string, std::pair<uint64_t, Tensor>> cache;
  const RawWeight& raw = raw_weight(t, K, N);
  auto it = cache.find(be.name());
  if (it != cache.end() && it->second.first == raw.generation) return it->second.second;
  Tensor w = Tensor::contiguous(t, {K, N}, const_cast<unsigned char*>(raw.bytes.data()));
  w.name = "bench.weight";
  be.prepare_weight(w);
  cache[be.name()] = {raw.generation, w};
  return w;
}

void bm_matmul(benchmark::State& state, const std::string& backend, DType t, Shape sh, int64_t M) {
  Backend& be = *globals().backends.at(backend);
  Tensor w;
  try {
    w = prepared_weight(be, t, sh.K, sh.N);
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("prepare_weight: ") + e.what()).c_str());
    return;
  }
  Graph g;
  int32_t wi = g.add_tensor(w);
  int32_t xi = g.new_tensor(DType::F32, {sh.K, M}, "x");
  int32_t di = g.new_tensor(DType::F32, {sh.N, M}, "y");
  Node n;
  n.op = Op::MatMul;
  n.dst = di;
  n.src = {wi, xi, -1, -1, -1};
  g.add_node(n);
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(xi).data), sh.K * M, 99);
  OpSupport sup = be.supports(g, g.nodes()[0]);
  if (!sup.supported) {
    state.SkipWithError(("unsupported: " + sup.reason).c_str());
    return;
  }
  try {
    be.execute(g, 0, 1);  // warm-up (and first-touch of any lazily repacked data)
    for (auto _ : state) {
      be.execute(g, 0, 1);
      benchmark::ClobberMemory();
    }
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("execute: ") + e.what()).c_str());
    return;
  }
  const double weight_bytes = double(row_bytes(t, sh.K)) * double(sh.N);
  const double flops = 2.0 * double(sh.K) * double(sh.N) * double(M);
  const double it = double(state.iterations());
  state.counters["bytes/s"] = benchmark::Counter(weight_bytes * it, benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["FLOP/s"] = benchmark::Counter(flops * it, benchmark::Counter::kIsRate,
                                                benchmark::Counter::kIs1000);
}

// ---- Matrix-vector from DRAM -------------------------------------------------
// BM_MatVec reuses one weight, which stays in the last-level cache at the smaller
// shapes; a decode step streams every weight from DRAM. Here kDramBytes of distinct
// copies run as consecutive MatMul nodes of one graph, so the figure includes what a
// product costs between two others (dispatch, the first misses of a new stream).
constexpr size_t kDramBytes = size_t(384) << 20;

void bm_matvec_dram(benchmark::State& state, const std::string& backend, DType t, Shape sh) {
  // A backend of its own, so its repacked copies are freed with it at the end.
  std::shared_ptr<Backend> owned = globals().registry->create_backend(backend, globals().pool.get());
  Backend& be = *owned;
  if (!be.uses_host_memory()) {
    state.SkipWithError("not a host-memory backend: its weights are not streamed from this machine's DRAM");
    return;
  }
  const RawWeight& raw = raw_weight(t, sh.K, sh.N);
  const size_t copies = std::max<size_t>(2, kDramBytes / raw.bytes.size());
  std::vector<std::vector<unsigned char>> bytes(copies, raw.bytes);  // unrepacked tensors point here
  Graph g;
  int32_t xi = g.new_tensor(DType::F32, {sh.K, 1}, "x");
  int32_t di = g.new_tensor(DType::F32, {sh.N, 1}, "y");
  std::vector<std::span<const std::byte>> spans;  // what the products stream: the probe reads the same
  try {
    for (size_t c = 0; c < copies; ++c) {
      Tensor w = Tensor::contiguous(t, {sh.K, sh.N}, bytes[c].data());
      w.name = "bench.weight." + std::to_string(c);
      be.prepare_weight(w);
      spans.push_back(be.weight_bytes(w));
      Node n;
      n.op = Op::MatMul;
      n.dst = di;
      n.src = {g.add_tensor(w), xi, -1, -1, -1};
      g.add_node(n);
    }
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("prepare_weight: ") + e.what()).c_str());
    return;
  }
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(xi).data), sh.K, 99);
  OpSupport sup = be.supports(g, g.nodes()[0]);
  if (!sup.supported) {
    state.SkipWithError(("unsupported: " + sup.reason).c_str());
    return;
  }
  // Each iteration: the products, then one plain read of the bytes they streamed. This VM's
  // bandwidth drifts by tens of percent within minutes, so the ratio is taken per
  // pair and the median reported.
  const size_t nodes = g.nodes().size();
  const double weight_bytes = double(row_bytes(t, sh.K)) * double(sh.N) * double(copies);
  std::vector<double> kernel_gbs, probe_gbs, ratios;
  try {
    be.execute(g, 0, nodes);  // warm-up
    for (auto _ : state) {
      auto t0 = std::chrono::steady_clock::now();
      be.execute(g, 0, nodes);
      benchmark::ClobberMemory();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      state.PauseTiming();
      kernel_gbs.push_back(weight_bytes / s / 1e9);
      probe_gbs.push_back(measure_read_bandwidth_spans(*globals().pool, spans, 1).median_gbs);
      ratios.push_back(kernel_gbs.back() / probe_gbs.back());
      state.ResumeTiming();
    }
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("execute: ") + e.what()).c_str());
    return;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["GB/s"] = median(kernel_gbs);
  state.counters["probe_GB/s"] = median(probe_gbs);
  state.counters["of_probe"] = median(ratios);
}

// ---- MatMulId (mixture of experts) -------------------------------------------
// Qwen3-30B-A3B's expert shapes: K = 2048 (n_embd) x N = 768 (expert FF) x E = 128,
// k = 8 experts per token; n = 1 (decode) and n = 64 (a prefill batch).
struct MoeShape {
  int64_t K, N, E, k;
};
constexpr MoeShape kMoeShapes[] = {{2048, 768, 128, 8}};
constexpr DType kMoeTypes[] = {DType::Q4_K, DType::Q8_0, DType::Q4_0};
constexpr int kIdSets = 16;  // id sets cycled through, so decode streams experts from DRAM

Tensor prepared_experts(Backend& be, DType t, MoeShape sh) {
  static std::map<std::string, std::pair<uint64_t, Tensor>> cache;
  const RawWeight& raw = raw_weight(t, sh.K, sh.N * sh.E);
  auto it = cache.find(be.name());
  if (it != cache.end() && it->second.first == raw.generation) return it->second.second;
  Tensor w = Tensor::contiguous(t, {sh.K, sh.N, sh.E}, const_cast<unsigned char*>(raw.bytes.data()));
  w.name = "bench.experts";
  be.prepare_weight(w);
  cache[be.name()] = {raw.generation, w};
  return w;
}

void bm_matmul_id(benchmark::State& state, const std::string& backend, DType t, MoeShape sh, int64_t n) {
  Backend& be = *globals().backends.at(backend);
  Tensor w;
  try {
    w = prepared_experts(be, t, sh);
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("prepare_weight: ") + e.what()).c_str());
    return;
  }
  // kIdSets routings: n = 1 walks all experts in turn (k distinct per step), larger n
  // draws k distinct experts per token at random.
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> sets(kIdSets);
  std::vector<int32_t> perm(static_cast<size_t>(sh.E));
  double touched = 0;  // mean distinct experts per call
  for (int s = 0; s < kIdSets; ++s) {
    std::vector<bool> used(static_cast<size_t>(sh.E), false);
    for (int64_t tok = 0; tok < n; ++tok) {
      for (int64_t e = 0; e < sh.E; ++e) perm[size_t(e)] = int32_t(e);
      if (n == 1) std::rotate(perm.begin(), perm.begin() + (s * sh.k) % sh.E, perm.end());
      else std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < sh.k; ++j) {
        sets[size_t(s)].push_back(perm[size_t(j)]);
        used[size_t(perm[size_t(j)])] = true;
      }
    }
    touched += double(std::count(used.begin(), used.end(), true)) / kIdSets;
  }
  Graph g;
  int32_t wi = g.add_tensor(w);
  int32_t xi = g.new_tensor(DType::F32, {sh.K, 1, n}, "x");
  int32_t ii = g.new_tensor(DType::I32, {sh.k, n}, "ids");
  int32_t di = g.new_tensor(DType::F32, {sh.N, sh.k, n}, "y");
  Node nd;
  nd.op = Op::MatMulId;
  nd.dst = di;
  nd.src = {wi, xi, ii, -1, -1};
  g.add_node(nd);
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(xi).data), sh.K * n, 99);
  int32_t* ids = static_cast<int32_t*>(g.tensor(ii).data);
  std::memcpy(ids, sets[0].data(), sizeof(int32_t) * size_t(sh.k * n));
  OpSupport sup = be.supports(g, g.nodes()[0]);
  if (!sup.supported) {
    state.SkipWithError(("unsupported: " + sup.reason).c_str());
    return;
  }
  int s = 0;
  try {
    be.execute(g, 0, 1);  // warm-up
    for (auto _ : state) {
      std::memcpy(ids, sets[size_t(s)].data(), sizeof(int32_t) * size_t(sh.k * n));
      s = (s + 1) % kIdSets;
      be.execute(g, 0, 1);
      benchmark::ClobberMemory();
    }
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("execute: ") + e.what()).c_str());
    return;
  }
  const double active_bytes = double(row_bytes(t, sh.K)) * double(sh.N) * touched;
  const double flops = 2.0 * double(sh.K) * double(sh.N) * double(sh.k) * double(n);
  const double it = double(state.iterations());
  state.counters["experts"] = touched;
  state.counters["bytes/s"] = benchmark::Counter(active_bytes * it, benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["FLOP/s"] = benchmark::Counter(flops * it, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// ---- Small ops ----------------------------------------------------------------
void bm_small_op(benchmark::State& state, const std::string& backend, Op op, int64_t K, int64_t n) {
  Backend& be = *globals().backends.at(backend);
  Graph g;
  Node nd;
  nd.op = op;
  int32_t a = -1, b = -1, y = -1;
  if (op == Op::Rope) {  // K = head_dim 64 x K/64 heads
    a = g.new_tensor(DType::F32, {64, K / 64, n}, "x");
    b = g.new_tensor(DType::I32, {n}, "pos");
    y = g.new_tensor(DType::F32, {64, K / 64, n}, "y");
    nd.i[0] = 64;
    nd.i[1] = kRopeNeox;
    nd.f[0] = 10000.0f;
    nd.f[1] = 1.0f;
  } else {
    a = g.new_tensor(DType::F32, {K, n}, "a");
    if (op == Op::RmsNorm) b = g.new_tensor(DType::F32, {K}, "w");
    if (op == Op::Add || op == Op::Mul || op == Op::SwiGlu) b = g.new_tensor(DType::F32, {K, n}, "b");
    y = g.new_tensor(DType::F32, {K, n}, "y");
    nd.f[0] = 1e-6f;
  }
  nd.dst = y;
  nd.src = {a, b, -1, -1, -1};
  g.add_node(nd);
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(a).data), g.tensor(a).nelements(), 5);
  if (op == Op::Rope) {
    for (int64_t t = 0; t < n; ++t) static_cast<int32_t*>(g.tensor(b).data)[t] = int32_t(100 + t);
  } else if (b >= 0) {
    fill_random(static_cast<float*>(g.tensor(b).data), g.tensor(b).nelements(), 6);
  }
  if (!time_graph(state, be, g)) return;
  state.counters["elems/s"] = benchmark::Counter(double(K * n) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

struct AttnShape {
  int64_t hd, heads, kv_heads;
};

// The sequence table of one sequence's `n` tokens at pos0 (graph.h, Op::Attention).
std::vector<int32_t> one_sequence_table(const KvCache& kv, KvCache::SeqId seq, int64_t pos0, int64_t n) {
  std::vector<int32_t> t = {0, int32_t(n), int32_t(pos0)};
  const std::vector<int32_t>& bt = kv.block_table(seq);
  const size_t pages = size_t((pos0 + n + kv.config().page_tokens - 1) / kv.config().page_tokens);
  t.insert(t.end(), bt.begin(), bt.begin() + std::ptrdiff_t(pages));
  return t;
}

void bm_attention(benchmark::State& state, const std::string& backend, AttnShape sh, int64_t L) {
  Backend& be = *globals().backends.at(backend);
  constexpr int kLayers = 22;
  const int64_t page = 16;
  KvCacheConfig cfg{kLayers, int(sh.kv_heads), int(sh.hd), int(page), int((L + 1 + page - 1) / page), {}};
  KvCache kv(cfg);
  const KvCache::SeqId seq = kv.create_sequence();
  if (!kv.reserve(seq, L + 1)) {
    state.SkipWithError("KV cache reserve failed");
    return;
  }
  // Fill every layer's L + 1 positions (random K/V in F16), then attend one token at L.
  std::vector<float> kvf(size_t(sh.hd * sh.kv_heads));
  for (int l = 0; l < kLayers; ++l)
    for (int64_t j = 0; j <= L; ++j) {
      for (int v = 0; v < 2; ++v) {  // K, then V
        uint16_t* row = v ? kv.v_row(l, seq, j) : kv.k_row(l, seq, j);
        fill_random(kvf.data(), int64_t(kvf.size()), uint64_t(l * 100003 + j * 2 + v));
        for (size_t i = 0; i < kvf.size(); ++i) row[i] = quant::fp32_to_fp16(kvf[i] * 2.0f);
      }
    }
  kv.set_length(seq, L + 1);
  Graph g;
  const int32_t q = g.new_tensor(DType::F32, {sh.hd, sh.heads, 1}, "q");
  std::vector<int32_t> table = one_sequence_table(kv, seq, L, 1);
  const int32_t tt = g.add_tensor(Tensor::contiguous(DType::I32, {int64_t(table.size()), 1}, table.data()));
  std::vector<int32_t> outs;
  for (int l = 0; l < kLayers; ++l) {
    outs.push_back(g.new_tensor(DType::F32, {sh.hd, sh.heads, 1}, "out"));
    Node nd;
    nd.op = Op::Attention;
    nd.dst = outs.back();
    nd.src = {q, g.add_tensor(kv.k_storage(l)), g.add_tensor(kv.v_storage(l)), tt, -1};
    nd.f[0] = 1.0f / std::sqrt(float(sh.hd));
    g.add_node(nd);
  }
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(q).data), g.tensor(q).nelements(), 9);
  if (!time_graph(state, be, g)) return;
  const double kv_bytes = double(kLayers) * double(L + 1) * double(sh.kv_heads * sh.hd) * 2.0 * 2.0;
  state.counters["s/layer"] = benchmark::Counter(double(kLayers), benchmark::Counter::kIsIterationInvariantRate |
                                                                    benchmark::Counter::kInvert);
  state.counters["KV_GB/s"] = benchmark::Counter(kv_bytes * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void bm_attention_prefill(benchmark::State& state, const std::string& backend, AttnShape sh, int64_t T) {
  Backend& be = *globals().backends.at(backend);
  const int64_t page = 16;
  KvCacheConfig cfg{1, int(sh.kv_heads), int(sh.hd), int(page), int((T + page - 1) / page), {}};
  KvCache kv(cfg);
  const KvCache::SeqId seq = kv.create_sequence();
  if (!kv.reserve(seq, T)) {
    state.SkipWithError("KV cache reserve failed");
    return;
  }
  // Positions [0, T) hold random F16 K/V, as the step's KvWrite would leave them.
  std::vector<float> kvf(size_t(sh.hd * sh.kv_heads));
  for (int64_t j = 0; j < T; ++j)
    for (int v = 0; v < 2; ++v) {
      uint16_t* row = v ? kv.v_row(0, seq, j) : kv.k_row(0, seq, j);
      fill_random(kvf.data(), int64_t(kvf.size()), uint64_t(j * 2 + v + 1));
      for (size_t i = 0; i < kvf.size(); ++i) row[i] = quant::fp32_to_fp16(kvf[i] * 2.0f);
    }
  Graph g;
  const int32_t q = g.new_tensor(DType::F32, {sh.hd, sh.heads, T}, "q");
  const int32_t out = g.new_tensor(DType::F32, {sh.hd, sh.heads, T}, "out");
  std::vector<int32_t> table = one_sequence_table(kv, seq, 0, T);
  Node nd;
  nd.op = Op::Attention;
  nd.dst = out;
  nd.src = {q, g.add_tensor(kv.k_storage(0)), g.add_tensor(kv.v_storage(0)),
            g.add_tensor(Tensor::contiguous(DType::I32, {int64_t(table.size()), 1}, table.data())), -1};
  nd.f[0] = 1.0f / std::sqrt(float(sh.hd));
  g.add_node(nd);
  g.allocate();
  fill_random(static_cast<float*>(g.tensor(q).data), g.tensor(q).nelements(), 9);
  if (!time_graph(state, be, g)) return;
  const double triples = double(T * (T + 1) / 2 * sh.heads);
  state.counters["triples/s"] = benchmark::Counter(triples, benchmark::Counter::kIsIterationInvariantRate);
}

std::vector<int64_t> matmul_ms() {
  std::vector<int64_t> ms;
  if (const char* e = std::getenv("TESSERA_BENCH_M")) {
    std::string s(e);
    size_t p = 0;
    while (p < s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      long v = std::atol(s.substr(p, q - p).c_str());
      if (v >= 1) ms.push_back(v);
      p = q + 1;
    }
  }
  if (ms.empty()) ms.push_back(64);
  return ms;
}

}  // namespace

void register_matmul_benchmarks() {
  Globals& G = globals();
  G.pool = std::make_unique<FastPool>(bench_threads());
  PluginConfig cfg;
  cfg.paths = {TESSERA_PLUGIN_DIR};
  // TESSERA_BENCH_REPACK=0: cpu_avx512 keeps weights in the file's layout, so its row
  // kernels run (what streamed experts use) instead of the repacked tiles.
  if (const char* e = std::getenv("TESSERA_BENCH_REPACK"); e && std::string(e) == "0")
    cfg.plugins["cpu_avx512"].options["repack"] = "false";
  G.registry = std::make_unique<PluginRegistry>(cfg);
  std::vector<std::string> names;
  for (const auto& name : G.registry->ranked_backends()) {
    try {
      G.backends[name] = G.registry->create_backend(name, G.pool.get());
      names.push_back(name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera_bench_kernels: backend %s skipped: %s\n", name.c_str(), e.what());
    }
  }
  for (const auto& r : G.registry->records())
    if (r.kind == "backend" && !r.usable)
      std::fprintf(stderr, "tessera_bench_kernels: backend %s not usable: %s\n", r.name.c_str(), r.reason.c_str());
  if (names.empty()) std::fprintf(stderr, "tessera_bench_kernels: no usable backend in %s\n", TESSERA_PLUGIN_DIR);

  const std::vector<int64_t> ms = matmul_ms();
  for (DType t : kTypes) {
    const std::string tn(dtype_name(t));
    for (const auto& be : names)
      benchmark::RegisterBenchmark(
          ("BM_MatVec/" + be + "/" + tn + "/" + std::to_string(kL2Shape.K) + "x" + std::to_string(kL2Shape.N)).c_str(),
          [be, t](benchmark::State& s) { bm_matmul(s, be, t, kL2Shape, 1); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    for (Shape sh : kShapes) {
      const std::string shape = std::to_string(sh.K) + "x" + std::to_string(sh.N);
      for (const auto& be : names)
        benchmark::RegisterBenchmark(("BM_MatVec/" + be + "/" + tn + "/" + shape).c_str(),
                                     [be, t, sh](benchmark::State& s) { bm_matmul(s, be, t, sh, 1); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      for (const auto& be : names)
        benchmark::RegisterBenchmark(("BM_MatVecDram/" + be + "/" + tn + "/" + shape).c_str(),
                                     [be, t, sh](benchmark::State& s) { bm_matvec_dram(s, be, t, sh); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      for (int64_t m : ms)
        for (const auto& be : names)
          benchmark::RegisterBenchmark(("BM_MatMul/" + be + "/" + tn + "/" + shape + "/m" + std::to_string(m)).c_str(),
                                       [be, t, sh, m](benchmark::State& s) { bm_matmul(s, be, t, sh, m); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
    }
  }

  for (DType t : kMoeTypes) {
    const std::string tn(dtype_name(t));
    for (MoeShape sh : kMoeShapes)
      for (int64_t n : {int64_t(1), int64_t(64)})
        for (const auto& be : names) {
          const std::string name = "BM_MatMulId/" + be + "/" + tn + "/" + std::to_string(sh.K) + "x" +
                                   std::to_string(sh.N) + "xE" + std::to_string(sh.E) + "/k" + std::to_string(sh.k) +
                                   "/n" + std::to_string(n);
          benchmark::RegisterBenchmark(name.c_str(), [be, t, sh, n](benchmark::State& s) { bm_matmul_id(s, be, t, sh, n); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
  }

  for (Op op : {Op::Add, Op::RmsNorm, Op::SwiGlu, Op::Softmax, Op::Rope})
    for (auto [K, n] : {std::pair<int64_t, int64_t>{2048, 1}, {5632, 1}, {32000, 1}, {2048, 16}, {2048, 512}})
      for (const auto& be : names) {
        const std::string name = "BM_SmallOp/" + be + "/" + std::string(op_name(op)) + "/" + std::to_string(K) + "x" +
                                 std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), [be, op, K = K, n = n](benchmark::State& s) { bm_small_op(s, be, op, K, n); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }

  for (AttnShape sh : {AttnShape{64, 32, 4}, AttnShape{128, 32, 8}})
    for (int64_t L : {int64_t(128), int64_t(512), int64_t(2048)})
      for (const auto& be : names) {
        const std::string name = "BM_Attention/" + be + "/hd" + std::to_string(sh.hd) + "/h" + std::to_string(sh.heads) +
                                 "kv" + std::to_string(sh.kv_heads) + "/L" + std::to_string(L);
        benchmark::RegisterBenchmark(name.c_str(), [be, sh, L](benchmark::State& s) { bm_attention(s, be, sh, L); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }

  for (AttnShape sh : {AttnShape{64, 32, 4}, AttnShape{128, 32, 8}})
    for (int64_t T : {int64_t(256), int64_t(2048)})
      for (const auto& be : names) {
        const std::string name = "BM_AttentionPrefill/" + be + "/hd" + std::to_string(sh.hd) + "/h" +
                                 std::to_string(sh.heads) + "kv" + std::to_string(sh.kv_heads) + "/T" +
                                 std::to_string(T);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [be, sh, T](benchmark::State& s) { bm_attention_prefill(s, be, sh, T); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace tessera::bench
