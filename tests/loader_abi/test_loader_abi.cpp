// The loader side of the C plugin ABI, in process: a ModelLoader behind the plugin glue
// (core/glue/loader_glue.cpp) and the host's adapter (plugin_loader_adapter.h) gives the
// same ModelFile as the loader called directly — metadata (every key, type and value,
// nested arrays, the tokenizer vocabulary), tensors, the description — and passes the
// loader's error messages through unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <variant>
#include <vector>

#include "gguf_reader.h"
#include "gguf_writer.h"
#include "hf_model.h"
#include "plugin/plugin_loader_adapter.h"
#include "safetensors_reader.h"
#include "tessera/error.h"
#include "tessera/model_description.h"
#include "tessera/model_file.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

// ---- Loaders as the bundled plugins define them, plus test doubles ----

class GgufLoader final : public ModelLoader {
 public:
  std::string name() const override { return "gguf"; }
  bool recognizes(const std::string& path) const override { return gguf::looks_like_gguf(path); }
  std::unique_ptr<ModelFile> open(const std::string& path) const override { return gguf::GgufFile::open(path); }
};

class SafetensorsLoader final : public ModelLoader {
 public:
  std::string name() const override { return "safetensors"; }
  bool recognizes(const std::string& path) const override { return safetensors::looks_like_checkpoint(path); }
  std::unique_ptr<ModelFile> open(const std::string& path) const override { return hf::CheckpointFile::open(path); }
};

// A ModelFile made of whatever the test puts in it; describe() returns `desc` or
// throws as `throw_mode` says.
class FakeFile final : public ModelFile {
 public:
  std::string format() const override { return "fake v1"; }
  std::string path() const override { return path_; }
  const Metadata& metadata() const override { return meta; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  ModelDescription describe() const override {
    switch (throw_mode) {
      case 1: throw Error("fake.bin: the model's architecture 'x\xe2\x9c\x93' is not one tessera knows");
      case 2: throw std::runtime_error("a std::runtime_error from describe");
      case 3: throw 42;  // not a std::exception
      default: return desc;
    }
  }

  std::string path_ = "/nowhere/fake.bin";
  Metadata meta;
  std::vector<TensorInfo> tensors_;
  ModelDescription desc;
  int throw_mode = 0;
  void set_size(uint64_t n) { file_size_ = n; }
};

// Opens FakeFiles built by a function the test sets.
std::function<std::unique_ptr<FakeFile>()> g_make_fake;

class FakeLoader final : public ModelLoader {
 public:
  std::string name() const override { return "fake"; }
  bool recognizes(const std::string& path) const override {
    if (path == "throw") throw std::runtime_error("recognizes threw");
    return path.ends_with(".fake");
  }
  std::unique_ptr<ModelFile> open(const std::string& path) const override {
    if (path == "throw-int") throw 7;
    if (path == "no-reason") throw Error("");
    auto f = g_make_fake();
    f->path_ = path;
    return f;
  }
};

int g_destroyed = 0;
void counting_destroy(void* instance) {
  ++g_destroyed;
  glue::destroy_loader(instance);
}

void* create_gguf(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return glue::create_loader("gguf", args, error, error_size,
                             [](const TesseraCreateArgs*) { return std::make_unique<GgufLoader>(); });
}
void* create_safetensors(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return glue::create_loader("safetensors", args, error, error_size,
                             [](const TesseraCreateArgs*) { return std::make_unique<SafetensorsLoader>(); });
}
void* create_fake(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return glue::create_loader("fake", args, error, error_size,
                             [](const TesseraCreateArgs*) { return std::make_unique<FakeLoader>(); });
}

// A descriptor as a plugin built on the glue exports it (the table may be a
// truncated copy of the glue's, as an older plugin's would be).
struct FakePlugin {
  TesseraLoaderApi table = glue::kLoaderApi;
  TesseraPluginDescriptor desc{};
  std::shared_ptr<ModelLoader> loader;

