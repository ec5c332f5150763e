// safetensors reader: the Hugging Face fixture folders, and malformed files and
// checkpoint folders, each refused with one line that names the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "safetensors_reader.h"
#include "tessera/error.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::safetensors;
using namespace std::string_literals;

namespace {

fs::path hf_models() { return fs::path(TESSERA_FIXTURES_DIR) / "hf" / "models"; }

#define REQUIRE_FIXTURES()                                                        \
  do {                                                                            \
    if (!fs::is_directory(hf_models())) GTEST_SKIP() << "no " << hf_models();     \
  } while (0)

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A .safetensors image: the 8-byte little-endian header size, the header, the data.
std::string st_bytes(const std::string& header, const std::string& data = {}, uint64_t size_field = ~0ull) {
  uint64_t n = size_field == ~0ull ? header.size() : size_field;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Pads the header with spaces to a multiple of 8, as writers do.
std::string padded(std::string header) {
  while (header.size() % 8) header += ' ';
  return header;
}

// A valid two-tensor file: "a" F32 [2,3] then "b" BF16 [4].
const std::string kHeader =
    R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
    R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
std::string valid_file() {
  std::string data(32, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i + 1);
  return st_bytes(padded(kHeader), data);
}

// One tensor entry with the given dtype, shape and offsets text.
std::string one(const std::string& entry) { return "{\"t\":" + entry + "}"; }

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("tessera-st-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
    return p.string();
  }

  // Runs fn, which must throw a one-line tessera::Error holding every word.
  static void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> words,
                           const std::string& context = {}) {
    SCOPED_TRACE(context);
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << *words.begin() << "'";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
      EXPECT_EQ(msg.find('\r'), std::string::npos) << "not one line: " << msg;
      for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tessera::Error: " << e.what();
    }
  }
  void expect_file_error(const std::string& bytes, std::initializer_list<std::string> words,
                         const std::string& name = "bad.safetensors") {
    std::string path = write(name, bytes);
    expect_error([&] { SafetensorsFile::open(path); }, words, name);
  }
  void expect_header_error(const std::string& header, std::initializer_list<std::string> words,
                           const std::string& data = std::string(64, '\0')) {
    std::string path = write("bad.safetensors", st_bytes(padded(header), data));
    expect_error([&] { SafetensorsFile::open(path); }, words, header.substr(0, 200));
  }

  fs::path dir_;
};

// ---- the fixture folders ----------------------------------------------------------------

