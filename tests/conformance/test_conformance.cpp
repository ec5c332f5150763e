// Conformance suite: every usable backend found in the plugin folder (and
// $TESSERA_PLUGIN_PATH) against a fresh cpu_scalar instance, one GoogleTest test per
// (backend, case), registered at run time: Conformance/<backend>.<Op>_<dtype>_<shape>.
// cpu_scalar is tested against itself (a determinism check: NMSE must be exactly 0).
//
// The SelfCheck tests prove the comparison can fail: deliberately broken backends
// (wrong arithmetic, out-of-bounds writes, NaN, writes into inputs or into the wrong
// KV positions, a bad repack, refusals) must be reported as FAIL or SKIP, never PASS.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/backend.h"
#include "tessera/conformance.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/kv_cache.h"
#include "tessera/paged_rows.h"
#include "tessera/plugin_registry.h"
#include "tessera/quant.h"

namespace {

using namespace tessera;

PluginConfig test_config() {
  PluginConfig cfg;
  if (const char* env = std::getenv("TESSERA_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) cfg.paths.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  cfg.paths.push_back(TESSERA_PLUGIN_DIR);
  return cfg;
}

class Env {
 public:
  PluginRegistry& registry() {
    if (!reg_) reg_ = std::make_unique<PluginRegistry>(test_config());
    return *reg_;
  }
  FastPool* pool() {
    if (!pool_) pool_ = std::make_unique<FastPool>(2);
    return pool_.get();
  }
  // The instance under test (for cpu_scalar: a second instance, not the reference).
  Backend& backend(const std::string& name) {
    auto& b = backends_[name];
    if (!b) b = registry().create_backend(name, pool());
    return *b;
  }
  Backend& reference() {
    if (!ref_) ref_ = registry().create_backend("cpu_scalar", pool());
    return *ref_;
  }
  std::shared_ptr<Backend> fresh_scalar() { return registry().create_backend("cpu_scalar", pool()); }

 private:
  std::unique_ptr<PluginRegistry> reg_;
  std::unique_ptr<FastPool> pool_;
  std::map<std::string, std::shared_ptr<Backend>> backends_;
  std::shared_ptr<Backend> ref_;
};

Env& env() {
  static Env e;
  return e;
}

// ---------------------------------------------------------------------------
// The per-(backend, case) test

class ConformanceTest : public testing::Test {
 public:
  ConformanceTest(std::string backend, ConformanceCase c) : backend_(std::move(backend)), c_(std::move(c)) {}
  void TestBody() override {
    Backend& be = env().backend(backend_);
    ConformanceResult r = run_conformance_case(c_, be, env().reference());
    RecordProperty("result", conformance_status_name(r.status));
    RecordProperty("nmse", std::to_string(r.nmse));
    if (r.status == ConformanceStatus::Skip) {
      GTEST_SKIP() << backend_ << " does not support it: " << r.message;
    }
    EXPECT_EQ(r.status, ConformanceStatus::Pass)
        << r.message << " (NMSE " << r.nmse << ", limit " << r.limit << ")";
    if (backend_ == "cpu_scalar") {
      EXPECT_EQ(r.nmse, 0.0) << "cpu_scalar against itself must be bit-identical";
    }
  }

 private:
  std::string backend_;
  ConformanceCase c_;
};

// ---------------------------------------------------------------------------
// A NaN or infinite activation reaches the product (decision 90): every backend's
// activation quantizer gives the block a NaN scale, so each output of the poisoned
// token is non-finite (before, a NaN became a zero level and the outputs were finite).
// The other tokens stay finite. Products of 1, 3 and 32 tokens take the decode, small
// batch and batched (repacked / tiled) paths; the weight is prepared as the engine does.

class NonFiniteActivationTest : public testing::Test {
 public:
  NonFiniteActivationTest(std::string backend, DType wt) : backend_(std::move(backend)), wt_(wt) {}
  void TestBody() override {
    Backend& be = env().backend(backend_);
    constexpr int64_t K = 512, N = 48;
    uint32_t seed = 12345;
    auto rnd = [&seed] {  // xorshift, values in [-1, 1)
      seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
      return float(seed % 20000) / 10000.f - 1.f;
    };
    const size_t rb = row_bytes(wt_, K);
    std::vector<float> wf(static_cast<size_t>(K));
    std::vector<uint8_t> w(rb * N);
    for (int64_t r = 0; r < N; ++r) {
      for (float& v : wf) v = rnd();
      quant::quantize_row(wt_, wf.data(), w.data() + size_t(r) * rb, K);
    }
    Tensor wt = Tensor::contiguous(wt_, {K, N}, w.data());
    be.prepare_weight(wt);
    int tested = 0;
    for (int64_t M : {1, 3, 32}) {
      for (const float bad : {NAN, INFINITY, -INFINITY}) {
        // Token M-1 gets the bad value at element 300 (inside the second Q8_K block).
        std::vector<float> x(size_t(K * M)), out(size_t(N * M), 0.f);
        for (float& v : x) v = rnd();
        x[size_t((M - 1) * K + 300)] = bad;
        Graph g;
        const int tw = g.add_tensor(wt);
        const int tx = g.add_tensor(Tensor::contiguous(DType::F32, {K, M}, x.data()));
        const int to = g.add_tensor(Tensor::contiguous(DType::F32, {N, M}, out.data()));
        Node n;
        n.op = Op::MatMul;
        n.dst = to;
        n.src[0] = tw;
        n.src[1] = tx;
        g.add_node(n);
        g.allocate();
        if (!be.supports(g, g.nodes().back()).supported) continue;
        be.execute(g, 0, 1);
        ++tested;
        int finite_bad = 0, non_finite_good = 0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t r = 0; r < N; ++r) {
            const bool finite = std::isfinite(out[size_t(m * N + r)]);
            if (m == M - 1) finite_bad += finite;
            else non_finite_good += !finite;
          }
        EXPECT_EQ(finite_bad, 0) << "M " << M << ", input " << bad << ": outputs of the poisoned token that are finite";
        EXPECT_EQ(non_finite_good, 0) << "M " << M << ", input " << bad << ": outputs of clean tokens that are not";
      }
    }
    if (tested == 0) GTEST_SKIP() << backend_ << " does not support MatMul with " << dtype_name(wt_) << " weights";
  }

 private:
  std::string backend_;
  DType wt_;
};

void register_backend_tests() {
  for (const std::string& name : env().registry().ranked_backends()) {
    const std::string suite = "Conformance/" + name;
    for (const ConformanceCase& c : conformance_cases()) {
      testing::RegisterTest(suite.c_str(), c.name().c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [name, c]() -> testing::Test* { return new ConformanceTest(name, c); });
    }
    // Every activation type: Q8_0 (Q8_0, Q4_0, IQ4_NL, MXFP4), Q8_1 (Q4_1) and Q8_K.
    for (DType wt : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::IQ4_NL, DType::MXFP4, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K}) {
      std::string type(dtype_name(wt));
      for (char& ch : type) ch = char(std::toupper(static_cast<unsigned char>(ch)));
      const std::string test = "MatMul_" + type + "_NonFiniteActivation";
      testing::RegisterTest(suite.c_str(), test.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [name, wt]() -> testing::Test* { return new NonFiniteActivationTest(name, wt); });
    }
  }
}

// ---------------------------------------------------------------------------
// Deliberately broken backends: cpu_scalar with one op done wrong.

class Wrapper : public Backend {
 public:
  explicit Wrapper(std::string name) : name_(std::move(name)), inner_(env().fresh_scalar()) {}
  std::string name() const override { return name_; }
  OpSupport supports(const Graph& g, const Node& n) const override { return inner_->supports(g, n); }
  void prepare_weight(Tensor& w) override { inner_->prepare_weight(w); }
  void execute(Graph& g, size_t first, size_t count) override {
    for (size_t k = first; k < first + count; ++k) {
      const Node& n = g.nodes()[k];
      if (!custom(g, n, k)) inner_->execute(g, k, 1);
    }
  }