  FakePlugin(const char* name, void* (*create)(const TesseraCreateArgs*, char*, size_t),
             size_t table_size = sizeof(TesseraLoaderApi)) {
    table.struct_size = static_cast<uint32_t>(table_size);
    desc.abi_version = TESSERA_PLUGIN_ABI_VERSION;
    desc.struct_size = sizeof(TesseraPluginDescriptor);
    desc.name = name;
    desc.kind = TESSERA_PLUGIN_LOADER;
    desc.description = "test";
    desc.probe = nullptr;
    desc.create = create;
    desc.destroy = &counting_destroy;
    desc.backend = nullptr;
    desc.loader = &table;
    TesseraCreateArgs args{};
    args.struct_size = sizeof args;
    char error[512] = {};
    void* inst = desc.create(&args, error, sizeof error);
    if (!inst) throw std::runtime_error(std::string("create failed: ") + error);
    loader = detail::adapt_loader(name, &desc, inst, nullptr);
  }
};

std::string fixtures() { return TESSERA_FIXTURES_DIR; }

std::vector<std::string> list(const fs::path& dir, bool folders, const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (folders ? e.is_directory() : (e.is_regular_file() && e.path().extension() == ext))
      out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- Comparisons ----

void expect_meta_eq(const MetaValue& a, const MetaValue& b, const std::string& ctx) {
  ASSERT_EQ(a.type, b.type) << ctx;
  ASSERT_EQ(a.value.index(), b.value.index()) << ctx << ": the value's representation differs";
  if (a.type == MetaType::Array) {
    ASSERT_EQ(a.elem_type, b.elem_type) << ctx;
  }
  if (const auto* x = a.as_array()) {
    const auto* y = b.as_array();
    ASSERT_EQ(x->size(), y->size()) << ctx;
    for (size_t i = 0; i < x->size(); ++i) {
      expect_meta_eq((*x)[i], (*y)[i], ctx + "[" + std::to_string(i) + "]");
      if (testing::Test::HasFatalFailure()) return;
    }
  } else if (const auto* s = a.as_string()) {
    EXPECT_EQ(*s, *b.as_string()) << ctx;
  } else if (const auto* d = std::get_if<double>(&a.value)) {
    const double e = std::get<double>(b.value);
    EXPECT_EQ(std::memcmp(d, &e, sizeof e), 0) << ctx << ": " << *d << " vs " << e;
  } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
    EXPECT_EQ(*i, std::get<int64_t>(b.value)) << ctx;
  } else {
    EXPECT_EQ(std::get<uint64_t>(a.value), std::get<uint64_t>(b.value)) << ctx;
  }
}

void expect_metadata_eq(const Metadata& a, const Metadata& b, const std::string& ctx) {
  ASSERT_EQ(a.all().size(), b.all().size()) << ctx;
  auto ia = a.all().begin();
  auto ib = b.all().begin();
  for (; ia != a.all().end(); ++ia, ++ib) {
    ASSERT_EQ(ia->first, ib->first) << ctx;
    expect_meta_eq(ia->second, ib->second, ctx + " key '" + ia->first + "'");
    if (testing::Test::HasFatalFailure()) return;
  }
}

// The two files are separate mappings: the bytes are compared, not the pointers.
void expect_tensors_eq(const std::vector<TensorInfo>& a, const std::vector<TensorInfo>& b, const std::string& ctx) {
  ASSERT_EQ(a.size(), b.size()) << ctx;
  for (size_t i = 0; i < a.size(); ++i) {
    const TensorInfo& x = a[i];
    const TensorInfo& y = b[i];
    const std::string c = ctx + " tensor " + std::to_string(i) + " '" + x.name + "'";
    EXPECT_EQ(x.name, y.name) << c;
    EXPECT_EQ(x.type, y.type) << c;
    EXPECT_EQ(x.ne, y.ne) << c;
    EXPECT_EQ(x.offset, y.offset) << c;
    EXPECT_EQ(x.file_offset, y.file_offset) << c;
    ASSERT_EQ(x.nbytes, y.nbytes) << c;
    ASSERT_EQ(x.data == nullptr, y.data == nullptr) << c;
    if (x.data && x.nbytes) {
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << c << ": bytes differ";
    }
  }
}

void expect_description_eq(const ModelDescription& a, const ModelDescription& b, const std::string& ctx) {
  EXPECT_EQ(a.architecture, b.architecture) << ctx;
  EXPECT_EQ(a.name, b.name) << ctx;
  expect_metadata_eq(a.hparams, b.hparams, ctx + " hparams");
  expect_tensors_eq(a.tensors, b.tensors, ctx + " description");
  EXPECT_EQ(a.origin, b.origin) << ctx;
}

void expect_same_file(const ModelFile& direct, const ModelFile& glued, const std::string& ctx) {
  EXPECT_EQ(direct.format(), glued.format()) << ctx;
  EXPECT_EQ(direct.path(), glued.path()) << ctx;
  EXPECT_EQ(direct.file_size(), glued.file_size()) << ctx;
  expect_metadata_eq(direct.metadata(), glued.metadata(), ctx);
  if (testing::Test::HasFatalFailure()) return;
  expect_tensors_eq(direct.tensors(), glued.tensors(), ctx);
}

// `must_succeed`: the fixtures describe themselves; a synthetic file may fail to, with
// the same message either way.
void expect_same_description(const ModelFile& direct, const ModelFile& glued, const std::string& ctx,
                             bool must_succeed) {
  std::string de, ge;
  ModelDescription d, g;
  try {
    d = direct.describe();
  } catch (const Error& e) {
    de = e.what();
  }
  try {
    g = glued.describe();
  } catch (const Error& e) {
    ge = e.what();
  }
  EXPECT_EQ(de, ge) << ctx << ": describe() errors differ";
  if (must_succeed) {
    EXPECT_EQ(de, "") << ctx;
  }
  if (de.empty() && ge.empty()) {
    expect_description_eq(d, g, ctx);
    // A second describe() gives the same.
    expect_description_eq(d, glued.describe(), ctx + " (again)");
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a tessera::Error: ") + e.what();
  }
  return "(no error)";
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("tessera_loader_abi_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

// ---- The fixtures, through the glue and directly ----

class GgufFixture : public testing::TestWithParam<std::string> {};

TEST_P(GgufFixture, RoundTripIsLossless) {
  const std::string path = (fs::path(fixtures()) / "models" / GetParam()).string();
  FakePlugin plugin("gguf", &create_gguf);
  ASSERT_TRUE(plugin.loader->recognizes(path));
  auto direct = gguf::GgufFile::open(path);
  auto glued = plugin.loader->open(path);
  expect_same_file(*direct, *glued, GetParam());
  ASSERT_FALSE(HasFatalFailure());
  // The tokenizer vocabulary, element by element (expect_same_file compared it; say so).
  if (const MetaValue* v = direct->metadata().find("tokenizer.ggml.tokens")) {
    ASSERT_TRUE(glued->metadata().find("tokenizer.ggml.tokens"));
    EXPECT_EQ(v->as_array()->size(), glued->metadata().find("tokenizer.ggml.tokens")->as_array()->size());
  }
  expect_same_description(*direct, *glued, GetParam(), true);
}

std::vector<std::string> gguf_fixtures() {
  auto v = list(fs::path(fixtures()) / "models", false, ".gguf");
  if (v.empty()) v.push_back("(none)");
  return v;
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Models, GgufFixture, testing::ValuesIn(gguf_fixtures()), param_name);

class HfFixture : public testing::TestWithParam<std::string> {};

TEST_P(HfFixture, RoundTripIsLossless) {
  const std::string path = (fs::path(fixtures()) / "hf" / "models" / GetParam()).string();
  if (!fs::is_directory(path)) GTEST_SKIP() << "no Hugging Face fixtures at " << path;
  FakePlugin plugin("safetensors", &create_safetensors);
  ASSERT_TRUE(plugin.loader->recognizes(path));
  auto direct = hf::CheckpointFile::open(path);
  auto glued = plugin.loader->open(path);
  expect_same_file(*direct, *glued, GetParam());
  ASSERT_FALSE(HasFatalFailure());
  expect_same_description(*direct, *glued, GetParam(), true);
}

std::vector<std::string> hf_fixtures() {
  auto v = list(fs::path(fixtures()) / "hf" / "models", true, "");
  if (v.empty()) v.push_back("(none)");
  return v;
}

INSTANTIATE_TEST_SUITE_P(Folders, HfFixture, testing::ValuesIn(hf_fixtures()), param_name);

TEST(LoaderAbi, FixturesArePresent) {
  if (!fs::is_directory(fs::path(fixtures()) / "models")) GTEST_SKIP() << "no fixtures at " << fixtures();
  EXPECT_GT(list(fs::path(fixtures()) / "models", false, ".gguf").size(), 0u);
}

// ---- Synthetic files ----

// Every metadata type, nested arrays (of arrays of different element types), a large
// string array, odd strings: the same after the round trip.
TEST(LoaderAbi, EveryMetadataShapeRoundTrips) {
  using namespace gguf;
  TempDir dir;
  GgufWriter w(3);
  w.set_string("general.architecture", "llama");
  w.set_u8("test.u8", 250);
  w.set_i8("test.i8", -100);
  w.set_u16("test.u16", 65000);
  w.set_i16("test.i16", -32000);
  w.set_u32("test.u32", 4000000000u);
  w.set_i32("test.i32", -2000000000);
  w.set_f32("test.f32", 0.1f);
  w.set_f32("test.f32_nan", std::numeric_limits<float>::quiet_NaN());
  w.set_bool("test.bool", true);
  w.set_bool("test.bool_false", false);
  w.set_string("test.string", "hello \xe2\x9c\x93 world");
  w.set_string("test.empty_string", "");
  w.set_string("test.nul", std::string("a\0b\nc", 5));
  w.set_u64("test.u64", std::numeric_limits<uint64_t>::max());
  w.set_i64("test.i64", std::numeric_limits<int64_t>::min());
  w.set_f64("test.f64", -1.0 / 3.0);
  w.set_i32_array("test.arr_i32", {1, -2, 3, -4});
  w.set_array("test.arr_u64", MetaType::U64, {meta_u64(0), meta_u64(~0ull)});
  w.set_array("test.arr_empty", MetaType::F64, {});
  w.set_array("test.nested", MetaType::Array,
              {meta_i32_array({1, 2}), meta_i32_array({}), meta_array(MetaType::I32, {meta_i32(7)})});
  w.set_array("test.nested_mixed", MetaType::Array,
              {meta_string_array({"x", std::string("y\0z", 3)}), meta_f32_array({1.0f}),
               meta_array(MetaType::Array, {meta_array(MetaType::U8, {meta_u8(9)}), meta_array(MetaType::Array, {})})});
  std::vector<std::string> vocab(150000);
  for (size_t i = 0; i < vocab.size(); ++i) vocab[i] = "tok" + std::to_string(i) + (i % 7 ? "" : "\xe2\x96\x81");
  w.set_string_array("tokenizer.ggml.tokens", vocab);
  std::vector<float> data(24);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) * 0.5f;
  w.add_tensor("t0", DType::F32, {8, 3}, data.data(), data.size() * sizeof(float));
  w.add_tensor("t1", DType::F32, {2, 2, 2, 3}, data.data(), data.size() * sizeof(float));
  const std::string path = dir.file("shapes.gguf");
  w.write_file(path);

  FakePlugin plugin("gguf", &create_gguf);
  auto direct = gguf::GgufFile::open(path);
  const auto t0 = std::chrono::steady_clock::now();
  auto glued = plugin.loader->open(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_same_file(*direct, *glued, "shapes.gguf");
  ASSERT_FALSE(HasFatalFailure());
  // 150k strings are 150k meta_get calls: linear, well under a second on any machine
  // (quadratic would be minutes).
  EXPECT_LT(seconds, 10.0) << "opening through the glue took " << seconds << " s";
  const auto* nested = glued->metadata().find("test.nested_mixed");
  ASSERT_TRUE(nested && nested->as_array());
  const auto& items = *nested->as_array();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].elem_type, MetaType::String);
  EXPECT_EQ(*(*items[0].as_array())[1].as_string(), std::string("y\0z", 3));
  EXPECT_EQ(items[2].elem_type, MetaType::Array);
  EXPECT_EQ((*items[2].as_array())[0].as_array()->at(0).as_int(), 9);
  EXPECT_EQ(glued->metadata().get_string("test.nul"), std::string("a\0b\nc", 5));
  EXPECT_EQ(glued->metadata().find("test.u64")->type, MetaType::U64);
  EXPECT_EQ(std::get<uint64_t>(glued->metadata().find("test.u64")->value), ~0ull);
  // 4 dimensions survive.
  ASSERT_EQ(glued->tensors().size(), 2u);
  EXPECT_EQ(glued->tensors()[1].ne, (std::vector<int64_t>{2, 2, 2, 3}));
  expect_same_description(*direct, *glued, "shapes.gguf", false);
}

// Values in the shapes the readers make (u8-u32 and bool as int64, u64 as uint64) and
// descriptions made by hand: hparams, tensors with up to 8 dimensions and origin.
TEST(LoaderAbi, FakeFileAndDescriptionRoundTrip) {
  static std::vector<uint8_t> bytes(4096, 0x5a);
  g_make_fake = [] {
    auto f = std::make_unique<FakeFile>();
    f->set_size(123456789012ull);
    MetaValue b;
    b.type = MetaType::Bool;
    b.value = int64_t{1};
    f->meta.set("b", b);
    f->meta.set("s", gguf::meta_string("x"));
    f->meta.set("u32", gguf::meta_u32(7));
    f->meta.set("f64", gguf::meta_f64(2.5));
    TensorInfo t;
    t.name = "eight";
    t.type = DType::Q8_0;
    t.ne = {32, 2, 1, 1, 1, 1, 1, 3};
    t.offset = 64;
    t.file_offset = 1088;
    t.nbytes = 6 * 34;
    t.data = bytes.data();
    f->tensors_.push_back(t);
    TensorInfo z = t;
    z.name = "";  // nameless and empty
    z.ne = {};
    z.nbytes = 0;
    z.data = nullptr;
    f->tensors_.push_back(z);
    f->desc.architecture = "qwen3";
    f->desc.name = "Fake \xe2\x9c\x93";
    f->desc.hparams.set("block_count", gguf::meta_u32(2));
    f->desc.hparams.set("rope.freq_base", gguf::meta_f32(1e6f));
    f->desc.hparams.set("vocab", gguf::meta_string_array({"a", "b"}));
    TensorInfo d = t;
    d.name = "token_embd.weight";
    d.ne = {32, 6};
    f->desc.tensors.push_back(d);
    f->desc.origin["token_embd.weight"] = "model.embed_tokens.weight";
    f->desc.origin["block_count"] = "num_hidden_layers";
    return f;
  };
  FakePlugin plugin("fake", &create_fake);
  auto direct = g_make_fake();
  direct->path_ = "m.fake";
  auto glued = plugin.loader->open("m.fake");
  EXPECT_EQ(glued->format(), "fake v1");
  expect_same_file(*direct, *glued, "fake");
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(glued->tensors()[0].data, bytes.data());  // the plugin's memory, not a copy
  expect_same_description(*direct, *glued, "fake", true);
  EXPECT_EQ(glued->describe().origin_of("block_count"), "num_hidden_layers");
  EXPECT_EQ(glued->describe().tensors.at(0).data, bytes.data());
}

// ---- Errors ----

TEST(LoaderAbi, OpenErrorsPassThroughUnchanged) {
  const std::string good = (fs::path(fixtures()) / "models" / "llama-f32.gguf").string();
  if (!fs::exists(good)) GTEST_SKIP() << "no fixture at " << good;
  TempDir dir;
  FakePlugin plugin("gguf", &create_gguf);
  // A truncated file.
  std::ifstream in(good, std::ios::binary);
  std::vector<char> head(1000);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  for (size_t n : {size_t{3}, size_t{30}, size_t{1000}}) {
    const std::string path = dir.file("cut" + std::to_string(n) + ".gguf");
    std::ofstream(path, std::ios::binary).write(head.data(), static_cast<std::streamsize>(n));
    const std::string want = error_of([&] { gguf::GgufFile::open(path); });
    ASSERT_NE(want, "(no error)");
    EXPECT_EQ(error_of([&] { plugin.loader->open(path); }), want);
  }
  // A missing file.
  const std::string missing = dir.file("missing.gguf");
  EXPECT_EQ(error_of([&] { plugin.loader->open(missing); }),
            error_of([&] { gguf::GgufFile::open(missing); }));
  EXPECT_FALSE(plugin.loader->recognizes(missing));
  // A file that opens but does not describe itself (no general.architecture): the
  // reader's describe() message, unchanged.
  {
    gguf::GgufWriter w(3);
    w.set_u32("x.block_count", 1);
    const std::string path = dir.file("noarch.gguf");
    w.write_file(path);
    auto direct = gguf::GgufFile::open(path);
    auto glued = plugin.loader->open(path);
    const std::string want = error_of([&] { direct->describe(); });
    ASSERT_NE(want, "(no error)");
    EXPECT_EQ(error_of([&] { glued->describe(); }), want);
  }
  // A checkpoint folder without config.json.
  FakePlugin hf("safetensors", &create_safetensors);
  fs::create_directories(dir.file("empty"));
  const std::string want = error_of([&] { hf::CheckpointFile::open(dir.file("empty")); });
  ASSERT_NE(want, "(no error)");
  EXPECT_EQ(error_of([&] { hf.loader->open(dir.file("empty")); }), want);
}

TEST(LoaderAbi, ExceptionsInsideThePluginBecomeErrors) {
  FakePlugin plugin("fake", &create_fake);
  g_make_fake = [] { return std::make_unique<FakeFile>(); };
  // recognizes() that throws: not recognized.
  EXPECT_FALSE(plugin.loader->recognizes("throw"));
  EXPECT_TRUE(plugin.loader->recognizes("x.fake"));
  // open() throwing something that is not a std::exception.
  EXPECT_EQ(error_of([&] { plugin.loader->open("throw-int"); }), "unknown exception (not a std::exception)");
  // An empty message still says something.
  EXPECT_NE(error_of([&] { plugin.loader->open("no-reason"); }).find("fake: cannot open no-reason"),
            std::string::npos);
  // describe() throwing a tessera::Error, a std::exception, anything.
  g_make_fake = [] {
    auto f = std::make_unique<FakeFile>();
    f->throw_mode = 1;
    return f;
  };
  auto m1 = plugin.loader->open("1.fake");
  EXPECT_EQ(error_of([&] { m1->describe(); }), "fake.bin: the model's architecture 'x\xe2\x9c\x93' is not one tessera knows");
  g_make_fake = [] {
    auto f = std::make_unique<FakeFile>();
    f->throw_mode = 2;
    return f;
  };
  auto m2 = plugin.loader->open("2.fake");
  EXPECT_EQ(error_of([&] { m2->describe(); }), "a std::runtime_error from describe");
  g_make_fake = [] {
    auto f = std::make_unique<FakeFile>();
    f->throw_mode = 3;
    return f;
  };
  auto m3 = plugin.loader->open("3.fake");
  EXPECT_EQ(error_of([&] { m3->describe(); }), "unknown exception (not a std::exception)");
  EXPECT_EQ(error_of([&] { m3->describe(); }), "unknown exception (not a std::exception)");  // and again
}

TEST(LoaderAbi, TensorWithMoreThanEightDimensionsIsAnError) {
  g_make_fake = [] {
    auto f = std::make_unique<FakeFile>();
    TensorInfo t;
    t.name = "nine";
    t.ne.assign(9, 1);
    f->tensors_.push_back(t);
    return f;
  };
  FakePlugin plugin("fake", &create_fake);
  const std::string e = error_of([&] { plugin.loader->open("9.fake"); });
  EXPECT_NE(e.find("loader plugin fake: tensor 0 of 1 cannot be read"), std::string::npos) << e;
}

bool g_trapped = false;
int32_t trap_describe(TesseraModel*, char*, size_t) {
  g_trapped = true;
  return -1;
}
const char* trap_name(const TesseraModel*) {
  g_trapped = true;
  return "trap";
}

// An older plugin whose table ends before describe: the file opens, describe() says why
// it cannot (and nothing past the table's end is called).
TEST(LoaderAbi, TableWithoutDescribe) {
  const std::string path = (fs::path(fixtures()) / "models" / "llama-f32.gguf").string();
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture at " << path;
  FakePlugin plugin("gguf", &create_gguf, offsetof(TesseraLoaderApi, describe));
  // The functions past the table's end are traps: the host must not call them.
  plugin.table.describe = &trap_describe;
  plugin.table.architecture = &trap_name;
  plugin.table.display_name = &trap_name;
  auto direct = gguf::GgufFile::open(path);
  auto glued = plugin.loader->open(path);
  expect_same_file(*direct, *glued, "old table");
  const std::string e = error_of([&] { glued->describe(); });
  EXPECT_NE(e.find("loader plugin gguf:"), std::string::npos) << e;
  EXPECT_NE(e.find("no describe function"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_FALSE(g_trapped);

  // A table that ends right after describe: the description lacks its architecture.
  FakePlugin plugin2("gguf", &create_gguf, offsetof(TesseraLoaderApi, architecture));
  plugin2.table.architecture = &trap_name;
  plugin2.table.display_name = &trap_name;
  auto glued2 = plugin2.loader->open(path);
  const std::string e2 = error_of([&] { glued2->describe(); });
  EXPECT_NE(e2.find("describe gave no architecture"), std::string::npos) << e2;
  EXPECT_FALSE(g_trapped);
}

// ---- Lifetimes and the glue's own functions ----

TEST(LoaderAbi, InstanceOutlivesItsModels) {
  const std::string path = (fs::path(fixtures()) / "models" / "llama-f32.gguf").string();
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture at " << path;
  g_destroyed = 0;
  // The descriptor and table are static in a real plugin: here they outlive the test's
  // loader and models.
  FakePlugin plugin("gguf", &create_gguf);
  std::unique_ptr<ModelFile> a = plugin.loader->open(path);
  std::unique_ptr<ModelFile> b = plugin.loader->open(path);
  plugin.loader.reset();  // the loader is gone; its models are not
  EXPECT_EQ(g_destroyed, 0);
  a.reset();
  EXPECT_EQ(g_destroyed, 0);
  ModelDescription d = b->describe();
  EXPECT_FALSE(d.architecture.empty());
  const TensorInfo& t = b->tensors().back();
  volatile uint8_t sum = 0;
  for (size_t i = 0; i < t.nbytes; ++i) sum = sum + static_cast<const uint8_t*>(t.data)[i];
  b.reset();
  EXPECT_EQ(g_destroyed, 1);

  g_destroyed = 0;
  FakePlugin other("gguf", &create_gguf);
  other.loader.reset();
  EXPECT_EQ(g_destroyed, 1);
}

TEST(LoaderAbi, CreateLoaderCatches) {
  char error[256] = {};
  void* inst = glue::create_loader("broken", nullptr, error, sizeof error,
                                   [](const TesseraCreateArgs*) -> std::unique_ptr<ModelLoader> {
                                     throw Error("no such thing");
                                   });
  EXPECT_EQ(inst, nullptr);
  EXPECT_STREQ(error, "broken: no such thing");
  inst = glue::create_loader("empty", nullptr, error, sizeof error,
                             [](const TesseraCreateArgs*) -> std::unique_ptr<ModelLoader> { return nullptr; });
  EXPECT_EQ(inst, nullptr);
  EXPECT_STREQ(error, "empty: create returned no loader");
  glue::destroy_loader(nullptr);  // harmless
}

TEST(LoaderAbi, FindOption) {
  TesseraOption opts[] = {{"a", "1"}, {"b", "two"}, {nullptr, "x"}};
  TesseraCreateArgs args{};
  args.struct_size = sizeof args;
  args.options = opts;
  args.option_count = 3;
  EXPECT_STREQ(glue::find_option(&args, "b"), "two");
  EXPECT_STREQ(glue::find_option(&args, "a"), "1");
  EXPECT_EQ(glue::find_option(&args, "c"), nullptr);
  EXPECT_EQ(glue::find_option(nullptr, "a"), nullptr);
  // An older host whose args end before option_count: nothing is read.
  args.struct_size = offsetof(TesseraCreateArgs, option_count);
  EXPECT_EQ(glue::find_option(&args, "a"), nullptr);
}

// The C functions themselves: out-of-range indexes and paths are -1, views before
// describe() are empty, strings stay put.
TEST(LoaderAbi, TableBoundaries) {
  using namespace gguf;
  TempDir dir;
  GgufWriter w(3);
  w.set_array("n", MetaType::Array, {meta_i32_array({5, 6})});
  w.set_string("s", "str");
  const std::string path = dir.file("b.gguf");
  w.write_file(path);
  const TesseraLoaderApi& api = glue::kLoaderApi;
  char error[256] = {};
  void* self = create_gguf(nullptr, error, sizeof error);
  ASSERT_NE(self, nullptr) << error;
  EXPECT_EQ(api.open(self, dir.file("none.gguf").c_str(), error, sizeof error), nullptr);
  EXPECT_NE(std::string(error).find("none.gguf"), std::string::npos) << error;
  TesseraModel* m = api.open(self, path.c_str(), error, sizeof error);
  ASSERT_NE(m, nullptr) << error;
  EXPECT_STREQ(api.format(m), "gguf v3");
  EXPECT_EQ(api.meta_count(m, TESSERA_VIEW_FILE), 2u);
  EXPECT_EQ(api.meta_count(m, TESSERA_VIEW_DESCRIPTION), 0u);
  EXPECT_EQ(api.meta_count(m, 7), 0u);
  EXPECT_EQ(api.tensor_count(m, TESSERA_VIEW_DESCRIPTION), 0u);
  EXPECT_EQ(api.architecture(m), nullptr);
  const char* key = nullptr;
  TesseraMetaValue v{};
  ASSERT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 0, nullptr, 0, &key, &v), 0);
  EXPECT_STREQ(key, "n");
  EXPECT_EQ(v.type, TESSERA_META_ARRAY);
  EXPECT_EQ(v.elem_type, TESSERA_META_ARRAY);
  EXPECT_EQ(v.count, 1u);
  uint64_t p[2] = {0, 1};
  ASSERT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 0, p, 2, &key, &v), 0);
  EXPECT_EQ(v.type, TESSERA_META_I32);
  EXPECT_EQ(v.i, 6);
  p[1] = 2;
  EXPECT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 0, p, 2, &key, &v), -1);
  uint64_t p3[3] = {0, 0, 0};
  EXPECT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 0, p3, 3, &key, &v), -1);  // 5 is not an array
  EXPECT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 1, p, 1, &key, &v), -1);   // a string is not an array
  EXPECT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 2, nullptr, 0, &key, &v), -1);
  ASSERT_EQ(api.meta_get(m, TESSERA_VIEW_FILE, 1, nullptr, 0, &key, &v), 0);
  EXPECT_EQ(std::string(v.str, v.str_len), "str");
  TesseraTensorInfo ti{};
  EXPECT_EQ(api.tensor_get(m, TESSERA_VIEW_FILE, 0, &ti), -1);
  EXPECT_EQ(api.describe(m, error, sizeof error), -1);
  EXPECT_NE(std::string(error), "");
  EXPECT_EQ(api.architecture(m), nullptr);
  EXPECT_EQ(api.origin_get(m, 0, nullptr, nullptr), -1);
  api.close(m);
  glue::destroy_loader(self);
}

}  // namespace
}  // namespace tessera