TEST(SafetensorsFixtures, EveryFolderOpens) {
  REQUIRE_FIXTURES();
  struct Expect {
    const char* name;
    size_t shards;
    size_t tensors;
  };
  const Expect expect[] = {
      {"llama-bf16", 1, 21}, {"llama-f32", 1, 21}, {"llama3-f32", 1, 21},
      {"qwen2-f32", 1, 27},  {"qwen3-f32", 2, 24}, {"qwen3moe-f32", 3, 69},
  };
  size_t seen = 0;
  for (const auto& e : fs::directory_iterator(hf_models())) {
    if (!e.is_directory()) continue;
    ++seen;
    const std::string name = e.path().filename().string();
    SCOPED_TRACE(name);
    EXPECT_TRUE(looks_like_checkpoint(e.path().string()));
    EXPECT_TRUE(looks_like_checkpoint((e.path() / "config.json").string()));
    std::unique_ptr<Checkpoint> c;
    ASSERT_NO_THROW(c = Checkpoint::open(e.path().string()));
    uint64_t bytes = 0;
    for (const auto& f : c->files()) bytes += fs::file_size(f->path());
    EXPECT_EQ(c->total_file_bytes(), bytes);
    for (const Expect& x : expect) {
      if (name != x.name) continue;
      EXPECT_EQ(c->files().size(), x.shards);
      EXPECT_EQ(c->tensors().size(), x.tensors);
    }
    // Shards in name order, tensors of each in data order, every pointer in its file's bytes.
    for (size_t i = 1; i < c->files().size(); ++i) EXPECT_LT(c->files()[i - 1]->path(), c->files()[i]->path());
    for (const auto& f : c->files()) {
      EXPECT_EQ(f->metadata().at("format"), "pt");
      const std::string raw = read_all(f->path());
      ASSERT_EQ(raw.size(), f->file_size());
      uint64_t prev_end = 0;
      for (const RawTensor& t : f->tensors()) {
        EXPECT_EQ(t.file, f->path());
        EXPECT_GE(t.file_offset, prev_end) << t.name;
        prev_end = t.file_offset + t.nbytes;
        ASSERT_LE(prev_end, raw.size());
        EXPECT_EQ(std::memcmp(t.data, raw.data() + t.file_offset, t.nbytes), 0) << t.name;
        EXPECT_EQ(c->find(t.name), &t);
      }
    }
    const RawTensor* norm = c->find("model.norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->dtype, "F32");
    EXPECT_EQ(norm->type, DType::F32);
    EXPECT_EQ(norm->shape, (std::vector<int64_t>{256}));
    EXPECT_EQ(norm->nbytes, 256u * 4);
    const RawTensor* emb = c->find("model.embed_tokens.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->shape, (std::vector<int64_t>{1024, 256}));
    EXPECT_EQ(c->find("no.such.tensor"), nullptr);
  }
  EXPECT_EQ(seen, std::size(expect));
}

TEST(SafetensorsFixtures, ShardedFolders) {
  REQUIRE_FIXTURES();
  auto c = Checkpoint::open((hf_models() / "qwen3-f32").string());
  ASSERT_EQ(c->files().size(), 2u);
  EXPECT_EQ(fs::path(c->files()[0]->path()).filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(fs::path(c->files()[1]->path()).filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(c->find("lm_head.weight"), nullptr);  // tied embeddings
  const RawTensor* down = c->find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(fs::path(down->file).filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(down->shape, (std::vector<int64_t>{256, 512}));
  const RawTensor* qn = c->find("model.layers.0.self_attn.q_norm.weight");
  ASSERT_NE(qn, nullptr);
  EXPECT_EQ(fs::path(qn->file).filename(), "model-00001-of-00002.safetensors");

  auto m = Checkpoint::open((hf_models() / "qwen3moe-f32").string());
  ASSERT_EQ(m->files().size(), 3u);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 8; ++e)
      for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
        std::string n = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + p + ".weight";
        const RawTensor* t = m->find(n);
        ASSERT_NE(t, nullptr) << n;
        EXPECT_EQ(t->type, DType::F32);
        EXPECT_EQ(t->shape, (std::vector<int64_t>{256, 256}));
      }
  const RawTensor* gate = m->find("model.layers.1.mlp.gate.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{8, 256}));
}

TEST(SafetensorsFixtures, Bf16Folder) {
  REQUIRE_FIXTURES();
  auto c = Checkpoint::open((hf_models() / "llama-bf16").string());
  size_t bf16 = 0, f32 = 0;
  for (const RawTensor* t : c->tensors()) {
    SCOPED_TRACE(t->name);
    if (t->shape.size() == 2) {
      EXPECT_EQ(t->dtype, "BF16");
      EXPECT_EQ(t->type, DType::BF16);
      EXPECT_EQ(t->nbytes, size_t(t->shape[0] * t->shape[1] * 2));
      ++bf16;
    } else {
      EXPECT_EQ(t->shape.size(), 1u);
      EXPECT_EQ(t->dtype, "F32");
      EXPECT_EQ(t->type, DType::F32);
      EXPECT_NE(t->name.find("norm"), std::string::npos);
      ++f32;
    }
  }
  EXPECT_EQ(bf16, 16u);
  EXPECT_EQ(f32, 5u);
  const RawTensor* lm = c->find("lm_head.weight");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(lm->shape, (std::vector<int64_t>{1024, 256}));
}

TEST(SafetensorsFixtures, FolderRecognition) {
  REQUIRE_FIXTURES();
  const std::string llama = (hf_models() / "llama-f32").string();
  EXPECT_EQ(checkpoint_folder(llama), llama);
  EXPECT_EQ(checkpoint_folder(llama + "/config.json"), llama);
  EXPECT_EQ(checkpoint_folder(llama + "/model.safetensors"), "");
  EXPECT_EQ(checkpoint_folder(llama + "/missing.json"), "");
  EXPECT_FALSE(looks_like_checkpoint(llama + "/model.safetensors"));
  EXPECT_FALSE(looks_like_checkpoint(hf_models().string()));  // no config.json
  EXPECT_FALSE(looks_like_checkpoint(""));
}

// ---- single files ---------------------------------------------------------------------

TEST_F(SafetensorsTest, ValidFile) {
  auto f = SafetensorsFile::open(write("ok.safetensors", valid_file()));
  ASSERT_EQ(f->tensors().size(), 2u);
  const RawTensor& a = f->tensors()[0];  // data order, not the header's
  const RawTensor& b = f->tensors()[1];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.type, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.nbytes, 24u);
  const uint64_t data_start = 8 + padded(kHeader).size();
  EXPECT_EQ(a.file_offset, data_start);
  EXPECT_EQ(static_cast<const uint8_t*>(a.data)[0], 1);
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.dtype, "BF16");
  EXPECT_EQ(b.type, DType::BF16);
  EXPECT_EQ(b.file_offset, data_start + 24);
  EXPECT_EQ(static_cast<const uint8_t*>(b.data)[0], 25);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->file_size(), valid_file().size());
}

TEST_F(SafetensorsTest, OtherDtypesEmptyAndUnalignedTensors) {
  // Data starts at an odd offset (no padding): F32 pointers unaligned, accepted.
  const std::string h =
      R"({"i":{"dtype":"I64","shape":[2],"data_offsets":[4,20]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("z":{"dtype":"F16","shape":[0,5],"data_offsets":[8,8]},"e":{"dtype":"BOOL","shape":[0],"data_offsets":[20,20]},)"
      R"("u":{"dtype":"U8","shape":[1],"data_offsets":[20,21]},"f8":{"dtype":"F8_E4M3","shape":[1,1],"data_offsets":[21,22]}})";
  ASSERT_NE((8 + h.size()) % 4, 0u);
  auto f = SafetensorsFile::open(write("ok.safetensors", st_bytes(h, std::string(22, 'x'))));
  ASSERT_EQ(f->tensors().size(), 6u);
  std::vector<std::string> order;
  for (const RawTensor& t : f->tensors()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"s", "i", "z", "e", "u", "f8"}));
  EXPECT_EQ(f->tensors()[0].shape.size(), 0u);
  EXPECT_EQ(f->tensors()[0].nbytes, 4u);
  EXPECT_EQ(f->tensors()[1].type, std::nullopt);
  EXPECT_EQ(f->tensors()[2].type, DType::F16);
  EXPECT_EQ(f->tensors()[2].nbytes, 0u);
}