 protected:
  // Return true when the node was handled here.
  virtual bool custom(Graph& g, const Node& n, size_t k) { return false; }
  Backend& inner() { return *inner_; }

 private:
  std::string name_;
  std::shared_ptr<Backend> inner_;
};

float* fdata(Graph& g, int32_t t) { return static_cast<float*>(g.tensor(t).data); }

// Add computed as a - b.
struct SubtractingAdd : Wrapper {
  SubtractingAdd() : Wrapper("broken_add") {}
  bool custom(Graph& g, const Node& n, size_t) override {
    if (n.op != Op::Add) return false;
    const Tensor &a = g.tensor(n.src[0]), &b = g.tensor(n.src[1]);
    for (int64_t i = 0; i < a.nelements(); ++i)
      fdata(g, n.dst)[i] = static_cast<float*>(a.data)[i] - static_cast<float*>(b.data)[i % b.nelements()];
    return true;
  }
};

// Correct Silu values, plus one float written past the end (or before the start).
struct StraySilu : Wrapper {
  explicit StraySilu(bool before) : Wrapper("stray_silu"), before_(before) {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::Silu) return false;
    inner().execute(g, k, 1);
    float* d = fdata(g, n.dst);
    if (before_)
      d[-1] = 1.0f;
    else
      d[g.tensor(n.dst).nelements()] = 1.0f;
    return true;
  }
  bool before_;
};

