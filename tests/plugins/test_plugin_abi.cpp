// The C plugin ABI's compatibility rules (plugin_abi.h, docs/plugins.md) against the
// test-only plugins in TESSERA_ABI_PLUGIN_DIR: plugins of the previous generations are
// refused with a reason that says to rebuild; an ABI-3 descriptor or function table
// that lacks a required field is refused naming it, before the probe; a table that
// ends before the optional functions (an older plugin) loads, runs, and is never
// called past its struct_size; and a plugin built with the other std::string ABI of
// libstdc++ (the example, with _GLIBCXX_USE_CXX11_ABI=0) loads and computes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/graph.h"
#include "tessera/kv_cache.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_registry.h"
#include "tessera/scheduler.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

const std::string kAbiDir = TESSERA_ABI_PLUGIN_DIR;
const std::string kAbi3Dir = TESSERA_ABI3_PLUGIN_DIR;
const std::string kAbi4Dir = TESSERA_ABI4_PLUGIN_DIR;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-abi-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

const PluginRecord& by_file(const PluginRegistry& r, const std::string& filename) {
  for (const auto& rec : r.records())
    if (fs::path(rec.file).filename() == filename) return rec;
  throw std::runtime_error("no record for file " + filename);
}

// A plugin configuration that searches `dir` alone.
PluginConfig only_folder(const std::string& dir) {
  return PluginConfig::from_string("[plugins]\npaths = [\"" + dir + "\"]\ndefault_paths = false\n", "/");
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Each test gets its own verdict cache (the child-process vetting remembers verdicts).
class PluginAbi : public ::testing::Test {
 protected:
  TempDir cache;
  void SetUp() override {
    ::setenv("XDG_CACHE_HOME", cache.path.c_str(), 1);
    ::unsetenv("TESSERA_PROBE_IN_PROCESS");
  }
  static PluginConfig config() {
    return PluginConfig::from_string("[plugins]\npaths = [\"" + kAbiDir + "\"]\ndefault_paths = false\n", "/");
  }
};

const std::string kRebuild = "rebuild the plugin";
const std::string kExpects = ", this tessera expects " + std::to_string(TESSERA_PLUGIN_ABI_MIN_VERSION) + " to " +
                             std::to_string(TESSERA_PLUGIN_ABI_VERSION) + ": ";

}  // namespace

TEST_F(PluginAbi, PreviousGenerationsAreRefusedWithoutReadingPastTheVersion) {
  PluginRegistry reg(config());
  for (const char* v : {"1", "2"}) {
    const PluginRecord& r = by_file(reg, std::string("test_v") + v + ".so");
    EXPECT_FALSE(r.usable);
    EXPECT_EQ(r.reason, std::string("ABI version ") + v + kExpects + kRebuild +
                            " against the current SDK (ABI 1 and 2 passed C++ objects)");
    EXPECT_EQ(r.name, "");  // nothing past abi_version is read
    EXPECT_EQ(r.kind, "?");
    EXPECT_EQ(r.description, "");
    EXPECT_EQ(r.score, 0);
  }
  EXPECT_THROW(reg.create_backend("test_v2", nullptr), Error);
}