TEST_F(SafetensorsTest, EmptyHeaderObject) {
  auto f = SafetensorsFile::open(write("ok.safetensors", st_bytes("{}      ")));
  EXPECT_TRUE(f->tensors().empty());
}

TEST_F(SafetensorsTest, TruncatedFiles) {
  const std::string full = valid_file();
  const size_t header_end = 8 + padded(kHeader).size();
  expect_file_error("", {"bad.safetensors", "empty"});
  expect_file_error(full.substr(0, 5), {"bad.safetensors", "truncated", "5 bytes"});
  expect_file_error(full.substr(0, 8), {"truncated", "header size"});
  expect_file_error(full.substr(0, 8 + 10), {"truncated", "header size"});
  expect_file_error(full.substr(0, header_end - 1), {"truncated", "header size"});
  expect_file_error(full.substr(0, header_end + 10), {"tensor 'a'", "outside the data section"});
  expect_file_error(full.substr(0, full.size() - 1), {"tensor 'b'", "outside the data section"});
  // Every cut point is refused.
  for (size_t cut = 0; cut < full.size(); ++cut) expect_file_error(full.substr(0, cut), {"bad.safetensors"});
}

TEST_F(SafetensorsTest, HeaderSize) {
  expect_file_error(st_bytes("{}", "", 1ull << 40), {"header size 1099511627776", "exceeds"});
  expect_file_error(st_bytes("{}", "", ~0ull - 1), {"header size", "exceeds"});
  expect_file_error(st_bytes("", "", 0), {"header size is 0"});
  expect_file_error(st_bytes("        "), {"all spaces"});
  // Over the cap but inside the (sparse) file.
  std::string path = write("huge.safetensors", st_bytes("{", "", 100'000'001));
  ASSERT_EQ(truncate(path.c_str(), 100'000'200), 0);
  expect_error([&] { SafetensorsFile::open(path); }, {"header size 100000001", "limit"});
}