// Correct products, then one output element moved by `delta` (issue 21's mutation).
struct OneElementOff : Wrapper {
  explicit OneElementOff(float delta) : Wrapper("one_element_off"), delta_(delta) {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::MatMul && n.op != Op::MatMulId) return false;
    inner().execute(g, k, 1);
    const int64_t ne = g.tensor(n.dst).nelements();
    fdata(g, n.dst)[ne / 2] += delta_;
    return true;
  }
  float delta_;
};

// A NaN in the Softmax output.
struct NanSoftmax : Wrapper {
  NanSoftmax() : Wrapper("nan_softmax") {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::Softmax) return false;
    inner().execute(g, k, 1);
    fdata(g, n.dst)[g.tensor(n.dst).nelements() / 2] = NAN;
    return true;
  }
};

// Leaves the last output element of a MatMul unwritten.
struct LazyMatMul : Wrapper {
  LazyMatMul() : Wrapper("lazy_matmul") {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::MatMul) return false;
    Tensor& dst = g.tensor(n.dst);
    std::vector<float> keep(size_t(dst.nelements()));
    std::memcpy(keep.data(), dst.data, keep.size() * 4);
    inner().execute(g, k, 1);
    fdata(g, n.dst)[dst.nelements() - 1] = keep.back();
    return true;
  }
};

// Argmax returning the last of tied maxima (only the ties case can tell).
struct LastArgmax : Wrapper {
  LastArgmax() : Wrapper("last_argmax") {}
  bool custom(Graph& g, const Node& n, size_t) override {
    if (n.op != Op::Argmax) return false;
    const Tensor& x = g.tensor(n.src[0]);
    auto* out = static_cast<int32_t*>(g.tensor(n.dst).data);
    for (int64_t r = 0; r < x.nrows(); ++r) {
      const float* row = x.row<float>(r);
      int64_t best = 0;
      for (int64_t i = 1; i < x.ne[0]; ++i)
        if (row[i] >= row[best]) best = i;
      out[r] = int32_t(best);
    }
    return true;
  }
};

// Rope that scribbles into its input after computing.
struct InPlaceRope : Wrapper {
  InPlaceRope() : Wrapper("inplace_rope") {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::Rope) return false;
    inner().execute(g, k, 1);
    fdata(g, n.src[0])[0] += 1.0f;
    return true;
  }
};

// KvWrite that also flips a bit of a row the step does not write: the one after its
// last slot in that page, or else the one before its first (a cached position).
struct StrayKvWrite : Wrapper {
  StrayKvWrite() : Wrapper("stray_kv") {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::KvWrite) return false;
    inner().execute(g, k, 1);
    const Tensor& slots = g.tensor(n.src[1]);
    const auto* s = static_cast<const int32_t*>(slots.data);
    const int64_t pt = g.tensor(n.dst).ne[1], first = s[0], last = s[slots.ne[0] - 1];
    const int64_t stray = last % pt != pt - 1 ? last + 1 : first % pt != 0 ? first - 1 : -1;
    if (stray >= 0) storage_row(g.tensor(n.dst), stray)[0] ^= 0x0400;
    return true;
  }
};

