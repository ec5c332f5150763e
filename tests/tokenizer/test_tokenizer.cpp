// Tokenizer tests against the llama.cpp test vectors in fixtures/vocab: for each
// ggml-vocab-<name>.gguf, the .inp file holds strings separated by the line
// "__ggml_vocab_test__" (as llama.cpp's tests/test-tokenizer-0.cpp reads it: the file
// is split on "\n__ggml_vocab_test__\n", so a string's own trailing newlines are
// kept) and the .out file holds the ids of each string, one line each, encoded
// without BOS and without parsing special tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf_reader.h"
#include "tessera/error.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace {

using tessera::Tokenizer;

const std::string kVocabDir = std::string(TESSERA_FIXTURES_DIR) + "/vocab/";

std::string vocab_path(const std::string& name) { return kVocabDir + "ggml-vocab-" + name + ".gguf"; }

bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

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

std::vector<Case> load_cases(const std::string& name) {
  const std::string inp = read_all(vocab_path(name) + ".inp");
  const std::string outp = read_all(vocab_path(name) + ".out");
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
  std::vector<Case> cases;
  EXPECT_EQ(texts.size(), ids.size()) << name << ": .inp and .out disagree on the number of strings";
  for (size_t i = 0; i < texts.size() && i < ids.size(); ++i) cases.push_back({texts[i], ids[i]});
  return cases;
}

// Loaded once per vocabulary for the whole test program.
const Tokenizer* load_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  auto file = tessera::gguf::GgufFile::open(vocab_path(name));
  auto tok = Tokenizer::from_metadata(file->metadata());
  return (cache[name] = std::move(tok)).get();
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

#define SKIP_IF_NO_VOCAB(name)                                                           \
  if (!file_exists(vocab_path(name))) GTEST_SKIP() << "fixture missing: " << vocab_path(name)

class VocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabTest, MatchesLlamaCppTestVectors) {
  const std::string name = GetParam();
  SKIP_IF_NO_VOCAB(name);
  const Tokenizer* tok = load_tokenizer(name);
  const auto cases = load_cases(name);
  ASSERT_FALSE(cases.empty());
  size_t passed = 0;
  for (const Case& c : cases) {
    const auto got = tok->encode(c.text, /*add_bos=*/false);
    if (got == c.ids) {
      ++passed;
    } else {
      ADD_FAILURE() << name << ": text \"" << escape(c.text) << "\"\n  expected: " << join(c.ids)
                    << "\n  got:      " << join(got);
    }
  }
  std::cout << "[ vocab " << name << " ] " << passed << "/" << cases.size() << " strings match\n";
}

TEST_P(VocabTest, EncodeDecodeRoundTrip) {
  const std::string name = GetParam();
  SKIP_IF_NO_VOCAB(name);
  const Tokenizer* tok = load_tokenizer(name);
  for (const Case& c : load_cases(name)) {
    // decode(encode(s)) == s for every fixture string (SPM drops the prefix space)
    EXPECT_EQ(tok->decode(tok->encode(c.text, false)), c.text) << name << ": \"" << escape(c.text) << "\"";
    EXPECT_EQ(tok->decode(tok->encode(c.text, true)), c.text) << name << " with BOS: \"" << escape(c.text) << "\"";
  }
}

TEST_P(VocabTest, InvalidUtf8DoesNotCrash) {
  const std::string name = GetParam();
  SKIP_IF_NO_VOCAB(name);
  const Tokenizer* tok = load_tokenizer(name);
  const std::vector<std::string> bad = {
      "\xff", "\xc3", "abc\x80xyz", "\xe2\x82", "\xf0\x9f\x98", "\xed\xa0\x80", "\xf7\xbf\xbf\xbf",
      std::string("a\0b", 3), "\xc0\xaf hello \xfe\xfe world \xe2\x96", " \xe2\x96\x81\xe2\x96",
  };
  for (const std::string& s : bad) {
    std::vector<int32_t> ids;
    ASSERT_NO_THROW(ids = tok->encode(s, true)) << escape(s);
    ASSERT_NO_THROW(ids = tok->encode_with_special(s, false)) << escape(s);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok->n_vocab());
    }
    (void)tok->decode(ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VocabTest,
                         ::testing::Values("llama-spm", "llama-bpe", "qwen2", "qwen35", "gpt-2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(Tokenizer, SpmBosAndDefaults) {
  SKIP_IF_NO_VOCAB("llama-spm");
  const Tokenizer* tok = load_tokenizer("llama-spm");
  EXPECT_EQ(tok->model_name(), "llama");
  EXPECT_EQ(tok->n_vocab(), 32000);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_FALSE(tok->is_end_of_generation(1));
  const auto no_bos = tok->encode("Hello world", false);
  const auto with_bos = tok->encode("Hello world", true);
  ASSERT_EQ(with_bos.size(), no_bos.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), no_bos);
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok->encode("", false).empty());
  // byte fallback: a character outside the vocabulary becomes <0xNN> pieces
  EXPECT_EQ(tok->token_to_piece(3 + 0x41), "A");
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(1, /*show_special=*/true), "<s>");
}