TEST_F(SafetensorsTest, BadJson) {
  expect_header_error(R"({"t":{"dtype":"F32",})", {"not valid JSON"});
  expect_header_error(R"({"t":{"dtype":"F32"})", {"not valid JSON"});
  expect_header_error("{\"a\x01\nb\":1}", {"not valid JSON"});  // control bytes in the message are escaped
  expect_header_error("{\"\xff\xfe\":1}", {"not valid JSON"});    // invalid UTF-8
  expect_header_error(R"({"a":1}x})", {"not valid JSON"});
  expect_header_error(R"({"a":1} })", {"not valid JSON"});
  expect_file_error(st_bytes(R"({"a":1}})"), {"not valid JSON"});
  expect_file_error(st_bytes("{}\n  "), {"does not end with '}'"});
  expect_file_error(st_bytes("{}\0\0\0"s), {"does not end with '}'"});
  expect_file_error(st_bytes(" {}"), {"not a JSON object"});
}

TEST_F(SafetensorsTest, NotAnObject) {
  expect_header_error("[1,2,3]", {"not a JSON object"});
  expect_header_error("\"x\"", {"not a JSON object"});
  expect_header_error("42", {"not a JSON object"});
  expect_header_error(one("[1]"), {"tensor 't'", "expected an object"});
  expect_header_error(one("\"F32\""), {"tensor 't'", "expected an object"});
}

TEST_F(SafetensorsTest, Entries) {
  expect_header_error(one(R"({"dtype":"F7","shape":[1],"data_offsets":[0,1]})"), {"tensor 't'", "unknown dtype 'F7'"});
  expect_header_error(one(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})"), {"unknown dtype 'f32'"});
  expect_header_error(one(R"({"dtype":7,"shape":[1],"data_offsets":[0,4]})"), {"tensor 't'", "dtype", "string"});
  expect_header_error(one(R"({"shape":[1],"data_offsets":[0,4]})"), {"tensor 't'", "no dtype"});
  expect_header_error(one(R"({"dtype":"F32","data_offsets":[0,4]})"), {"tensor 't'", "no shape"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1]})"), {"tensor 't'", "no data_offsets"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})"),
                      {"tensor 't'", "unexpected key 'x'"});
  expect_header_error(one(R"({"dtype":"F32","shape":1,"data_offsets":[0,4]})"), {"tensor 't'", "shape", "array"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), {"tensor 't'", "1-element array"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"), {"3-element array"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":{"a":1}})"), {"data_offsets is a JSON object"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[-1,4]})"), {"data_offsets[0]", "unsigned"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.0]})"), {"data_offsets[1]", "unsigned"});
  expect_header_error(one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})"), {"tensor 't'", "begin > end"});
  expect_header_error(one(R"({"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]})"),
                      {"tensor 't'", "9 dimensions"});
  expect_header_error(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", {"empty tensor name"});
}