// Batched attention: a forked sequence reads its parent's pages instead (the column of
// the sequence table sharing its first page). Single-sequence cases are untouched.
struct ParentReadingAttention : Wrapper {
  ParentReadingAttention() : Wrapper("parent_attention") {}
  bool custom(Graph& g, const Node& n, size_t) override {
    if (n.op != Op::Attention) return false;
    const Tensor& t = g.tensor(n.src[3]);
    std::vector<int32_t> table(static_cast<const int32_t*>(t.data), static_cast<const int32_t*>(t.data) + t.nelements());
    const int64_t rows = t.ne[0], pt = g.tensor(n.src[1]).ne[1];
    auto pages = [&](const int32_t* col) { return (int64_t(col[kSeqPos0]) + col[kSeqCount] + pt - 1) / pt; };
    bool changed = false;
    for (int64_t c = 0; c < t.ne[1]; ++c)
      for (int64_t o = 0; o < t.ne[1]; ++o) {
        int32_t *col = table.data() + c * rows, *other = table.data() + o * rows;
        if (o == c || col[kSeqCount] == 0 || other[kSeqCount] == 0 || col[kSeqTableHeader] != other[kSeqTableHeader])
          continue;
        const int64_t common = std::min(pages(col), pages(other));  // pages both may read
        if (!std::equal(col + kSeqTableHeader, col + kSeqTableHeader + common, other + kSeqTableHeader)) {
          std::copy(other + kSeqTableHeader, other + kSeqTableHeader + common, col + kSeqTableHeader);
          changed = true;
        }
      }
    if (!changed) return false;
    Graph one;  // the same tensors, the table replaced
    for (size_t i = 0; i < g.tensor_count(); ++i) one.add_tensor(g.tensor(int32_t(i)));
    one.tensor(n.src[3]).data = table.data();
    one.add_node(n);
    one.allocate();
    inner().execute(one, 0, 1);
    ++redirected;
    return true;
  }
  int redirected = 0;
};

// Attention that also writes one float into the first row after its first sequence's
// rows, which belongs to another sequence of the batch: only the batched cases can see it.
struct OverrunningAttention : Wrapper {
  OverrunningAttention() : Wrapper("overrunning_attention") {}
  bool custom(Graph& g, const Node& n, size_t k) override {
    if (n.op != Op::Attention) return false;
    inner().execute(g, k, 1);
    const Tensor &table = g.tensor(n.src[3]), &dst = g.tensor(n.dst);
    const int32_t* col = static_cast<const int32_t*>(table.data);
    const int64_t next = int64_t(col[kSeqFirst]) + col[kSeqCount];
    if (next < dst.ne[2]) {
      dst.row<float>(0, next)[0] = 1000.0f;
      ++strays;
    }
    return true;
  }
  int strays = 0;
};

// Refuses Q4_K MatMuls.
struct NoQ4K : Wrapper {
  NoQ4K() : Wrapper("no_q4k") {}
  OpSupport supports(const Graph& g, const Node& n) const override {
    if (n.op == Op::MatMul && g.tensor(n.src[0]).type == DType::Q4_K) return OpSupport::no("no Q4_K kernels yet");
    return Wrapper::supports(g, n);
  }
};

// Throws from RmsNorm.
struct ThrowingNorm : Wrapper {
  ThrowingNorm() : Wrapper("throwing_norm") {}
  bool custom(Graph&, const Node& n, size_t) override {
    if (n.op != Op::RmsNorm) return false;
    throw Error("rms_norm exploded");
  }
};

// Repacks weights into its own buffer at prepare_weight; `corrupt` zeroes the copy.
struct Repacker : Wrapper {
  explicit Repacker(bool corrupt) : Wrapper("repacker"), corrupt_(corrupt) {}
  void prepare_weight(Tensor& w) override {
    auto buf = std::make_unique<HostBuffer>(w.nbytes());
    std::memcpy(buf->data(), w.data, w.nbytes());
    if (corrupt_) std::memset(buf->data(), 0, w.nbytes());  // a "repack" that loses the weights
    w.data = buf->data();
    w.buffer = buf.get();
    ++prepared;
    bufs_.push_back(std::move(buf));
  }
  int prepared = 0;
  bool corrupt_;
  std::vector<std::unique_ptr<HostBuffer>> bufs_;
};

