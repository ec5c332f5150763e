// The Hugging Face tokenizer.json reader (loaders/safetensors/hf_tokenizer.h):
//  - every folder of fixtures/hf/tokenizers: each string of tests.inp (split on
//    "\n__ggml_vocab_test__\n", as tests/tokenizer reads the vocab fixtures) encodes,
//    without BOS and without parsing special tokens, to its line of tests.out, and to
//    what the GGUF vocabulary it was built from (vocab/ggml-vocab-<name>.gguf) gives;
//  - special tokens, bos/eos, add_bos and the chat template from tokenizer_config.json;
//  - the NFC normalizer (qwen2 has one, llama-bpe not);
//  - small synthetic tokenizer.json files: what is supported, and one-line refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf_reader.h"
#include "hf_tokenizer.h"
#include "tessera/error.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tessera::Metadata;
using tessera::Tokenizer;

const std::string kFixtures = TESSERA_FIXTURES_DIR;
const std::string kHfDir = kFixtures + "/hf/tokenizers";

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> load_cases(const std::string& dir) {
  const std::string inp = read_all(dir + "/tests.inp");
  const std::string outp = read_all(dir + "/tests.out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size())
    texts.push_back(inp.substr(pos, next - pos));
  if (pos < inp.size()) texts.push_back(inp.substr(pos));
  std::vector<std::vector<int32_t>> ids;
  std::istringstream lines(outp);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> v;
    for (int32_t id; ls >> id;) v.push_back(id);
    ids.push_back(std::move(v));
  }
  EXPECT_EQ(texts.size(), ids.size()) << dir << ": tests.inp and tests.out disagree on the number of strings";
  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size() && i < ids.size(); ++i) cases.push_back({texts[i], ids[i]});
  return cases;
}

std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\x%02x", c); out += b; }
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(' ');
    s.append(std::to_string(v[i]));
  }
  return s;
}

std::vector<std::string> fixture_folders() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kHfDir, ec))
    if (e.is_directory() && fs::exists(e.path() / "tokenizer.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct Loaded {
  Metadata md;
  std::unique_ptr<Tokenizer> tok;
};

// Read once per folder for the whole program (the files are several MB).
const Loaded& load_hf(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<Loaded>();
    EXPECT_TRUE(tessera::hf::read_tokenizer(kHfDir + "/" + name, slot->md));
    slot->tok = Tokenizer::from_metadata(slot->md);
  }
  return *slot;
}

const Tokenizer* load_gguf(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto file = tessera::gguf::GgufFile::open(kFixtures + "/vocab/ggml-vocab-" + name + ".gguf");
    slot = Tokenizer::from_metadata(file->metadata());
  }
  return slot.get();
}

bool have_hf(const std::string& name) { return fs::exists(kHfDir + "/" + name + "/tokenizer.json"); }
bool have_gguf(const std::string& name) { return fs::exists(kFixtures + "/vocab/ggml-vocab-" + name + ".gguf"); }

#define SKIP_IF_NO_HF(name) \
  if (!have_hf(name)) GTEST_SKIP() << "fixture missing: " << kHfDir << "/" << (name)

// ---- the fixture folders ----

class HfFixture : public ::testing::TestWithParam<std::string> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HfFixture);

TEST_P(HfFixture, MatchesTestVectors) {
  const std::string name = GetParam();
  const Tokenizer* tok = load_hf(name).tok.get();
  const auto cases = load_cases(kHfDir + "/" + name);
  ASSERT_FALSE(cases.empty());
  size_t passed = 0;
  for (const Case& c : cases) {
    const auto got = tok->encode(c.text, /*add_bos=*/false);
    if (got == c.ids)
      ++passed;
    else
      ADD_FAILURE() << name << ": text \"" << escape(c.text) << "\"\n  expected: " << join(c.ids)
                    << "\n  got:      " << join(got);
    EXPECT_EQ(tok->decode(got), c.text) << name << ": round trip of \"" << escape(c.text) << "\"";
  }
  std::cout << "[ hf " << name << " ] " << passed << "/" << cases.size() << " strings match\n";
}