TEST_F(SafetensorsTest, ShapeAndRange) {
  expect_header_error(one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})"),
                      {"tensor 't'", "[2, 3]", "24 bytes", "span 20"});
  expect_header_error(one(R"({"dtype":"BF16","shape":[4],"data_offsets":[0,4]})"), {"8 bytes", "span 4"});
  expect_header_error(one(R"({"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]})"),
                      {"tensor 't'", "shape[0]", "non-negative"});
  expect_header_error(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,24]})"), {"shape[0]", "non-negative"});
  expect_header_error(one(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]})"),
                      {"tensor 't'", "overflow"});
  expect_header_error(one(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]})"),
                      {"tensor 't'", "overflow"});
  expect_header_error(one(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]})"),
                      {"tensor 't'", "too large"});
  expect_header_error(one(R"({"dtype":"U8","shape":[1e3],"data_offsets":[0,1000]})"), {"shape[0]"});
  // A zero dimension wins over an overflowing product.
  auto f = SafetensorsFile::open(write(
      "zero.safetensors",
      st_bytes(padded(one(R"({"dtype":"F32","shape":[0,4294967296,4294967296,16],"data_offsets":[0,0]})")))));
  EXPECT_EQ(f->tensors()[0].nbytes, 0u);

  expect_header_error(one(R"({"dtype":"F32","shape":[32],"data_offsets":[0,128]})"),
                      {"tensor 't'", "[0, 128]", "outside the data section (64 bytes"});
  expect_header_error(one(R"({"dtype":"U8","shape":[0],"data_offsets":[65,65]})"), {"outside the data section"});
  expect_header_error(one(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]})"),
                      {"too large"});
  expect_header_error(one(R"({"dtype":"U8","shape":[2],"data_offsets":[18446744073709551615,1]})"), {"begin > end"});
}

TEST_F(SafetensorsTest, OverlappingRanges) {
  expect_header_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                      {"tensor 'b'", "overlap", "tensor 'a'"});
  expect_header_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                      {"overlap"});
  // A small tensor inside a big one, after a third that ends before it.
  expect_header_error(R"({"big":{"dtype":"U8","shape":[40],"data_offsets":[0,40]},)"
                      R"("c":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                      R"("d":{"dtype":"U8","shape":[4],"data_offsets":[20,24]}})",
                      {"overlap", "tensor 'big'"});
  // Empty tensors overlap nothing; adjacent ranges are fine; gaps are allowed.
  auto f = SafetensorsFile::open(write(
      "ok.safetensors", st_bytes(padded(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                                        R"("e":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},)"
                                        R"("b":{"dtype":"U8","shape":[8],"data_offsets":[16,24]},)"
                                        R"("c":{"dtype":"U8","shape":[8],"data_offsets":[32,40]}})"),
                                 std::string(64, '\0'))));
  EXPECT_EQ(f->tensors().size(), 4u);
}

TEST_F(SafetensorsTest, DuplicateKeys) {
  expect_header_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      {"duplicate key 'a'"});
  expect_header_error(one(R"({"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]})"),
                      {"duplicate key 'dtype'"});
  expect_header_error(R"({"__metadata__":{"k":"1","k":"2"}})", {"duplicate key 'k'"});
  // The same key in different objects is fine.
  auto f = SafetensorsFile::open(write("ok.safetensors", st_bytes(R"({"__metadata__":{"dtype":"x"}})")));
  EXPECT_EQ(f->metadata().at("dtype"), "x");
}

TEST_F(SafetensorsTest, DeepNesting) {
  std::string deep = R"({"__metadata__":{"k":)" + std::string(100, '[') + std::string(100, ']') + "}}";
  expect_header_error(deep, {"nests deeper than 64"});
  std::string very_deep = "{\"x\":" + std::string(1'000'000, '[');  // would overflow a recursive parser's stack
  expect_header_error(very_deep + "}", {"nests deeper than 64"});
  std::string objs;
  for (int i = 0; i < 100000; ++i) objs += "{\"a\":";
  expect_header_error(objs + "}", {"nests deeper"});
}