TEST_F(PluginAbi, MissingDescriptorFieldsAndTableFunctionsAreRefusedByName) {
  PluginRegistry reg(config());
  struct Expect {
    const char* file;
    const char* kind;
    std::string reason;
  };
  const size_t through_destroy = offsetof(TesseraPluginDescriptor, destroy) + sizeof(TesseraPluginDescriptor::destroy);
  const Expect cases[] = {
      {"test_notable.so", "backend", "backend plugin without a backend function table"},
      // struct_size ends at destroy: the (valid) pointer behind it is not read.
      {"test_notable_short_desc.so", "backend", "backend plugin without a backend function table"},
      {"test_notable_loader.so", "loader", "loader plugin without a loader function table"},
      {"test_table_noexec.so", "backend", "backend function table lacks 'execute'"},
      {"test_table_nullsupports.so", "backend", "backend function table lacks 'supports'"},
      {"test_loader_table_short.so", "loader", "loader function table lacks 'origin_get'"},
      {"test_short_descriptor.so", "?",
       "descriptor struct_size " + std::to_string(offsetof(TesseraPluginDescriptor, destroy)) +
           " is smaller than the " + std::to_string(through_destroy) + " bytes this tessera reads: " + kRebuild},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.file);
    const PluginRecord& r = by_file(reg, e.file);
    EXPECT_FALSE(r.usable);
    EXPECT_EQ(r.reason, e.reason);
    EXPECT_EQ(r.kind, e.kind);
    EXPECT_EQ(r.score, 0);  // refused before the host probed it
    if (std::string(e.kind) != "?") {
      // The name is read (the fields up to destroy are covered), so the record says who.
      EXPECT_EQ(r.name, fs::path(e.file).stem().string());
      EXPECT_THROW(reg.create_backend(r.name, nullptr), Error);
    }
  }
  EXPECT_TRUE(reg.create_loaders().empty());
}

TEST_F(PluginAbi, AnOlderTableWithoutTheOptionalFunctionsLoadsAndRuns) {
  std::shared_ptr<Backend> be;
  {
    PluginRegistry reg(config());
    const PluginRecord& r = by_file(reg, "test_short_table.so");
    ASSERT_TRUE(r.usable) << r.reason;
    EXPECT_EQ(r.name, "test_short_table");
    EXPECT_EQ(r.score, 4);
    EXPECT_EQ(r.reason, "an older plugin without the optional backend functions");
    be = reg.create_backend("test_short_table", nullptr);
  }
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->name(), "test_short_table");
  EXPECT_TRUE(be->uses_host_memory());
  EXPECT_EQ(be->fusion_window(), 1) << "no fusion_window in the table: node by node";

  // The table's storage past struct_size holds traps: prepare_weight would fail with
  // an error, weight_bytes would claim one bogus byte. The host calls neither.
  float wdata[6] = {1, 2, 3, 4, 5, 6};
  Tensor w = Tensor::contiguous(DType::F32, {3, 2}, wdata);
  w.name = "w";
  EXPECT_NO_THROW(be->prepare_weight(w));
  EXPECT_EQ(w.data, static_cast<void*>(wdata));
  EXPECT_EQ(w.type, DType::F32);
  // ABI 4's traps: no transfers are counted and buffers are host memory of the host's.
  EXPECT_EQ(be->transfers().upload_bytes, 0u);
  std::unique_ptr<Buffer> kv = be->alloc_buffer(256, BufferUsage::Kv);
  ASSERT_NE(kv, nullptr);
  EXPECT_NE(kv->data(), nullptr);
  EXPECT_EQ(w.nb[1], 3 * sizeof(float));
  const auto bytes = be->weight_bytes(w);
  EXPECT_EQ(static_cast<const void*>(bytes.data()), static_cast<const void*>(wdata));
  EXPECT_EQ(bytes.size(), sizeof wdata);

  // (a + b) * a through the scheduler, on the plugin alone.
  Graph g;
  const int32_t a = g.new_tensor(DType::F32, {5}, "a");
  const int32_t b = g.new_tensor(DType::F32, {5}, "b");
  const int32_t s = g.new_tensor(DType::F32, {5}, "s");
  const int32_t p = g.new_tensor(DType::F32, {5}, "p");
  Node add;
  add.op = Op::Add;
  add.dst = s;
  add.src = {a, b, -1, -1, -1};
  g.add_node(add);
  Node mul;
  mul.op = Op::Mul;
  mul.dst = p;
  mul.src = {s, a, -1, -1, -1};
  g.add_node(mul);
  g.allocate();
  for (int i = 0; i < 5; ++i) {
    g.tensor(a).row<float>(0)[i] = float(i + 1);
    g.tensor(b).row<float>(0)[i] = 0.5f * float(i);
  }
  Scheduler sched({be});
  for (int step = 0; step < 2; ++step) sched.run(g);
  for (int i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(g.tensor(p).row<float>(0)[i], (float(i + 1) + 0.5f * float(i)) * float(i + 1)) << i;
  EXPECT_NE(sched.describe(g).find("test_short_table"), std::string::npos) << sched.describe(g);
}