TEST(Tokenizer, SpmSpecialTokens) {
  SKIP_IF_NO_VOCAB("llama-spm");
  const Tokenizer* tok = load_tokenizer("llama-spm");
  // encode() leaves "<s>" as text; encode_with_special() turns it into the token, and the
  // text after a special token gets the space prefix again (llama.cpp behaviour)
  const auto plain = tok->encode("<s>Hello", false);
  EXPECT_NE(plain.front(), 1);
  const auto special = tok->encode_with_special("<s>Hello", false);
  std::vector<int32_t> expect{1};
  for (int32_t id : tok->encode("Hello", false)) expect.push_back(id);
  EXPECT_EQ(special, expect);
}

TEST(Tokenizer, Llama3BosAndSpecialTokens) {
  SKIP_IF_NO_VOCAB("llama-bpe");
  const Tokenizer* tok = load_tokenizer("llama-bpe");
  EXPECT_EQ(tok->model_name(), "gpt2");
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_EQ(tok->eos(), 128001);
  EXPECT_TRUE(tok->add_bos_default());  // llama-bpe default when the key is absent
  EXPECT_TRUE(tok->is_end_of_generation(128001));
  EXPECT_TRUE(tok->is_end_of_generation(128009));  // <|eot_id|>
  EXPECT_FALSE(tok->is_end_of_generation(128000));
  const auto ids = tok->encode_with_special("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", true);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], 128006);
  EXPECT_EQ(ids.back(), 128009);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 128007), ids.end());
  // without special parsing the same text is ordinary text
  const auto plain = tok->encode("<|eot_id|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok->decode(plain), "<|eot_id|>");
  EXPECT_EQ(tok->token_to_piece(128009), "");
  EXPECT_EQ(tok->token_to_piece(128009, true), "<|eot_id|>");
}

TEST(Tokenizer, QwenSpecialTokensAndDefaults) {
  for (const char* name : {"qwen2", "qwen35"}) {
    if (!file_exists(vocab_path(name))) continue;
    const Tokenizer* tok = load_tokenizer(name);
    EXPECT_FALSE(tok->add_bos_default()) << name;
    EXPECT_TRUE(tok->is_end_of_generation(151643)) << name;  // <|endoftext|> (eos)
    EXPECT_TRUE(tok->is_end_of_generation(151645)) << name;  // <|im_end|>
    EXPECT_FALSE(tok->is_end_of_generation(151644)) << name;
    const auto ids = tok->encode_with_special("<|im_start|>user\nhello<|im_end|>\n", false);
    ASSERT_GE(ids.size(), 4u);
    EXPECT_EQ(ids.front(), 151644);
    EXPECT_NE(std::find(ids.begin(), ids.end(), 151645), ids.end());
    // user-defined tokens are matched even without special parsing (as llama.cpp does)
    const auto pad = tok->encode("a[PAD151646]b", false);
    EXPECT_NE(std::find(pad.begin(), pad.end(), 151646), pad.end()) << name;
  }
}

TEST(Tokenizer, Gpt2Defaults) {
  SKIP_IF_NO_VOCAB("gpt-2");
  const Tokenizer* tok = load_tokenizer("gpt-2");
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->bos(), 50256);
  EXPECT_TRUE(tok->is_end_of_generation(50256));
  EXPECT_EQ(tok->encode("Hello", true).front(), 50256);
  EXPECT_EQ(tok->encode_with_special("a<|endoftext|>b", false).size(), 3u);
}