TEST_P(HfFixture, MatchesGgufVocabulary) {
  const std::string name = GetParam();
  if (!have_gguf(name)) GTEST_SKIP() << "no GGUF vocabulary for " << name;
  const Tokenizer* hf = load_hf(name).tok.get();
  const Tokenizer* gg = load_gguf(name);
  EXPECT_EQ(hf->model_name(), gg->model_name());
  ASSERT_EQ(hf->n_vocab(), gg->n_vocab());
  EXPECT_EQ(hf->bos(), gg->bos());
  EXPECT_EQ(hf->eos(), gg->eos());
  for (const Case& c : load_cases(kHfDir + "/" + name))
    EXPECT_EQ(hf->encode(c.text, false), gg->encode(c.text, false)) << name << ": \"" << escape(c.text) << "\"";
  // the same text for every token, special ones shown
  int32_t differ = 0;
  for (int32_t id = 0; id < hf->n_vocab(); ++id)
    if (hf->token_to_piece(id, true) != gg->token_to_piece(id, true) && differ++ < 5)
      ADD_FAILURE() << name << ": token " << id << " reads \"" << escape(hf->token_to_piece(id, true))
                    << "\", GGUF \"" << escape(gg->token_to_piece(id, true)) << "\"";
  EXPECT_EQ(differ, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixture, ::testing::ValuesIn(fixture_folders()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(HfTokenizer, FixtureFoldersFound) {
  if (!fs::exists(kHfDir)) GTEST_SKIP() << "fixtures missing: " << kHfDir;
  const auto names = fixture_folders();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen2"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "llama-bpe"), names.end());
}

TEST(HfTokenizer, Qwen2SpecialTokensAndChatTemplate) {
  SKIP_IF_NO_HF("qwen2");
  const Loaded& l = load_hf("qwen2");
  const Tokenizer* tok = l.tok.get();
  EXPECT_EQ(tok->model_name(), "gpt2");
  EXPECT_EQ(tok->n_vocab(), 151936);
  EXPECT_EQ(tok->bos(), 151643);  // tokenizer_config.json: bos_token <|endoftext|>
  EXPECT_EQ(tok->eos(), 151643);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_end_of_generation(151645));  // <|im_end|>
  EXPECT_EQ(l.md.get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(l.md.get_string("tokenizer.tessera.normalizer"), "nfc");
  EXPECT_EQ(l.md.get_bool("tokenizer.ggml.ignore_merges"), false);
  const json cfg = json::parse(read_all(kHfDir + "/qwen2/tokenizer_config.json"));
  EXPECT_EQ(l.md.get_string("tokenizer.chat_template"), cfg["chat_template"].get<std::string>());
  // added_tokens with special = true are control tokens: parsed only on request
  const auto ids = tok->encode_with_special("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_GT(tok->encode("<|im_end|>", false).size(), 1u);
  EXPECT_EQ(tok->token_to_piece(151645), "");
  EXPECT_EQ(tok->token_to_piece(151645, true), "<|im_end|>");
}

TEST(HfTokenizer, LlamaBpeSpecialTokens) {
  SKIP_IF_NO_HF("llama-bpe");
  const Loaded& l = load_hf("llama-bpe");
  const Tokenizer* tok = l.tok.get();
  EXPECT_EQ(tok->n_vocab(), 128256);
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_EQ(tok->eos(), 128001);
  EXPECT_FALSE(tok->add_bos_default());  // tokenizer_config.json: add_bos_token false
  EXPECT_EQ(l.md.get_string("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_EQ(l.md.get_bool("tokenizer.ggml.ignore_merges"), true);
  EXPECT_EQ(l.md.find("tokenizer.tessera.normalizer"), nullptr);
  EXPECT_EQ(l.md.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(tok->encode("Hi", true).front(), 128000);
  const auto ids = tok->encode_with_special("<|begin_of_text|>Hi<|eot_id|>", false);
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(ids.back(), 128009);
}

TEST(HfTokenizer, NfcNormalizer) {
  SKIP_IF_NO_HF("qwen2");
  SKIP_IF_NO_HF("llama-bpe");
  const std::string composed = "caf\xC3\xA9 \xC3\xA9t\xC3\xA9";            // "café été"
  const std::string decomposed = "cafe\xCC\x81 e\xCC\x81te\xCC\x81";       // e + U+0301
  const Tokenizer* qwen = load_hf("qwen2").tok.get();
  EXPECT_EQ(qwen->encode("e\xCC\x81", false), qwen->encode("\xC3\xA9", false));
  EXPECT_EQ(qwen->encode(decomposed, false), qwen->encode(composed, false));
  // the GGUF path has no normalizer: the HF tokenizer differs from it exactly here
  if (have_gguf("qwen2")) {
    EXPECT_NE(load_gguf("qwen2")->encode(decomposed, false), qwen->encode(decomposed, false));
  }
  const Tokenizer* llama = load_hf("llama-bpe").tok.get();
  EXPECT_NE(llama->encode("e\xCC\x81", false), llama->encode("\xC3\xA9", false));
  EXPECT_EQ(llama->decode(llama->encode(decomposed, false)), decomposed);
  // invalid UTF-8 next to a combining mark does not throw
  EXPECT_NO_THROW(qwen->encode("\xff\xCC\x81 a\xCC\x81\xe2\x82", false));
}

TEST(HfTokenizer, LoadSpeed) {
  for (const std::string& name : fixture_folders()) {
    const auto t0 = std::chrono::steady_clock::now();
    Metadata md;
    ASSERT_TRUE(tessera::hf::read_tokenizer(kHfDir + "/" + name, md));
    const auto t1 = std::chrono::steady_clock::now();
    auto tok = Tokenizer::from_metadata(md);
    const auto t2 = std::chrono::steady_clock::now();
    const double read_s = std::chrono::duration<double>(t1 - t0).count();
    const double build_s = std::chrono::duration<double>(t2 - t1).count();
    std::cout << "[ speed ] " << name << ": tokenizer.json read in " << read_s * 1e3 << " ms, tokenizer built in "
              << build_s * 1e3 << " ms\n";
    EXPECT_LT(read_s + build_s, 10.0) << name;  // generous: the machine may be busy
  }
}

// ---- synthetic tokenizer.json files ----

// GPT-2's bytes_to_unicode, as UTF-8.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      const unsigned cp = printable ? i : 256 + n++;
      if (cp < 0x80) t[i] = std::string(1, static_cast<char>(cp));
      else t[i] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    return t;
  }();
  return table[b];
}

const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A small valid byte-level BPE tokenizer: the 256 byte tokens, "ab", "abc", "Ġa"
// (ids 256..258) with merges "a b", "Ġ a"; "abc" can only be had whole (ignore_merges),
// and <|end|> (259) as a special added token.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[byte_char(' ') + "a"] = 258;
  json added = json::array();
  added.push_back({{"id", 259}, {"content", "<|end|>"}, {"single_word", false}, {"lstrip", false},
                   {"rstrip", false}, {"normalized", false}, {"special", true}});
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", json::array({"a b", byte_char(' ') + " a"})}}},
  };
}

class TempFolder {
 public:
  TempFolder() {
    static int n = 0;
    path_ = fs::temp_directory_path() / ("tessera_hf_tok_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  void write(const std::string& name, const json& j) const { write(name, j.dump()); }

 private:
  fs::path path_;
};

std::unique_ptr<Tokenizer> load_json(const json& tj, Metadata* out = nullptr) {
  TempFolder dir;
  dir.write("tokenizer.json", tj);
  Metadata md;
  EXPECT_TRUE(tessera::hf::read_tokenizer(dir.path(), md));
  auto tok = Tokenizer::from_metadata(md);
  if (out) *out = md;
  return tok;
}

// The error read_tokenizer gives for `tj` (and checks it is one line naming the file).
std::string refusal(const std::string& tj_text, const std::string& config = "") {
  TempFolder dir;
  dir.write("tokenizer.json", tj_text);
  if (!config.empty()) dir.write("tokenizer_config.json", config);
  Metadata md;
  try {
    tessera::hf::read_tokenizer(dir.path(), md);
  } catch (const tessera::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(config.empty() ? "tokenizer.json" : "tokenizer"), std::string::npos) << msg;
    EXPECT_TRUE(md.all().empty()) << "metadata touched by a refused tokenizer";
    if (getenv("TESSERA_TEST_VERBOSE")) std::cout << "  refused: " << msg << "\n";
    return msg;
  }
  ADD_FAILURE() << "accepted: " << tj_text.substr(0, 200);
  return "";
}
std::string refusal(const json& tj) { return refusal(tj.dump()); }

#define EXPECT_CONTAINS(hay, needle) EXPECT_NE((hay).find(needle), std::string::npos) << (hay)

TEST(HfTokenizer, NoTokenizerJson) {
  TempFolder dir;
  Metadata md;
  EXPECT_FALSE(tessera::hf::read_tokenizer(dir.path(), md));
  EXPECT_TRUE(md.all().empty());
}

TEST(HfTokenizer, SmallTokenizerWithoutConfig) {
  Metadata md;
  auto tok = load_json(small_tokenizer(), &md);
  EXPECT_EQ(tok->n_vocab(), 260);
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{256, 'c'}));  // "abc" not reachable by merges
  EXPECT_EQ(tok->encode(" a", false), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok->encode_with_special("a<|end|>", false), (std::vector<int32_t>{'a', 259}));
  // no tokenizer_config.json nor config.json: no bos/eos (not gpt2's default 11), no BOS added
  EXPECT_EQ(tok->bos(), -1);
  EXPECT_EQ(tok->eos(), -1);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->encode("a", true), (std::vector<int32_t>{'a'}));
  EXPECT_EQ(md.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "qwen2");
}

TEST(HfTokenizer, IgnoreMergesKey) {
  json tj = small_tokenizer();
  tj["model"]["ignore_merges"] = true;
  auto tok = load_json(tj);
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{257}));  // taken whole
  // the key overrides the pre type's default (llama3 vocabularies: on)
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  tj["model"]["ignore_merges"] = false;
  Metadata md;
  tok = load_json(tj, &md);
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{256, 'c'}));
}