TEST_F(PluginAbi, APluginWithTheOtherStdStringAbiLoadsAndRuns) {
  // The file really is built on the old (copy-on-write) std::string: its symbols name
  // std::basic_string as _ZNSs..., never std::__cxx11::basic_string.
  const std::string image = slurp(fs::path(kAbiDir) / "test_oldstring.so");
  ASSERT_FALSE(image.empty());
  EXPECT_NE(image.find("_ZNSs"), std::string::npos);
  EXPECT_EQ(image.find("_ZNSt7__cxx1112basic_string"), std::string::npos);

  PluginRegistry reg(config());
  const PluginRecord& r = by_file(reg, "test_oldstring.so");
  ASSERT_TRUE(r.usable) << r.reason;
  EXPECT_EQ(r.name, "example_cpu");
  EXPECT_EQ(r.kind, "backend");
  EXPECT_EQ(r.reason, "portable C++, F32 only; an example to build plugins from");  // a string built inside

  // create's error text crosses as a C buffer.
  try {
    reg.create_backend("example_cpu", nullptr, {{"bogus", "1"}});
    FAIL() << "expected the plugin to refuse an unknown option";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("example_cpu: unknown option 'bogus' (example_cpu takes none)"),
              std::string::npos)
        << e.what();
  }

  FastPool pool(3);  // MatMul is split over the pool's executors
  std::shared_ptr<Backend> be = reg.create_backend("example_cpu", &pool);
  ASSERT_NE(be, nullptr);

  // y = W x (W [K=7, N=5], x [7, 3]), then y + y, then argmax (declined).
  Graph g;
  const int32_t w = g.new_tensor(DType::F32, {7, 5}, "w");
  const int32_t x = g.new_tensor(DType::F32, {7, 3}, "x");
  const int32_t y = g.new_tensor(DType::F32, {5, 3}, "y");
  const int32_t z = g.new_tensor(DType::F32, {5, 3}, "z");
  const int32_t am = g.new_tensor(DType::I32, {3}, "am");
  Node mm;
  mm.op = Op::MatMul;
  mm.dst = y;
  mm.src = {w, x, -1, -1, -1};
  g.add_node(mm);
  Node add;
  add.op = Op::Add;
  add.dst = z;
  add.src = {y, y, -1, -1, -1};
  g.add_node(add);
  Node arg;
  arg.op = Op::Argmax;
  arg.dst = am;
  arg.src = {z, -1, -1, -1, -1};
  g.add_node(arg);
  g.allocate();
  for (int i = 0; i < 35; ++i) g.tensor(w).row<float>(0)[i] = std::sin(0.37f * float(i));
  for (int i = 0; i < 21; ++i) g.tensor(x).row<float>(0)[i] = std::cos(0.11f * float(i)) - 0.2f;

  // A reason built in the plugin's std::string, returned through the C buffer.
  const OpSupport no = be->supports(g, g.nodes()[2]);
  EXPECT_FALSE(no.supported);
  EXPECT_EQ(no.reason, "op argmax is not implemented by example_cpu");
  EXPECT_TRUE(be->supports(g, g.nodes()[0]).supported) << be->supports(g, g.nodes()[0]).reason;

  for (int step = 0; step < 2; ++step) be->execute(g, 0, 2);
  const float* W = g.tensor(w).row<float>(0);
  const float* X = g.tensor(x).row<float>(0);
  for (int r = 0; r < 3; ++r)
    for (int o = 0; o < 5; ++o) {
      double ref = 0.0;
      for (int k = 0; k < 7; ++k) ref += double(W[o * 7 + k] * X[r * 7 + k]);
      EXPECT_NEAR(g.tensor(y).row<float>(0)[r * 5 + o], ref, 1e-5) << r << "," << o;
      EXPECT_FLOAT_EQ(g.tensor(z).row<float>(0)[r * 5 + o], 2.0f * g.tensor(y).row<float>(0)[r * 5 + o]);
    }
  // execute() on a node the plugin declines: the host's check refuses it first.
  EXPECT_THROW(be->execute(g, 2, 1), Error);

  // An error raised inside the plugin's execute (an exception there, caught there)
  // reaches the host as the plugin's message: a MatMul writing over its activation.
  Graph h;
  const int32_t hw = h.new_tensor(DType::F32, {4, 4}, "hw");
  const int32_t hx = h.new_tensor(DType::F32, {4, 2}, "hx");
  const int32_t hy = h.reshape(hx, {4, 2});
  Node hm;
  hm.op = Op::MatMul;
  hm.dst = hy;
  hm.src = {hw, hx, -1, -1, -1};
  h.add_node(hm);
  h.allocate();
  try {
    be->execute(h, 0, 1);
    FAIL() << "expected the plugin to refuse an in-place MatMul";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "example_cpu: node 0 (mat_mul): MatMul: destination aliases the activation");
  }
}

