// The cpu_amx backend object: the probe, placement of products on the tiles, and
// the wrapped backend for everything else. Compiled WITHOUT ISA flags; the real tile
// kernels (kernels_amx.cpp) are only entered when the backend was made for the
// hardware, which make_backend allows only after hardware_usable() said yes.
#include "cpu_amx_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_avx512_backend.h"
#include "kernels.h"
#include "tessera/error.h"
#include "tessera/pool_ref.h"
#include "tessera/graph.h"
#include "tessera/hwprobe.h"
#include "tessera/op_schema.h"
#include "tessera/range_backend.h"
#include "tessera/work_split.h"

namespace tessera::cpu_amx {

bool hardware_usable(std::string* why) {
  const CpuFeatures& f = cpu_features();
  std::string missing;
  auto need = [&](bool ok, const char* name) {
    if (!ok) missing += missing.empty() ? name : std::string(", ") + name;
  };
  need(f.amx_tile, "amx-tile");
  need(f.amx_int8, "amx-int8");
  need(f.amx_bf16, "amx-bf16");
  if (missing.empty()) {
    need(f.os_amx, "OS support for the tile state (XCR0 bits 17-18)");
    if (f.os_amx) need(f.amx_permitted, "Linux permission for tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)");
  }
  if (missing.empty()) return true;
  if (why) *why = "missing " + missing;
  return false;
}

bool emulation_requested_by_env() {
  const char* e = std::getenv("TESSERA_AMX_EMULATE");
  if (!e) return false;
  const std::string v = e;
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

namespace {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Shape plus 64 bytes of the first, middle and last rows (experts): a copy is used
// only while its weight still holds the bytes it was made from.
uint64_t fingerprint(const Tensor& w) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (int d = 0; d < 3; ++d) mix(&w.ne[d], sizeof w.ne[d]), mix(&w.nb[d + 1], sizeof w.nb[d + 1]);
  const int64_t N = w.ne[1], E = w.ne[2];
  const size_t n = std::min<size_t>(64, row_bytes(w.type, w.ne[0]));
  for (int64_t e : {int64_t(0), E / 2, E - 1})
    for (int64_t r : {int64_t(0), N / 2, N - 1}) mix(static_cast<const char*>(w.data) + e * w.nb[2] + r * w.nb[1], n);
  return h;
}

bool overlaps(const void* a0, size_t an, const void* b0, size_t bn) {
  const char *a = static_cast<const char*>(a0), *b = static_cast<const char*>(b0);
  return a < b + bn && b < a + an;
}
size_t span_bytes(const Tensor& t) {  // from data to the end of its last row
  return t.nrows() == 0 ? 0 : size_t(t.flat_row<char>(t.nrows() - 1) - static_cast<char*>(t.data)) + row_bytes(t.type, t.ne[0]);
}

class CpuAmxBackend final : public RangeBackend {
 public:
  CpuAmxBackend(PoolRef pool, const Options& o) : pool_(pool), opt_(o) {
    // Without AVX-512 (emulation on another CPU) there is nothing to wrap: only the
    // tile products are taken, every other node goes to the next backend by rank.
    if (o.wrap_avx512 && cpu_avx512::usable()) {
      inner_ = cpu_avx512::make_backend(pool, o.avx512);
      inner_repacks_ = o.avx512.repack;
      avx512_ = true;
    }
    kernel_ = o.emulate ? &kern::matmul_tiles_emulated : &kern::matmul_tiles_real;
  }

  std::string name() const override { return "cpu_amx"; }
  // The tile products run node by node; the runs handed to cpu_avx512 fuse as it does.
  int32_t fusion_window() const override { return inner_ ? inner_->fusion_window() : 1; }

  OpSupport supports(const Graph& graph, const Node& node) const override {
    if (inner_) return inner_->supports(graph, node);
    if (tile_shape(graph, node)) return OpSupport::yes();
    return OpSupport::no(std::string(op_name(node.op)) + ": without AVX-512 cpu_amx runs only Q8_0 / Q4_0 products of " +
                         std::to_string(opt_.min_columns) + " or more activation rows");
  }

  std::span<const std::byte> weight_bytes(const Tensor& w) override {
    return inner_ ? inner_->weight_bytes(w) : Backend::weight_bytes(w);
  }

  // The wrapped backend repacks first; the tiles then read its copy when it is the
  // layout they expect, or a copy of their own.
  void prepare_weight(Tensor& w) override {
    if (inner_) inner_->prepare_weight(w);
    copies_.erase(w.data);
    if (!tileable_weight(w)) return;
    Copy c;
    c.type = w.type, c.K = w.ne[0], c.N = w.ne[1], c.E = w.ne[2], c.nb1 = w.nb[1], c.nb2 = w.nb[2];
    c.ebytes = kern::repacked_bytes(w.type, c.K, c.N);
    const auto* src = static_cast<const uint8_t*>(w.data);
    if (inner_repacks_) {
      const std::span<const std::byte> s = inner_->weight_bytes(w);
      const auto* rep = reinterpret_cast<const uint8_t*>(s.data());
      if (s.size() == c.ebytes * size_t(c.E) && rep != src &&
          kern::layout_matches(w.type, src, int64_t(w.nb[1]), c.K, c.N, rep) &&
          kern::layout_matches(w.type, src + (c.E - 1) * w.nb[2], int64_t(w.nb[1]), c.K, c.N,
                               rep + (c.E - 1) * c.ebytes)) {
        c.shared = true;
        copies_[w.data] = std::move(c);
        return;
      }
    }
    own_copy(w, std::move(c));
  }

 private:
  struct Copy {
    DType type = DType::F32;
    int64_t K = 0, N = 0, E = 1;
    size_t nb1 = 0, nb2 = 0, ebytes = 0;
    bool shared = false;  // the wrapped backend's copy (read through weight_bytes)
    uint64_t fp = 0;      // own copy: fingerprint of the weight it was made from
    std::unique_ptr<uint8_t[], AlignedFree> own;
  };

  // c (shape filled in) gets a tile copy of w of its own.
  void own_copy(const Tensor& w, Copy c) {
    const auto* src = static_cast<const uint8_t*>(w.data);
    const size_t bytes = (c.ebytes * size_t(c.E) + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw Error("cpu_amx: out of memory repacking '" + w.name + "'");
    c.own.reset(static_cast<uint8_t*>(p));
    for (int64_t e = 0; e < c.E; ++e)
      kern::repack(w.type, src + e * w.nb[2], int64_t(w.nb[1]), c.K, c.N, c.own.get() + size_t(e) * c.ebytes);
    c.fp = fingerprint(w);
    copies_[w.data] = std::move(c);
  }

  static bool tileable_weight(const Tensor& w) {
    return w.data && kern::weight_type_supported(w.type) && w.ne[0] > 0 && w.ne[0] % kern::kBlock == 0 &&
           w.ne[1] >= 1 && w.ne[2] >= 1 && w.ne[3] == 1 && w.nb[1] >= row_bytes(w.type, w.ne[0]) &&
           (w.ne[2] == 1 || w.nb[2] >= w.nb[1] * size_t(w.ne[1]));
  }

  // The tile copy of w (all experts back to back), or null: none was made for this
  // tensor, or its bytes changed since (the copy is then dropped).
  const uint8_t* tiles_of(const Tensor& w) {
    auto it = copies_.find(w.data);
    if (it == copies_.end()) return nullptr;
    Copy& c = it->second;
    if (c.type != w.type || c.K != w.ne[0] || c.N != w.ne[1] || c.E != w.ne[2] || c.nb1 != w.nb[1] ||
        (c.E > 1 && c.nb2 != w.nb[2]) || w.ne[3] != 1)
      return nullptr;  // another view of the same memory
    if (c.shared) {  // weight_bytes checks the wrapped copy's fingerprint
      const std::span<const std::byte> s = inner_->weight_bytes(w);
      if (s.size() == c.ebytes * size_t(c.E) && s.data() != static_cast<const std::byte*>(w.data))
        return reinterpret_cast<const uint8_t*>(s.data());
    } else if (c.fp == fingerprint(w)) {
      return c.own.get();
    }
    copies_.erase(it);
    return nullptr;
  }

  static bool f32_rows(const Tensor& t) { return t.type == DType::F32 && t.nb[0] == sizeof(float); }

  // Whether node n (valid by the op schema) has a tile product's shape: a Q8_0 / Q4_0
  // weight, F32 rows, and at least min_columns activation rows (MatMulId: pairs).
  // Depends only on what Scheduler::signature() covers, so supports() may use it.
  bool tile_shape(const Graph& g, const Node& n) const {
    if (n.op == Op::MatMul) {
      const Tensor &w = g.tensor(n.src[0]), &x = g.tensor(n.src[1]), &y = g.tensor(n.dst);
      if (!kern::weight_type_supported(w.type) || w.ne[2] != 1 || !f32_rows(x) || !f32_rows(y)) return false;
      return w.ne[0] % kern::kBlock == 0 && y.nrows() == x.nrows() && x.nrows() >= opt_.min_columns;
    }
    if (n.op == Op::MatMulId) {
      if (n.i[1] > 0) return false;  // an expert range: not a tile kernel
      const Tensor &w = g.tensor(n.src[0]), &x = g.tensor(n.src[1]), &ids = g.tensor(n.src[2]), &y = g.tensor(n.dst);
      if (!kern::weight_type_supported(w.type) || !f32_rows(x) || !f32_rows(y)) return false;
      const int64_t k = ids.ne[0], tok = ids.ne[1];
      return w.ne[0] % kern::kBlock == 0 && y.nrows() == k * tok && k * tok >= opt_.min_columns;
    }
    return false;
  }

  // Whether node n runs on the tiles here: a tile shape whose weight has a tile copy.
  // Without a wrapped backend every node this backend accepted is a tile product, and
  // a weight prepare_weight() never saw (or that changed since) gets its copy now.
  bool takes(const Graph& g, const Node& n) {
    if (!tile_shape(g, n)) return false;
    const Tensor& w = g.tensor(n.src[0]);
    if (tiles_of(w)) return true;
    if (inner_ || !tileable_weight(w)) return false;
    Copy c;
    c.type = w.type, c.K = w.ne[0], c.N = w.ne[1], c.E = w.ne[2], c.nb1 = w.nb[1], c.nb2 = w.nb[2];
    c.ebytes = kern::repacked_bytes(w.type, c.K, c.N);
    own_copy(w, std::move(c));
    return tiles_of(w) != nullptr;
  }

  void run_range(Graph& graph, size_t first, size_t count) override {
    const auto& nodes = graph.nodes();
    act_valid_ = false;
    const size_t end = first + count;
    for (size_t k = first; k < end;) {
      size_t r = k;
      while (r < end && !takes(graph, nodes[r])) ++r;
      if (r > k) {  // a run for the wrapped backend, in one call (its grouping and fusion see it whole)
        if (!inner_) fail(graph, k, "not a tile product (supports() should have declined it)");
        inner_->execute_validated(graph, k, r - k);
        act_valid_ = false;
        k = r;
        continue;
      }
      const Node& n = nodes[k];
      try {
        if (n.op == Op::MatMul)
          mat_mul(graph.tensor(n.src[0]), graph.tensor(n.src[1]), graph.tensor(n.dst));
        else
          mat_mul_id(graph.tensor(n.src[0]), graph.tensor(n.src[1]), graph.tensor(n.src[2]), graph.tensor(n.dst));
      } catch (const Error& e) {
        fail(graph, k, e.what());
      }
      ++k;
    }
  }

  [[noreturn]] static void fail(const Graph& g, size_t k, const std::string& why) {
    throw Error("cpu_amx: " + describe_node(g, k) + ": " + why);
  }

  template <typename F>
  void parallel_for(int64_t n, F&& f) {
    if (pool_ && pool_.executor_count() > 1 && n > 1) {
      auto fn = f;
      pool_.parallel_for(n, std::move(fn));
    } else if (n > 0) {
      f(int64_t(0), n);
    }
  }

  // Rows of x quantized to Q8_0 into q_ / d_ (rows padded to a multiple of 16 with
  // zeros); reused by the next product of the same x in this call (q/k/v, gate/up).
  void quantize(const Tensor& x, int64_t rows, int64_t K) {
    if (act_valid_ && act_x_ == x.data && act_K_ == K && act_rows_ == rows && act_nb1_ == x.nb[1] &&
        act_nb2_ == x.nb[2])
      return;
    const int64_t padded = (rows + 15) / 16 * 16, nb = K / kern::kBlock;
    q_.assign(kern::act_q_bytes(rows, K), 0);
    d_.assign(size_t(padded * nb), 0.f);
    parallel_for(rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        (avx512_ ? kern::quantize_row_q8_0_avx512 : kern::quantize_row_q8_0)(x.flat_row<float>(r), K, q_.data(), r,
                                                                             d_.data() + r * nb);
    });
    act_valid_ = true, act_x_ = x.data, act_K_ = K, act_rows_ = rows, act_nb1_ = x.nb[1], act_nb2_ = x.nb[2];
  }
  // A product's output overlapping its input makes the quantized rows stale.
  void after_product(const Tensor& x, const Tensor& y) {
    if (overlaps(x.data, span_bytes(x), y.data, span_bytes(y))) act_valid_ = false;
  }

  // Items: pairs of 16-row weight tiles, job after job (start[j] = first item of job
  // j), handed out by a WorkSplit (executors that start late or run slower, as on a
  // shared machine, get their share taken over instead of holding the others up).
  // Each output element is computed by the same code whoever takes its item.
  void run_items(int64_t i0, int64_t i1) const {
    const std::vector<kern::Job>& jobs = jobs_;
    const std::vector<int64_t>& start = starts_;
    size_t j = size_t(std::upper_bound(start.begin(), start.end(), i0) - start.begin()) - 1;
    while (i0 < i1) {
      const kern::Job& job = jobs[j];
      const int64_t tiles = (job.N + kern::kTileRows - 1) / kern::kTileRows;
      const int64_t p0 = i0 - start[j], p1 = std::min(i1, start[j + 1]) - start[j];
      kernel_(job, 2 * p0, std::min(tiles, 2 * p1));
      i0 = start[j] + p1;
      ++j;
    }
  }
  void run_jobs() {
    const int64_t items = starts_.back();
    const int execs = pool_ ? pool_.executor_count() : 1;
    if (execs <= 1 || items < 2) {
      run_items(0, items);
      return;
    }
    split_.reset(items, execs, 1);
    pool_.parallel(
        [](void* p, int index) {
          auto* self = static_cast<CpuAmxBackend*>(p);
          int64_t b, e;
          while (self->split_.next(index, b, e)) self->run_items(b, e);
        },
        this);
  }

  void mat_mul(const Tensor& w, const Tensor& x, const Tensor& y) {
    const uint8_t* rep = tiles_of(w);
    const int64_t K = w.ne[0], N = w.ne[1], M = x.nrows();
    quantize(x, M, K);
    out_.resize(size_t(M));
    for (int64_t m = 0; m < M; ++m) out_[size_t(m)] = y.flat_row<float>(m);
    kern::Job job;
    job.wt = w.type, job.K = K, job.N = N, job.w = rep;
    job.q = q_.data(), job.d = d_.data(), job.ldd = K / kern::kBlock, job.M = M;
    job.out_ptr = out_.data();
    jobs_.assign(1, job);
    const int64_t tiles = (N + kern::kTileRows - 1) / kern::kTileRows;
    starts_.assign({0, (tiles + 1) / 2});
    run_jobs();
    after_product(x, y);
  }

  // MatMulId: dst row t * k + j = expert ids[t][j] times x row (t, j % b). The pairs
  // are grouped by expert (in token order), each expert's quantized rows gathered
  // into 16-row-padded A rows of its own, and every expert's tiles form one dispatch.
  void mat_mul_id(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& y) {
    const uint8_t* rep = tiles_of(w);
    const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2], k = ids.ne[0], tok = ids.ne[1], b = x.ne[1];
    const int64_t nb = K / kern::kBlock;
    std::vector<int64_t> count(size_t(E), 0);
    for (int64_t t = 0; t < tok; ++t) {
      const int32_t* id = ids.row<int32_t>(t);
      for (int64_t j = 0; j < k; ++j) {
        if (id[j] < 0 || id[j] >= E)
          throw Error("mat_mul_id: expert id " + std::to_string(id[j]) + " out of range [0, " + std::to_string(E) + ")");
        ++count[size_t(id[j])];
      }
    }
    quantize(x, b * tok, K);
    std::vector<int64_t> row0(size_t(E) + 1, 0);  // first gathered row of each expert
    for (int64_t e = 0; e < E; ++e) row0[size_t(e) + 1] = row0[size_t(e)] + (count[size_t(e)] + 15) / 16 * 16;
    const int64_t rows = row0[size_t(E)];
    gq_.assign(kern::act_q_bytes(rows, K), 0);
    gd_.assign(size_t(rows * nb), 0.f);
    gout_.assign(size_t(rows), nullptr);
    std::vector<int64_t> fill(row0.begin(), row0.end() - 1);
    for (int64_t t = 0; t < tok; ++t) {
      const int32_t* id = ids.row<int32_t>(t);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = fill[size_t(id[j])]++, src = t * b + j % b;
        for (int64_t blk = 0; blk < nb; ++blk)
          std::memcpy(gq_.data() + kern::act_q_offset(at, blk, K), q_.data() + kern::act_q_offset(src, blk, K),
                      kern::kBlock);
        std::memcpy(gd_.data() + at * nb, d_.data() + src * nb, size_t(nb) * sizeof(float));
        gout_[size_t(at)] = y.flat_row<float>(t * k + j);
      }
    }
    jobs_.clear();
    starts_.assign(1, 0);
    const int64_t tiles = (N + kern::kTileRows - 1) / kern::kTileRows;
    for (int64_t e = 0; e < E; ++e) {
      if (count[size_t(e)] == 0) continue;
      kern::Job job;
      job.wt = w.type, job.K = K, job.N = N, job.w = rep + size_t(e) * kern::repacked_bytes(w.type, K, N);
      job.q = gq_.data() + kern::act_q_offset(row0[size_t(e)], 0, K);  // row0 is a multiple of 16
      job.d = gd_.data() + row0[size_t(e)] * nb, job.ldd = nb;
      job.M = count[size_t(e)];
      job.out_ptr = gout_.data() + row0[size_t(e)];
      jobs_.push_back(job);
      starts_.push_back(starts_.back() + (tiles + 1) / 2);
    }
    run_jobs();
    act_valid_ = false;  // conservative: the next product may read this one's output
  }