TEST(HfTokenizer, MergesAsPairs) {
  json tj = small_tokenizer();
  tj["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({byte_char(' '), "a"})});
  auto tok = load_json(tj);
  EXPECT_EQ(tok->encode("ab a", false), (std::vector<int32_t>{256, 258}));
  // a pair listed twice keeps its last rank, as Hugging Face builds its merge map
  EXPECT_EQ(tok->encode(" ab", false), (std::vector<int32_t>{' ', 256}));
  tj["model"]["merges"].push_back(json::array({"a", "b"}));
  tok = load_json(tj);
  EXPECT_EQ(tok->encode(" ab", false), (std::vector<int32_t>{258, 'b'}));
}

TEST(HfTokenizer, ByteLevelWithRegexIsGpt2) {
  json tj = small_tokenizer();
  tj["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  Metadata md;
  auto tok = load_json(tj, &md);
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(tok->encode("ab a", false), (std::vector<int32_t>{256, 258}));
}

TEST(HfTokenizer, TemplateProcessingBosAndConfig) {
  json tj = small_tokenizer();
  tj["added_tokens"].push_back({{"id", 260}, {"content", "<|bos|>"}, {"special", true}, {"normalized", false}});
  tj["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {260}}, {"tokens", {"<|bos|>"}}}}}}};
  {
    auto tok = load_json(tj);  // no config: the template's token is BOS, added by default
    EXPECT_EQ(tok->bos(), 260);
    EXPECT_TRUE(tok->add_bos_default());
    EXPECT_EQ(tok->encode("a", true), (std::vector<int32_t>{260, 'a'}));
  }
  {
    TempFolder dir;
    dir.write("tokenizer.json", tj);
    dir.write("tokenizer_config.json",
              json{{"add_bos_token", false},
                   {"bos_token", {{"content", "<|bos|>"}, {"special", true}}},
                   {"eos_token", "<|end|>"},
                   {"chat_template", json::array({{{"name", "default"}, {"template", "{{ x }}"}},
                                                  {{"name", "tool_use"}, {"template", "{{ y }}"}}})}});
    Metadata md;
    ASSERT_TRUE(tessera::hf::read_tokenizer(dir.path(), md));
    auto tok = Tokenizer::from_metadata(md);
    EXPECT_EQ(tok->bos(), 260);
    EXPECT_EQ(tok->eos(), 259);
    EXPECT_FALSE(tok->add_bos_default());  // the config's add_bos_token wins
    EXPECT_EQ(md.get_string("tokenizer.chat_template"), "{{ x }}");
    EXPECT_EQ(md.get_string("tokenizer.chat_template.tool_use"), "{{ y }}");
  }
  // a template that appends a token after the text is refused
  tj["post_processor"]["single"].push_back({{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}});
  EXPECT_CONTAINS(refusal(tj), "after the text");
}

TEST(HfTokenizer, EosFromModelConfig) {
  TempFolder dir;
  dir.write("tokenizer.json", small_tokenizer());
  dir.write("config.json", json{{"eos_token_id", json::array({259, 1})}});
  Metadata md;
  ASSERT_TRUE(tessera::hf::read_tokenizer(dir.path(), md));
  auto tok = Tokenizer::from_metadata(md);
  EXPECT_EQ(tok->eos(), 259);
  EXPECT_EQ(tok->bos(), -1);
}

TEST(HfTokenizer, AddedTokensDecoderMarksSpecials) {
  TempFolder dir;
  dir.write("tokenizer.json", small_tokenizer());
  dir.write("tokenizer_config.json",
            json{{"added_tokens_decoder", {{"257", {{"content", "abc"}, {"special", false}, {"normalized", false}}},
                                           {"259", {{"content", "<|end|>"}, {"special", true}}}}}});
  Metadata md;
  ASSERT_TRUE(tessera::hf::read_tokenizer(dir.path(), md));
  auto tok = Tokenizer::from_metadata(md);
  EXPECT_EQ(tok->encode("xabcx", false), (std::vector<int32_t>{'x', 257, 'x'}));  // now matched in the text
}

TEST(HfTokenizer, ChatTemplateFile) {
  TempFolder dir;
  dir.write("tokenizer.json", small_tokenizer());
  dir.write("tokenizer_config.json", json{{"eos_token", "<|end|>"}});
  dir.write("chat_template.jinja", std::string("{{ messages }}\n"));
  Metadata md;
  ASSERT_TRUE(tessera::hf::read_tokenizer(dir.path(), md));
  EXPECT_EQ(md.get_string("tokenizer.chat_template"), "{{ messages }}\n");
  EXPECT_EQ(Tokenizer::from_metadata(md)->eos(), 259);
}

TEST(HfTokenizer, SmallTokenizerWithNfc) {
  json tj = small_tokenizer();
  tj["normalizer"] = {{"type", "NFC"}};
  Metadata md;
  auto tok = load_json(tj, &md);
  EXPECT_EQ(md.get_string("tokenizer.tessera.normalizer"), "nfc");
  EXPECT_EQ(tok->encode("e\xCC\x81", false), (std::vector<int32_t>{0xC3, 0xA9}));  // as "\u00e9"
  // outside the BMP, and a composition exclusion that NFC decomposes:
  // U+1D15E -> U+1D157 U+1D165
  EXPECT_EQ(tok->decode(tok->encode("a\xF0\x9D\x85\x9E", false)), "a\xF0\x9D\x85\x97\xF0\x9D\x85\xA5");
  EXPECT_EQ(tok->decode(tok->encode("\xF0\x9F\x98\x80 ok", false)), "\xF0\x9F\x98\x80 ok");
  // Hangul jamo compose into a syllable: U+1100 U+1161 -> U+AC00
  EXPECT_EQ(tok->decode(tok->encode("\xE1\x84\x80\xE1\x85\xA1", false)), "\xEA\xB0\x80");
}

TEST(HfTokenizer, NormalizerKeyIsHonouredAndChecked) {
  // the core refuses a normalizer it does not know, and NFC for SentencePiece vocabularies
  Metadata md;
  auto tok = load_json(small_tokenizer(), &md);
  tessera::MetaValue v;
  v.type = tessera::MetaType::String;
  v.value = std::string("nfkc");
  md.set("tokenizer.tessera.normalizer", v);
  EXPECT_THROW(Tokenizer::from_metadata(md), tessera::Error);
  v.value = std::string("nfc");
  md.set("tokenizer.tessera.normalizer", v);
  EXPECT_NO_THROW(Tokenizer::from_metadata(md));
}

TEST(HfTokenizer, Refusals) {
  json tj;
  // unknown split regex
  tj = small_tokenizer();
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\p{L}+|\p{N}+|\s+)";
  EXPECT_CONTAINS(refusal(tj), "regex");
  // a String pattern, another behaviour, ByteLevel adding a prefix space, no pre-tokenizer
  tj = small_tokenizer();
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
  EXPECT_CONTAINS(refusal(tj), "Split");
  tj = small_tokenizer();
  tj["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  EXPECT_CONTAINS(refusal(tj), "MergedWithPrevious");
  tj = small_tokenizer();
  tj["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_CONTAINS(refusal(tj), "add_prefix_space");
  tj = small_tokenizer();
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  EXPECT_CONTAINS(refusal(tj), "Metaspace");
  tj = small_tokenizer();
  tj["pre_tokenizer"] = nullptr;
  EXPECT_CONTAINS(refusal(tj), "pre_tokenizer");
  // other model types
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    tj = small_tokenizer();
    tj["model"]["type"] = type;
    EXPECT_CONTAINS(refusal(tj), type);
  }
  // SentencePiece-style byte fallback
  tj = small_tokenizer();
  tj["model"]["byte_fallback"] = true;
  EXPECT_CONTAINS(refusal(tj), "byte_fallback");
  // normalizers other than NFC
  for (const char* type : {"NFKC", "NFD", "Lowercase", "Prepend"}) {
    tj = small_tokenizer();
    tj["normalizer"] = {{"type", type}};
    EXPECT_CONTAINS(refusal(tj), type);
  }
  tj = small_tokenizer();
  tj["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Strip"}}})}};
  EXPECT_CONTAINS(refusal(tj), "Strip");
  // holes in the ids
  tj = small_tokenizer();
  tj["added_tokens"][0]["id"] = 265;
  EXPECT_CONTAINS(refusal(tj), "not dense");
  tj = small_tokenizer();
  tj["model"]["vocab"].erase("ab");
  tj["model"]["merges"] = json::array({byte_char(' ') + " a"});
  EXPECT_CONTAINS(refusal(tj), "no token has id 256");
  // one id for two tokens
  tj = small_tokenizer();
  tj["added_tokens"][0]["id"] = 256;
  EXPECT_CONTAINS(refusal(tj), "256");
  // malformed JSON, and JSON that is not a tokenizer
  EXPECT_CONTAINS(refusal(std::string("{\"model\": {\"type\": \"BPE\", ")), "malformed JSON");
  EXPECT_CONTAINS(refusal(std::string("[1, 2]")), "tokenizer.json");
  // merges that name unknown tokens or are not "a b"
  tj = small_tokenizer();
  tj["model"]["merges"].push_back("x yz");
  EXPECT_CONTAINS(refusal(tj), "merges");
  tj = small_tokenizer();
  tj["model"]["merges"].push_back("abc");
  EXPECT_CONTAINS(refusal(tj), "merges");
  // not a byte-level vocabulary
  tj = small_tokenizer();
  tj["model"]["vocab"].erase(byte_char(0));
  tj["model"]["vocab"]["<unk>"] = 0;
  EXPECT_CONTAINS(refusal(tj), "byte");
  // post-processors and decoders that change ids or text
  tj = small_tokenizer();
  tj["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}}};
  EXPECT_CONTAINS(refusal(tj), "RobertaProcessing");
  tj = small_tokenizer();
  tj["decoder"] = {{"type", "Metaspace"}};
  EXPECT_CONTAINS(refusal(tj), "decoder");
  // added tokens with lstrip/rstrip/single_word
  tj = small_tokenizer();
  tj["added_tokens"][0]["rstrip"] = true;
  EXPECT_CONTAINS(refusal(tj), "rstrip");
  // with NFC, a non-special added token matched in normalized text
  tj = small_tokenizer();
  tj["normalizer"] = {{"type", "NFC"}};
  tj["added_tokens"].push_back({{"id", 260}, {"content", "<tool>"}, {"special", false}, {"normalized", true}});
  EXPECT_CONTAINS(refusal(tj), "normalized");
  // a config naming a token that does not exist, and add_eos_token
  EXPECT_CONTAINS(refusal(small_tokenizer().dump(), json{{"bos_token", "<s>"}}.dump()), "bos_token");
  EXPECT_CONTAINS(refusal(small_tokenizer().dump(), json{{"add_eos_token", true}}.dump()), "add_eos_token");
  EXPECT_CONTAINS(refusal(small_tokenizer().dump(), "{oops"), "tokenizer_config.json");
  EXPECT_CONTAINS(refusal(small_tokenizer().dump(), json{{"add_prefix_space", true}}.dump()), "add_prefix_space");
  EXPECT_CONTAINS(refusal(small_tokenizer().dump(),
                          json{{"added_tokens_decoder", {{"300", {{"content", "<x>"}, {"special", true}}}}}}.dump()),
                  "added_tokens_decoder");
}

}  // namespace