// A "repack" that gets one field of each block of the issue-20 formats wrong (the
// part a kernel for that format could misread): Q4_1's min, the fifth bits of Q5_0 /
// Q5_1, IQ4_NL's grid index, MXFP4's exponent, Q2_K's scale / min nibbles, Q3_K's
// high bits, IQ4_XS's high scale bits. Other types are left alone.
struct FieldCorrupter : Wrapper {
  FieldCorrupter() : Wrapper("field_corrupter") {}
  void prepare_weight(Tensor& w) override {
    auto buf = std::make_unique<HostBuffer>(w.nbytes());
    std::memcpy(buf->data(), w.data, w.nbytes());
    auto* p = static_cast<uint8_t*>(buf->data());
    const size_t bb = dtype_traits(w.type).block_bytes, nb = w.nbytes() / bb;
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* blk = p + b * bb;
      switch (w.type) {
        case DType::Q4_1: reinterpret_cast<quant::BlockQ4_1*>(blk)->m = 0; break;
        case DType::Q5_0: std::memset(reinterpret_cast<quant::BlockQ5_0*>(blk)->qh, 0, 4); break;
        case DType::Q5_1: std::memset(reinterpret_cast<quant::BlockQ5_1*>(blk)->qh, 0, 4); break;
        case DType::IQ4_NL:
          for (uint8_t& q : reinterpret_cast<quant::BlockIQ4_NL*>(blk)->qs) q ^= 0x88;
          break;
        case DType::MXFP4: reinterpret_cast<quant::BlockMXFP4*>(blk)->e += 1; break;
        case DType::Q2_K:
          for (uint8_t& sc : reinterpret_cast<quant::BlockQ2_K*>(blk)->scales) sc = uint8_t((sc << 4) | (sc >> 4));
          break;
        case DType::Q3_K:
          for (uint8_t& h : reinterpret_cast<quant::BlockQ3_K*>(blk)->hmask) h ^= 0xFF;
          break;
        case DType::IQ4_XS: reinterpret_cast<quant::BlockIQ4_XS*>(blk)->scales_h = 0; break;
        default: break;
      }
    }
    w.data = buf->data();
    w.buffer = buf.get();
    bufs_.push_back(std::move(buf));
  }
  std::vector<std::unique_ptr<HostBuffer>> bufs_;
};

std::vector<ConformanceResult> run(Backend& be, const std::string& op, const std::string& dtype = {}) {
  ConformanceFilter f;
  f.op = op;
  f.dtype = dtype;
  return run_conformance(be, env().reference(), f);
}

int count(const std::vector<ConformanceResult>& rs, ConformanceStatus s) {
  int n = 0;
  for (const auto& r : rs) n += r.status == s;
  return n;
}

// ---------------------------------------------------------------------------
// The case list itself

TEST(ConformanceCases, CoverEveryOpAndDtype) {
  std::set<Op> ops;
  std::map<Op, std::set<DType>> types;
  std::set<std::string> names;
  for (const auto& c : conformance_cases()) {
    ops.insert(c.kind);
    types[c.kind].insert(c.type);
    EXPECT_TRUE(names.insert(c.name()).second) << "duplicate case " << c.name();
    for (char ch : c.name()) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name();
  }
  for (int i = 0; i < int(Op::Count); ++i) EXPECT_TRUE(ops.count(Op(i))) << "no case for op " << op_name(Op(i));
  for (Op op : {Op::MatMul, Op::GetRows, Op::MatMulId})
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                    DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                    DType::Q6_K, DType::IQ4_XS})
      EXPECT_TRUE(types[op].count(t)) << op_name(op) << " lacks " << dtype_name(t);
}

TEST(ConformanceCases, AttentionCoversGqaPagesAndOffsets) {
  std::set<std::pair<int, int>> heads;
  std::set<int> pages, offsets;
  std::set<int64_t> hds;
  for (const auto& c : conformance_cases(ConformanceFilter{"Attention", ""})) {
    heads.insert({c.n_head, c.n_kv});
    pages.insert(c.page);
    offsets.insert(c.pos0);
    hds.insert(c.k);
    if (!c.flag) {
      EXPECT_GT(c.pos0 + c.m + 1, c.page) << c.name() << ": the cache must span several pages";
    }
  }
  EXPECT_TRUE(heads.count({4, 2}) && heads.count({8, 8}));
  EXPECT_TRUE(pages.count(4) && pages.count(16));
  EXPECT_TRUE(offsets.count(0) && offsets.size() >= 2);
  EXPECT_TRUE(hds.count(64) && hds.count(128));
}