  PoolRef pool_ = nullptr;
  Options opt_;
  std::unique_ptr<Backend> inner_;
  bool inner_repacks_ = false;
  bool avx512_ = false;  // cpu_avx512::usable(): its activation quantizer too
  void (*kernel_)(const kern::Job&, int64_t, int64_t) = nullptr;
  std::unordered_map<const void*, Copy> copies_;
  // Quantized activations (and the key of the x they hold), gathered expert rows,
  // output row pointers, jobs.
  std::vector<int8_t> q_, gq_;
  std::vector<float> d_, gd_;
  std::vector<float*> out_, gout_;  // output rows: MatMul's, MatMulId's gathered
  std::vector<kern::Job> jobs_;
  std::vector<int64_t> starts_;
  WorkSplit split_;
  bool act_valid_ = false;
  const void* act_x_ = nullptr;
  int64_t act_K_ = 0, act_rows_ = 0;
  size_t act_nb1_ = 0, act_nb2_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_backend(PoolRef pool, const Options& options) {
  std::string why;
  if (!options.emulate && !hardware_usable(&why))
    throw Error("cpu_amx cannot run on this CPU: " + why + " (emulation: TESSERA_AMX_EMULATE=1)");
  if (options.min_columns < 1) throw Error("cpu_amx: min_columns must be at least 1");
  return std::make_unique<CpuAmxBackend>(pool, options);
}

}  // namespace tessera::cpu_amx