TEST_F(SafetensorsTest, Metadata) {
  expect_header_error(R"({"__metadata__":{"format":"pt","n":3}})", {"__metadata__", "'n'", "expected a string"});
  expect_header_error(R"({"__metadata__":{"x":{"y":"z"}}})", {"__metadata__", "'x'", "expected a string"});
  expect_header_error(R"({"__metadata__":["pt"]})", {"__metadata__", "expected an object"});
  expect_header_error(R"({"__metadata__":null})", {"__metadata__", "expected an object"});
}

TEST_F(SafetensorsTest, HostileNamesStayOnOneLine) {
  expect_header_error("{\"t\\n\\u001b[31m\\u202e\":{\"dtype\":\"Q\\n\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                      {"unknown dtype", "\\x0a", "\\x1b"});
  expect_file_error(st_bytes("{}", "", 1ull << 40), {"x\\x0ay"}, "x\ny.safetensors");
}

// Random byte flips of a valid file: each one opens or is refused with one line.
TEST_F(SafetensorsTest, RandomMutations) {
  const std::string good = valid_file();
  std::mt19937 rng(1234);
  const std::string path = (dir_ / "m.safetensors").string();
  int opened = 0;
  for (int i = 0; i < 600; ++i) {
    std::string b = good;
    int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<char>(rng() % 256);
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    write("m.safetensors", b);
    try {
      auto f = SafetensorsFile::open(path);
      for (const RawTensor& t : f->tensors())
        if (t.nbytes) {
          volatile uint8_t x = static_cast<const uint8_t*>(t.data)[t.nbytes - 1];
          (void)x;
        }
      ++opened;
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(opened, 0);
}

TEST_F(SafetensorsTest, NotAFile) {
  expect_error([&] { SafetensorsFile::open(dir_.string()); }, {"not a regular file"});
  expect_error([&] { SafetensorsFile::open((dir_ / "none.safetensors").string()); },
               {"none.safetensors", "cannot open"});
}

// ---- checkpoint folders ---------------------------------------------------------------

class CheckpointTest : public SafetensorsTest {
 protected:
  // A shard holding the given tensor names (4 bytes of U8 each).
  static std::string shard(std::initializer_list<const char*> names) {
    std::string h = "{";
    uint64_t off = 0;
    for (const char* n : names) {
      if (off) h += ",";
      h += "\"" + std::string(n) + "\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[" + std::to_string(off) +
           "," + std::to_string(off + 4) + "]}";
      off += 4;
    }
    return st_bytes(padded(h + "}"), std::string(off, 'w'));
  }
  void index(const std::string& weight_map) {
    write("m/model.safetensors.index.json", R"({"metadata":{"total_size":16},"weight_map":)" + weight_map + "}");
  }
  std::string folder() const { return (dir_ / "m").string(); }
  void expect_open_error(std::initializer_list<std::string> words) {
    expect_error([&] { Checkpoint::open(folder()); }, words);
  }
};

TEST_F(CheckpointTest, SingleFileAndShards) {
  write("m/config.json", "{}");
  write("m/model.safetensors", shard({"x", "y"}));
  EXPECT_TRUE(looks_like_checkpoint(folder()));
  auto c = Checkpoint::open(folder());
  ASSERT_EQ(c->tensors().size(), 2u);
  EXPECT_EQ(c->total_file_bytes(), fs::file_size(dir_ / "m" / "model.safetensors"));

  // With an index, the index wins over model.safetensors.
  write("m/b.safetensors", shard({"q"}));
  write("m/a.safetensors", shard({"p", "r"}));
  index(R"({"q":"b.safetensors","p":"a.safetensors","r":"a.safetensors"})");
  c = Checkpoint::open(folder());
  ASSERT_EQ(c->files().size(), 2u);
  std::vector<std::string> names;
  for (const RawTensor* t : c->tensors()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"p", "r", "q"}));
  EXPECT_EQ(fs::path(c->find("q")->file).filename(), "b.safetensors");
  EXPECT_EQ(c->total_file_bytes(), fs::file_size(dir_ / "m" / "a.safetensors") + fs::file_size(dir_ / "m" / "b.safetensors"));
}

TEST_F(CheckpointTest, NoWeights) {
  write("m/config.json", "{}");
  EXPECT_FALSE(looks_like_checkpoint(folder()));
  expect_open_error({folder(), "no model.safetensors"});
  expect_error([&] { Checkpoint::open((dir_ / "nowhere").string()); }, {"nowhere", "not a folder"});
}

TEST_F(CheckpointTest, IndexNamesMissingShard) {
  write("m/a.safetensors", shard({"p"}));
  index(R"({"p":"a.safetensors","q":"gone.safetensors"})");
  expect_open_error({"model.safetensors.index.json", "'gone.safetensors'", "missing"});
}

TEST_F(CheckpointTest, ShardOutsideFolder) {
  write("x.safetensors", shard({"p"}));
  for (const char* bad : {"../x.safetensors", "/etc/passwd", "..", "sub/a.safetensors", ""}) {
    index(std::string(R"({"p":")") + bad + "\"}");
    expect_open_error({"plain file name"});
  }
}

TEST_F(CheckpointTest, TensorMissingFromItsShard) {
  write("m/a.safetensors", shard({"p"}));
  write("m/b.safetensors", shard({"q"}));
  index(R"({"p":"a.safetensors","q":"b.safetensors","r":"b.safetensors"})");
  expect_open_error({"tensor 'r'", "missing from shard 'b.safetensors'"});
}

TEST_F(CheckpointTest, TensorNotNamedByIndex) {
  write("m/a.safetensors", shard({"p", "extra"}));
  index(R"({"p":"a.safetensors"})");
  expect_open_error({"tensor 'extra'", "'a.safetensors'", "not named by the index"});
}

TEST_F(CheckpointTest, TensorInWrongOrTwoShards) {
  write("m/a.safetensors", shard({"p", "q"}));
  write("m/b.safetensors", shard({"q"}));
  index(R"({"p":"a.safetensors","q":"b.safetensors"})");
  expect_open_error({"tensor 'q'", "index puts it in 'b.safetensors'"});
  index(R"({"p":"a.safetensors","q":"a.safetensors","z":"b.safetensors"})");
  expect_open_error({"tensor 'q'", "two shards"});
}

TEST_F(CheckpointTest, BadIndex) {
  write("m/a.safetensors", shard({"p"}));
  write("m/model.safetensors.index.json", "[]");
  expect_open_error({"model.safetensors.index.json", "expected an object"});
  write("m/model.safetensors.index.json", R"({"metadata":{}})");
  expect_open_error({"no \"weight_map\""});
  write("m/model.safetensors.index.json", R"({"weight_map":{"p":3}})");
  expect_open_error({"tensor 'p'", "shard file name"});
  write("m/model.safetensors.index.json", R"({"weight_map":{"p":"a.safetensors","p":"a.safetensors"}})");
  expect_open_error({"duplicate key 'p'"});
  write("m/model.safetensors.index.json", R"({"weight_map":{"p":"a.safetensors"},"metadata":3})");
  expect_open_error({"\"metadata\"", "expected an object"});
  write("m/model.safetensors.index.json", R"({"weight_map":{"p":"a.safetensors")");
  expect_open_error({"model.safetensors.index.json", "not valid JSON"});
  write("m/model.safetensors.index.json", R"({"weight_map":{}})");
  expect_open_error({"names no tensors"});
}

TEST_F(CheckpointTest, BadShardNamesItsFile) {
  write("m/a.safetensors", st_bytes("{\"p\":1}"));
  index(R"({"p":"a.safetensors"})");
  expect_open_error({"a.safetensors", "tensor 'p'", "expected an object"});
}

}  // namespace