TEST(Tokenizer, MissingMetadataThrows) {
  tessera::Metadata md;
  EXPECT_THROW(Tokenizer::from_metadata(md), tessera::Error);
  tessera::MetaValue model;
  model.type = tessera::MetaType::String;
  model.value = std::string("unigram-nope");
  md.set("tokenizer.ggml.model", model);
  EXPECT_THROW(Tokenizer::from_metadata(md), tessera::Error);
}

// A SentencePiece-style vocabulary from token texts and types (1 normal, 3 control).
std::unique_ptr<Tokenizer> small_vocabulary(const std::vector<std::pair<std::string, int>>& tokens) {
  tessera::Metadata md;
  auto str = [](std::string s) {
    tessera::MetaValue v;
    v.type = tessera::MetaType::String;
    v.value = std::move(s);
    return v;
  };
  tessera::MetaValue texts, types;
  texts.type = types.type = tessera::MetaType::Array;
  texts.elem_type = tessera::MetaType::String;
  types.elem_type = tessera::MetaType::I32;
  std::vector<tessera::MetaValue> t, k;
  for (const auto& [text, type] : tokens) {
    t.push_back(str(text));
    tessera::MetaValue v;
    v.type = tessera::MetaType::I32;
    v.value = int64_t(type);
    k.push_back(v);
  }
  texts.value = std::move(t);
  types.value = std::move(k);
  md.set("tokenizer.ggml.model", str("llama"));
  md.set("tokenizer.ggml.tokens", texts);
  md.set("tokenizer.ggml.token_type", types);
  return Tokenizer::from_metadata(md);
}

// gpt-oss's harmony vocabulary: <|return|> and <|call|> end an answer; <|end|> ends one
// of its messages, not the answer. Elsewhere (Phi-3) <|end|> still ends it.
TEST(Tokenizer, HarmonyEndOfGeneration) {
  auto harmony = small_vocabulary({{"<unk>", 2}, {"<s>", 3}, {"</s>", 3}, {"<|start|>", 3}, {"<|end|>", 3},
                                   {"<|message|>", 3}, {"<|channel|>", 3}, {"<|return|>", 3}, {"<|call|>", 3}, {"a", 1}});
  EXPECT_TRUE(harmony->is_end_of_generation(7));   // <|return|>
  EXPECT_TRUE(harmony->is_end_of_generation(8));   // <|call|>
  EXPECT_FALSE(harmony->is_end_of_generation(4));  // <|end|>
  EXPECT_FALSE(harmony->is_end_of_generation(6));  // <|channel|>
  EXPECT_EQ(harmony->token_to_piece(6, false), "");
  EXPECT_EQ(harmony->token_to_piece(6, true), "<|channel|>");
  auto phi = small_vocabulary({{"<unk>", 2}, {"<s>", 3}, {"</s>", 3}, {"<|end|>", 3}, {"a", 1}});
  EXPECT_TRUE(phi->is_end_of_generation(3));
}

TEST(Tokenizer, LoadAndEncodeSpeed) {
  // the largest vocabularies: qwen2 (152k tokens, 151k merges), llama-bpe (128k, 280k)
  for (const char* name : {"qwen2", "llama-bpe"}) {
    if (!file_exists(vocab_path(name))) GTEST_SKIP() << "fixture missing: " << vocab_path(name);
    auto file = tessera::gguf::GgufFile::open(vocab_path(name));
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = Tokenizer::from_metadata(file->metadata());
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string text;
    for (const Case& c : load_cases(name)) text += c.text + "\n";
    while (text.size() < (1u << 20)) text += text;
    const auto t1 = std::chrono::steady_clock::now();
    const auto ids = tok->encode(text, false);
    const double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::cout << "[ speed ] " << name << ": load " << load_s * 1e3 << " ms; encode " << text.size() / 1e6
              << " MB -> " << ids.size() << " tokens in " << enc_s * 1e3 << " ms\n";
    EXPECT_LT(load_s, 1.0) << name;  // generous: the machine may be busy
    EXPECT_EQ(tok->decode(ids), text) << name;
  }
}

}  // namespace