// The example built for ABI 3 (the previous generation) loads and computes; it is never
// given a KvWrite or Attention node, whose operands changed in ABI 4, and an ABI-4
// build of the same source is (the host asks it, and it declines by its own rule).
TEST_F(PluginAbi, AnAbi3PluginLoadsAndRunsButIsNotGivenThePagedKvOps) {
  for (const std::string& dir : {kAbi3Dir, kAbiDir}) {
    PluginRegistry reg(only_folder(dir));
    const std::string file = dir == kAbi3Dir ? "test_example_abi3.so" : "test_oldstring.so";
    const PluginRecord& r = by_file(reg, file);
    ASSERT_TRUE(r.usable) << r.reason;
    std::shared_ptr<Backend> be = reg.create_backend("example_cpu", nullptr);
    Graph g;
    const int32_t x = g.new_tensor(DType::F32, {8, 2}, "x");
    const int32_t y = g.new_tensor(DType::F32, {8, 2}, "y");
    Node add;
    add.op = Op::Add;
    add.dst = y;
    add.src = {x, x, -1, -1, -1};
    g.add_node(add);
    KvCacheConfig cfg;
    cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.head_dim = 8, cfg.page_tokens = 4, cfg.n_pages = 2;
    KvCache kv(cfg);
    const KvCache::SeqId seq = kv.create_sequence();
    ASSERT_TRUE(kv.reserve(seq, 1));
    std::vector<int32_t> slots = {kv.slot(seq, 0)}, table = {0, 1, 0, kv.block_table(seq)[0]};
    const int32_t ts = g.add_tensor(Tensor::contiguous(DType::I32, {1}, slots.data()));
    const int32_t tt = g.add_tensor(Tensor::contiguous(DType::I32, {4, 1}, table.data()));
    const int32_t kc = g.add_tensor(kv.k_storage(0)), vc = g.add_tensor(kv.v_storage(0));
    const int32_t k = g.new_tensor(DType::F32, {8, 1, 1}, "k"), q = g.new_tensor(DType::F32, {8, 1, 1}, "q");
    const int32_t o = g.new_tensor(DType::F32, {8, 1, 1}, "o");
    Node w;
    w.op = Op::KvWrite;
    w.dst = kc;
    w.src = {k, ts, -1, -1, -1};
    g.add_node(w);
    Node a;
    a.op = Op::Attention;
    a.dst = o;
    a.src = {q, kc, vc, tt, -1};
    a.f[0] = 0.5f;
    g.add_node(a);
    g.allocate();
    for (int i = 0; i < 16; ++i) g.tensor(x).row<float>(0)[i] = float(i);
    be->execute(g, 0, 1);
    EXPECT_FLOAT_EQ(g.tensor(y).row<float>(0)[15], 30.0f);
    for (size_t n : {size_t(1), size_t(2)}) {
      const OpSupport s = be->supports(g, g.nodes()[n]);
      EXPECT_FALSE(s.supported);
      if (dir == kAbi3Dir)
        EXPECT_NE(s.reason.find("built for ABI 3, whose KvWrite and Attention took one sequence per node"),
                  std::string::npos)
            << s.reason;
      else
        EXPECT_NE(s.reason.find("not implemented by example_cpu"), std::string::npos) << s.reason;
    }
  }
}