TEST(ConformanceCases, BatchedAttentionCoversGqaHeadDimsAndPages) {
  std::set<std::pair<int, int>> heads;
  std::set<int> pages, layouts;
  std::set<int64_t> hds;
  int n = 0;
  for (const auto& c : conformance_cases(ConformanceFilter{"Attention", ""})) {
    if (!c.flag) continue;
    ++n;
    EXPECT_EQ(c.shape.rfind("batch", 0), 0u) << c.name();
    heads.insert({c.n_head, c.n_kv});
    pages.insert(c.page);
    hds.insert(c.k);
    layouts.insert(int(c.n));
  }
  EXPECT_EQ(n, 16);
  EXPECT_TRUE(heads.count({4, 2}) && heads.count({8, 8}));
  EXPECT_TRUE(pages.count(4) && pages.count(16));
  EXPECT_TRUE(hds.count(64) && hds.count(128));
  EXPECT_TRUE(layouts.count(3) && layouts.count(4));
  EXPECT_EQ(conformance_cases(ConformanceFilter{"batch", ""}).size(), size_t(n));
}

TEST(ConformanceCases, FilterByOpNameOrSubstring) {
  for (const auto& c : conformance_cases(ConformanceFilter{"mul", ""})) EXPECT_EQ(c.op, "Mul");
  for (const auto& c : conformance_cases(ConformanceFilter{"mat_mul", "q4_k"})) {
    EXPECT_EQ(c.op, "MatMul");
    EXPECT_EQ(c.dtype, "Q4_K");
  }
  EXPECT_FALSE(conformance_cases(ConformanceFilter{"K256_N7", ""}).empty());
  EXPECT_EQ(conformance_cases(ConformanceFilter{"Add,Silu", ""}).size(),
            conformance_cases(ConformanceFilter{"Add", ""}).size() + conformance_cases(ConformanceFilter{"Silu", ""}).size());
}

// ---------------------------------------------------------------------------
// The comparison can fail

TEST(SelfCheck, ReferenceAgainstItselfIsExact) {
  auto other = env().fresh_scalar();
  auto rs = run(*other, "Add,Softmax,Attention");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << ": " << r.message;
    EXPECT_EQ(r.nmse, 0.0) << r.c.name();
  }
}

TEST(SelfCheck, WrongArithmeticFails) {
  SubtractingAdd be;
  auto rs = run(be, "Add");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_GT(r.nmse, r.limit) << r.c.name();
    EXPECT_NE(r.message.find("NMSE"), std::string::npos) << r.message;
  }
  // The other ops of the same backend still pass.
  for (const auto& r : run(be, "Mul")) EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << r.message;
}

// One MatMul / MatMulId output element off by 1e-3 fails every case of every weight
// type (the per-element limit), and the unperturbed products pass.
TEST(SelfCheck, OneProductElementOffByAThousandthFails) {
  OneElementOff be(1e-3f);
  std::set<std::string> dtypes;
  for (const char* op : {"MatMul", "MatMulId"}) {
    auto rs = run(be, op);
    ASSERT_FALSE(rs.empty());
    for (const auto& r : rs) {
      dtypes.insert(r.c.dtype);
      EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name() << " passed with one element off by 1e-3";
    }
  }
  EXPECT_GE(dtypes.size(), 16u);
  OneElementOff exact(0.0f);
  for (const auto& r : run(exact, "MatMul")) EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << r.message;
}

TEST(SelfCheck, WritePastTheEndIsCaught) {
  StraySilu be(false);
  auto rs = run(be, "Silu");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_EQ(r.nmse, 0.0) << "the values themselves are right";
    EXPECT_NE(r.message.find("past the end of 'dst'"), std::string::npos) << r.message;
  }
}

TEST(SelfCheck, WriteBeforeTheStartIsCaught) {
  StraySilu be(true);
  for (const auto& r : run(be, "Silu")) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_NE(r.message.find("before the start of 'dst'"), std::string::npos) << r.message;
  }
}

TEST(SelfCheck, NanFails) {
  NanSoftmax be;
  for (const auto& r : run(be, "Softmax")) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_NE(r.message.find("non-finite"), std::string::npos) << r.message;
  }
}

TEST(SelfCheck, UnwrittenOutputFails) {
  LazyMatMul be;
  auto rs = run(be, "MatMul", "F32,Q4_0");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
}

TEST(SelfCheck, ArgmaxTiesMustMatch) {
  LastArgmax be;
  auto rs = run(be, "Argmax");
  for (const auto& r : rs) {
    if (r.c.flag)
      EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    else
      EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << ": " << r.message;
  }
}