// Plugins built for ABI 3 and 4 index the nodes without ABI 5's src4: the host hands
// them the nodes in that layout (a run of two nodes computes the second one right),
// and never gives them an Attention with a sliding window or sinks, or a YaRN Rope,
// whose parameters they would ignore.
TEST_F(PluginAbi, OlderGenerationsGetTheirNodeLayoutAndNoneOfAbi5sParameters) {
  for (const auto& [dir, file, abi] : {std::tuple<std::string, std::string, int>{kAbi3Dir, "test_example_abi3.so", 3},
                                       {kAbi4Dir, "test_example_abi4.so", 4}}) {
    PluginRegistry reg(only_folder(dir));
    const PluginRecord& r = by_file(reg, file);
    ASSERT_TRUE(r.usable) << r.reason;
    std::shared_ptr<Backend> be = reg.create_backend("example_cpu", nullptr);
    Graph g;
    const int32_t x = g.new_tensor(DType::F32, {8, 2}, "x");
    const int32_t y = g.new_tensor(DType::F32, {8, 2}, "y");
    const int32_t z = g.new_tensor(DType::F32, {8, 2}, "z");
    Node add;
    add.op = Op::Add;
    add.dst = y;
    add.src = {x, x, -1, -1, -1};
    g.add_node(add);
    Node mul;
    mul.op = Op::Mul;
    mul.dst = z;
    mul.src = {y, x, -1, -1, -1};
    g.add_node(mul);
    const int32_t q = g.new_tensor(DType::F32, {8, 2, 1}, "q"), o = g.new_tensor(DType::F32, {8, 2, 1}, "o");
    const int32_t pos = g.new_tensor(DType::I32, {1}, "pos");
    Node rope;
    rope.op = Op::Rope;
    rope.dst = o;
    rope.src = {q, pos, -1, -1, -1};
    rope.i[0] = 8;
    rope.i[1] = kRopeNeox;
    rope.f[0] = 10000.f, rope.f[1] = 0.25f, rope.f[2] = 1.f, rope.f[3] = 1.f;
    rope.i[6] = 1, rope.i[7] = 3;
    g.add_node(rope);
    g.allocate();
    for (int i = 0; i < 16; ++i) g.tensor(x).row<float>(0)[i] = float(i);
    be->execute(g, 0, 2);
    EXPECT_FLOAT_EQ(g.tensor(z).row<float>(0)[15], 450.0f) << "ABI " << abi;  // (15 + 15) * 15
    const OpSupport s = be->supports(g, g.nodes()[2]);
    EXPECT_FALSE(s.supported);
    EXPECT_NE(s.reason.find("built for ABI " + std::to_string(abi) + ", whose Rope has no YaRN"), std::string::npos)
        << s.reason;
  }
}

TEST_F(PluginAbi, TesseraBackendsListsThemAndExitsZero) {
  const std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera";
  const std::string out = (cache.path / "out.txt").string();
  const std::string cmd = "TESSERA_PLUGIN_PATH='" + kAbiDir + "' '" + bin + "' backends > '" + out + "' 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("ABI version 2" + kExpects + kRebuild + " against the current SDK (ABI 1 and 2 passed C++ objects)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("backend plugin without a backend function table"), std::string::npos) << text;
  EXPECT_NE(text.find("test_short_table"), std::string::npos) << text;
  EXPECT_NE(text.find("example_cpu"), std::string::npos) << text;
  EXPECT_NE(text.find("cpu_scalar"), std::string::npos) << text;
}