TEST(SelfCheck, ModifiedInputFails) {
  InPlaceRope be;
  for (const auto& r : run(be, "Rope")) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_NE(r.message.find("input 'x' was modified"), std::string::npos) << r.message;
  }
}

TEST(SelfCheck, StrayKvWriteFails) {
  StrayKvWrite be;
  auto rs = run(be, "KvWrite,Attention");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    // A row no position of the run writes, or one a later step writes over the stray bit.
    EXPECT_TRUE(r.message.find("was overwritten") != std::string::npos ||
                r.message.find("KV cache contents") != std::string::npos)
        << r.message;
  }
}

TEST(SelfCheck, ForkReadingItsParentFails) {
  ParentReadingAttention be;
  auto rs = run(be, "Attention");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    if (r.c.flag) {
      EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
      EXPECT_NE(r.message.find("NMSE"), std::string::npos) << r.message;
    } else {
      EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << ": " << r.message;
    }
  }
  EXPECT_GT(be.redirected, 0);
}

TEST(SelfCheck, AttentionOverrunIntoTheNextSequenceFails) {
  OverrunningAttention be;
  auto rs = run(be, "Attention");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    if (r.c.flag) {
      EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
      EXPECT_NE(r.message.find("'dst_batch': NMSE"), std::string::npos) << r.message;
    } else {
      EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << ": " << r.message;
    }
  }
  EXPECT_GT(be.strays, 0);
}

TEST(SelfCheck, UnsupportedIsSkipWithReason) {
  NoQ4K be;
  auto rs = run(be, "MatMul", "Q4_K,Q5_K");
  ASSERT_FALSE(rs.empty());
  for (const auto& r : rs) {
    if (r.c.dtype == "Q4_K") {
      EXPECT_EQ(r.status, ConformanceStatus::Skip) << r.c.name();
      EXPECT_EQ(r.message, "no Q4_K kernels yet");
    } else {
      EXPECT_EQ(r.status, ConformanceStatus::Pass) << r.c.name() << ": " << r.message;
    }
  }
}

TEST(SelfCheck, ThrowingBackendFails) {
  ThrowingNorm be;
  for (const auto& r : run(be, "RmsNorm")) {
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
    EXPECT_NE(r.message.find("rms_norm exploded"), std::string::npos) << r.message;
  }
}

TEST(SelfCheck, RepackedWeightsAreTheOnesTested) {
  Repacker good(false);
  auto rs = run(good, "MatMul,GetRows", "Q4_K,F16");
  ASSERT_FALSE(rs.empty());
  EXPECT_EQ(good.prepared, int(rs.size())) << "prepare_weight is called once per weight";
  EXPECT_EQ(count(rs, ConformanceStatus::Pass), int(rs.size()));

  Repacker bad(true);
  rs = run(bad, "MatMul,GetRows", "Q4_K,F16");
  for (const auto& r : rs) EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name();
}

// The weights of the issue-20 formats (quantized floats, or random blocks for Q2_K,
// Q3_K and IQ4_XS) exercise every field of their blocks: a kernel misreading any one
// of them fails every MatMul, GetRows and MatMulId case of that format with more than
// one output value (a single dot product can hide a lost Q4_1 min: it moves the result
// by about m * sum(x), which one random x can nearly cancel, as MatMul K512_N1_M1's does).
TEST(SelfCheck, MisreadFieldOfANewFormatFails) {
  const std::string types = "Q4_1,Q5_0,Q5_1,IQ4_NL,MXFP4,Q2_K,Q3_K,IQ4_XS";
  FieldCorrupter bad;
  auto rs = run(bad, "MatMul,GetRows,MatMulId", types);
  std::set<std::string> seen;
  for (const auto& r : rs) {
    seen.insert(r.c.dtype);
    if (r.c.kind == Op::MatMul && r.c.n * r.c.m == 1) continue;
    EXPECT_EQ(r.status, ConformanceStatus::Fail) << r.c.name() << " NMSE " << r.nmse;
  }
  EXPECT_EQ(seen.size(), 8u);
  // The same cases pass untouched (so the failures above are the corruption's).
  Repacker good(false);
  rs = run(good, "MatMul,GetRows,MatMulId", types);
  EXPECT_EQ(count(rs, ConformanceStatus::Pass), int(rs.size()));
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  register_backend_tests();
  return RUN_ALL_TESTS();
}
