// tokenizer.json (Hugging Face tokenizers) -> the tokenizer.* keys of a GGUF file.
//
// Supported, exactly: model BPE over GPT-2's byte-level alphabet (no byte_fallback,
// no dropout, no subword prefix/suffix), merges in either encoding, ignore_merges;
// pre_tokenizer ByteLevel (its GPT-2 regex) or Sequence[Split(regex, Isolated),
// ByteLevel(use_regex false)] where the regex is one tessera has a hand-written
// pre-tokenizer for (gpt2, llama3, qwen2, qwen35); normalizer none or NFC;
// post_processor none, ByteLevel (offsets only) or a TemplateProcessing that puts one
// token before the text (read as add_bos); decoder none or ByteLevel. Everything else
// is refused with the name of what is not supported.
//
// Special tokens: added_tokens with special=true become control tokens (type 3),
// the others user-defined (4, matched in the text as Hugging Face does); the rest of
// the vocabulary is normal (1).
//
// bos/eos/pad/unk: tokenizer_config.json's bos_token etc. (a string or {content}),
// else special_tokens_map.json, else config.json's *_token_id (the folder's model
// config; eos may be a list: its first id). bos falls back to the token a
// post_processor template puts before the text. What none of them names is written
// as -1 ("none"), so that the gpt2 default ids do not apply. A folder without
// tokenizer_config.json is accepted: no chat template, add_bos from the template.
// From tokenizer_config.json also: add_bos_token, chat_template (or a
// chat_template.jinja / chat_template.json beside it), added_tokens_decoder (checked
// against tokenizer.json; it can turn a vocabulary entry into an added token);
// add_eos_token and add_prefix_space = true are refused. clean_up_tokenization_spaces
// is ignored: it changes decoded text only, and tessera decodes as llama.cpp does.
#include "hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/model_file.h"

namespace tessera::hf {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Strings from the file, shown on one line and not too long.
std::string show(const std::string& s) { return "'" + printable(s, 160) + "'"; }

class File {
 public:
  explicit File(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

  json parse() const {
    std::ifstream f(path_, std::ios::binary);
    if (!f) fail("cannot be read");
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) fail("cannot be read");
    try {
      return json::parse(ss.str());
    } catch (const json::exception& e) {
      // e.what() is "[json.exception.parse_error.101] parse error at line ..."
      std::string msg = e.what();
      if (const size_t p = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && p != std::string::npos)
        msg.erase(0, p + 2);
      fail("malformed JSON: " + printable(msg, 200));
    }
  }

  // obj[key] if present and not null
  const json* field(const json& obj, const char* key) const {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool get_bool(const json& obj, const char* key, bool dflt, const std::string& where) const {
    const json* v = field(obj, key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(where + key + " is not a boolean");
    return v->get<bool>();
  }
  std::optional<std::string> get_string(const json& obj, const char* key, const std::string& where) const {
    const json* v = field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(where + key + " is not a string");
    return v->get<std::string>();
  }
  // A JSON value naming a "type" (for messages), or its kind.
  static std::string type_of(const json& v) {
    if (v.is_object()) {
      auto it = v.find("type");
      if (it != v.end() && it->is_string()) return it->get<std::string>();
      return "(object without a type)";
    }
    return std::string("(") + v.type_name() + ")";
  }

 private:
  std::string path_;
};

// GPT-2's byte -> code point table (bytes_to_unicode), as UTF-8 strings.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    std::string& s = out[b];
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// The split regexes of Hugging Face tokenizer.json files that tessera's hand-written
// pre-tokenizers (llm/src/tokenizer/pretokenize.h) reproduce, and the
// tokenizer.ggml.pre that selects each. Compared as exact strings: a regex that
// differs by one character is refused, not approximated.
struct KnownRegex {
  const char* regex;
  const char* pre;
};
constexpr KnownRegex kKnownRegexes[] = {
    // GPT-2 (also what ByteLevel with use_regex true applies)
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt-2"},
    // Llama 3
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    // Qwen2 / Qwen2.5 / Qwen3
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
    // Qwen3.5 / 3.6
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen35"},
};
constexpr const char* kGpt2Pre = "gpt-2";

class Reader {
 public:
  explicit Reader(const std::string& folder) : folder_(folder), tj_(folder + "/tokenizer.json") {}

  void read(Metadata& md) {
    const json root = tj_.parse();
    if (!root.is_object()) tj_.fail("is not a JSON object");
    const json* model = tj_.field(root, "model");
    if (!model || !model->is_object()) tj_.fail("has no model object");
    read_model(*model);
    read_added_tokens(root);
    check_dense();
    check_byte_alphabet();
    read_merges(*model);
    nfc_ = read_normalizer(tj_.field(root, "normalizer"));
    check_added_normalized();
    if (const json* pt = tj_.field(root, "pre_tokenizer"))
      pre_ = read_pre_tokenizer(*pt);
    else
      tj_.fail("has no pre_tokenizer: not a byte-level BPE tokenizer tessera supports");
    if (const json* pp = tj_.field(root, "post_processor")) read_post_processor(*pp);
    if (const json* dec = tj_.field(root, "decoder")) check_decoder(*dec);
    // truncation and padding are ignored: transformers resets both on every call
    // unless asked for them, and a runtime tokenizes without them.
    read_config();
    emit(md);
  }

 private:
  // ---- model ----

  void read_model(const json& model) {
    std::string type;
    if (auto t = tj_.get_string(model, "type", "model.")) {
      type = *t;
    } else if (model.contains("merges")) {
      type = "BPE";  // files written before "type" was serialized
    } else {
      tj_.fail("model has no type");
    }
    if (type != "BPE")
      tj_.fail("model type " + show(type) + " is not supported (tessera reads byte-level BPE tokenizers only)");
    if (tj_.get_bool(model, "byte_fallback", false, "model."))
      tj_.fail("model.byte_fallback = true (SentencePiece-style byte fallback) is not supported");
    if (const json* d = tj_.field(model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
      tj_.fail("model.dropout (BPE dropout) is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (auto s = tj_.get_string(model, k, "model."); s && !s->empty())
        tj_.fail(std::string("model.") + k + " = " + show(*s) + " is not supported");
    ignore_merges_ = tj_.get_bool(model, "ignore_merges", false, "model.");
    model_unk_ = tj_.get_string(model, "unk_token", "model.");

    const json* vocab = tj_.field(model, "vocab");
    if (!vocab || !vocab->is_object()) tj_.fail("model.vocab is not an object of token -> id");
    tokens_.resize(vocab->size());
    have_.resize(vocab->size(), false);
    types_.resize(vocab->size(), kNormal);
    vocab_ids_.reserve(vocab->size());
    for (const auto& [text, idv] : vocab->items()) {
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0)
        tj_.fail("model.vocab: the id of " + show(text) + " is not a non-negative integer");
      const int64_t id = idv.get<int64_t>();
      place(id, text, "model.vocab");
      vocab_ids_.emplace(text, static_cast<int32_t>(id));
    }
  }

  // Puts `text` at `id`; ids beyond every token that could fill them leave a hole.
  void place(int64_t id, const std::string& text, const char* where) {
    if (id >= kMaxTokens) tj_.fail(std::string(where) + ": id " + std::to_string(id) + " of " + show(text) + " is too large");
    if (static_cast<size_t>(id) >= tokens_.size()) {
      tokens_.resize(static_cast<size_t>(id) + 1);
      have_.resize(static_cast<size_t>(id) + 1, false);
      types_.resize(static_cast<size_t>(id) + 1, kNormal);
    }
    if (have_[id]) {
      if (tokens_[id] == text) return;
      tj_.fail(std::string(where) + ": id " + std::to_string(id) + " is given to both " + show(tokens_[id]) +
               " and " + show(text));
    }
    tokens_[id] = text;
    have_[id] = true;
  }

  void read_added_tokens(const json& root) {
    const json* added = tj_.field(root, "added_tokens");
    if (!added) return;
    if (!added->is_array()) tj_.fail("added_tokens is not an array");
    for (const json& t : *added) {
      if (!t.is_object()) tj_.fail("added_tokens holds something that is not an object");
      const json* idv = tj_.field(t, "id");
      auto content = tj_.get_string(t, "content", "added_tokens[].");
      if (!idv || !idv->is_number_integer() || idv->get<int64_t>() < 0 || !content)
        tj_.fail("added_tokens: an entry without a non-negative integer id and a content string");
      const int64_t id = idv->get<int64_t>();
      const bool special = tj_.get_bool(t, "special", false, "added_tokens[].");
      // tessera matches added tokens as whole strings, without these variations
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (tj_.get_bool(t, k, false, "added_tokens[]."))
          tj_.fail("added token " + show(*content) + " sets " + k + ", which is not supported");
      // the core looks pieces up in the whole token list: an added token that is
      // also a vocabulary entry under another id would be ambiguous
      if (auto it = vocab_ids_.find(*content); it != vocab_ids_.end() && it->second != id)
        tj_.fail("added token " + show(*content) + " has id " + std::to_string(id) + " but model.vocab gives it " +
                 std::to_string(it->second));
      place(id, *content, "added_tokens");
      types_[id] = special ? kControl : kUserDefined;
      // Hugging Face's default: non-special added tokens are matched in normalized text
      if (tj_.get_bool(t, "normalized", !special, "added_tokens[].")) normalized_added_.push_back(*content);
    }
  }

  void check_dense() {
    if (tokens_.empty()) tj_.fail("model.vocab is empty");
    for (size_t i = 0; i < have_.size(); ++i)
      if (!have_[i])
        tj_.fail("token ids are not dense: no token has id " + std::to_string(i) + " (ids go up to " +
                 std::to_string(have_.size() - 1) + ")");
  }

  void check_byte_alphabet() {
    const auto alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b)
      if (!vocab_ids_.count(alphabet[b])) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        tj_.fail("model.vocab has no token for byte " + std::string(hex) + " (" + show(alphabet[b]) +
                 "): not a byte-level BPE vocabulary");
      }
  }

  void read_merges(const json& model) {
    const json* merges = tj_.field(model, "merges");
    if (!merges || !merges->is_array()) tj_.fail("model.merges is not an array");
    struct Merge {
      std::string text;  // "a b"
      uint64_t key;      // (id a, id b)
    };
    std::vector<Merge> list;
    list.reserve(merges->size());
    std::string a, b;
    for (size_t i = 0; i < merges->size(); ++i) {
      const json& m = (*merges)[i];
      if (m.is_string()) {
        // "a b": exactly one space, as Hugging Face reads it
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          tj_.fail("model.merges[" + std::to_string(i) + "] = " + show(s) + " is not two tokens separated by one space");
        a.assign(s, 0, sp);
        b.assign(s, sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
        // tokenizer.ggml.merges holds "a b" split at the first space after a's first byte
        if (a.empty() || a.find(' ', 1) != std::string::npos)
          tj_.fail("model.merges[" + std::to_string(i) + "]: token " + show(a) +
                   " contains a space, which tokenizer.ggml.merges cannot express");
      } else {
        tj_.fail("model.merges[" + std::to_string(i) + "] is neither \"a b\" nor [a, b]");
      }
      const auto ia = vocab_ids_.find(a), ib = vocab_ids_.find(b);
      for (const auto& [it, t] : {std::pair{ia, &a}, std::pair{ib, &b}})
        if (it == vocab_ids_.end())
          tj_.fail("model.merges[" + std::to_string(i) + "]: " + show(*t) + " is not in model.vocab");
      const size_t a_len = a.size();
      a += b;  // Hugging Face refuses a merge whose result is not a token
      if (!vocab_ids_.count(a))
        tj_.fail("model.merges[" + std::to_string(i) + "]: the merged token " + show(a) + " is not in model.vocab");
      a.insert(a_len, 1, ' ');
      list.push_back({a, (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                             static_cast<uint32_t>(ib->second)});
    }
    // Hugging Face keeps the last rank of a pair listed twice (a map built in order);
    // dropping the earlier copies keeps the relative order of the rest.
    std::vector<std::pair<uint64_t, uint32_t>> order(list.size());
    for (size_t i = 0; i < list.size(); ++i) order[i] = {list[i].key, static_cast<uint32_t>(i)};
    std::sort(order.begin(), order.end());
    std::vector<bool> drop(list.size(), false);
    for (size_t i = 0; i + 1 < order.size(); ++i)
      if (order[i].first == order[i + 1].first) drop[order[i].second] = true;
    merges_.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i)
      if (!drop[i]) merges_.push_back(std::move(list[i].text));
  }

  // ---- normalizer, pre-tokenizer, post-processor, decoder ----

  bool read_normalizer(const json* n) {
    if (!n) return false;
    const std::string type = File::type_of(*n);
    if (type == "NFC") return true;
    if (type == "Sequence") {
      const json* list = tj_.field(*n, "normalizers");
      if (!list || !list->is_array()) tj_.fail("normalizer Sequence without a normalizers list");
      if (list->empty()) return false;
      if (list->size() == 1) return read_normalizer(&(*list)[0]);
    }
    tj_.fail("normalizer " + show(describe(*n)) + " is not supported (supported: none, NFC)");
  }

  // With NFC, Hugging Face matches normalized added tokens in the normalized text;
  // tessera matches added tokens before normalizing, which can differ.
  void check_added_normalized() {
    if (nfc_ && !normalized_added_.empty())
      tj_.fail("added token " + show(normalized_added_.front()) +
               " is matched after the NFC normalizer (normalized = true), which is not supported");
  }

  std::string describe(const json& v) const {
    std::string s = File::type_of(v);
    for (const char* list : {"pretokenizers", "normalizers", "processors", "decoders"}) {
      const json* l = tj_.field(v, list);
      if (!l || !l->is_array()) continue;
      s += "[";
      for (size_t i = 0; i < l->size(); ++i) s += (i ? ", " : "") + describe((*l)[i]);
      s += "]";
    }
    return s;
  }

  // ByteLevel: add_prefix_space (Hugging Face's default: true) would put a space
  // before the text; use_regex (default true) applies the GPT-2 split first.
  bool byte_level_regex(const json& bl) const {
    if (tj_.get_bool(bl, "add_prefix_space", true, "pre_tokenizer ByteLevel."))
      tj_.fail("pre_tokenizer ByteLevel with add_prefix_space = true is not supported");
    return tj_.get_bool(bl, "use_regex", true, "pre_tokenizer ByteLevel.");
  }

  std::string read_pre_tokenizer(const json& pt) {
    const std::string type = File::type_of(pt);
    if (type == "ByteLevel") {
      if (byte_level_regex(pt)) return kGpt2Pre;
      tj_.fail("pre_tokenizer ByteLevel with use_regex = false and no Split: no splitting tessera supports");
    }
    if (type == "Sequence") {
      const json* list = tj_.field(pt, "pretokenizers");
      if (!list || !list->is_array()) tj_.fail("pre_tokenizer Sequence without a pretokenizers list");
      if (list->size() == 1) return read_pre_tokenizer((*list)[0]);
      if (list->size() == 2 && File::type_of((*list)[0]) == "Split" && File::type_of((*list)[1]) == "ByteLevel") {
        if (byte_level_regex((*list)[1]))
          tj_.fail("pre_tokenizer Sequence[Split, ByteLevel] with use_regex = true (two splits) is not supported");
        return read_split((*list)[0]);
      }
    }
    tj_.fail("pre_tokenizer " + show(describe(pt)) +
             " is not supported (supported: ByteLevel, or Sequence[Split, ByteLevel] with a known regex)");
  }

  std::string read_split(const json& split) {
    const json* pattern = tj_.field(split, "pattern");
    const json* regex = pattern ? tj_.field(*pattern, "Regex") : nullptr;
    if (!regex || !regex->is_string())
      tj_.fail("pre_tokenizer Split without a Regex pattern (a String pattern is not supported)");
    const auto behavior = tj_.get_string(split, "behavior", "pre_tokenizer Split.");
    if (behavior != "Isolated")
      tj_.fail("pre_tokenizer Split behavior " + show(behavior.value_or("(none)")) + " is not supported (supported: Isolated)");
    if (tj_.get_bool(split, "invert", false, "pre_tokenizer Split."))
      tj_.fail("pre_tokenizer Split with invert = true is not supported");
    const std::string re = regex->get<std::string>();
    for (const KnownRegex& k : kKnownRegexes)
      if (re == k.regex) return k.pre;
    tj_.fail("pre_tokenizer Split regex " + show(re) +
             " is not one tessera has a pre-tokenizer for (gpt2, llama3, qwen2, qwen35)");
  }

  void read_post_processor(const json& pp) {
    const std::string type = File::type_of(pp);
    if (type == "ByteLevel") return;  // trims offsets only
    if (type == "Sequence") {
      const json* list = tj_.field(pp, "processors");
      if (!list || !list->is_array()) tj_.fail("post_processor Sequence without a processors list");
      for (const json& p : *list) read_post_processor(p);
      return;
    }
    if (type == "TemplateProcessing") {
      read_template(pp);
      return;
    }
    tj_.fail("post_processor " + show(describe(pp)) + " is not supported (it adds tokens tessera would not add)");
  }

  // single: [SpecialToken...] Sequence A [SpecialToken...]; one token before the
  // text is a BOS; tokens after it (an EOS) are not something tessera adds.
  void read_template(const json& pp) {
    const json* single = tj_.field(pp, "single");
    if (!single || !single->is_array()) tj_.fail("post_processor TemplateProcessing without a single template list");
    const json* specials = tj_.field(pp, "special_tokens");
    std::vector<int32_t> before;
    bool seen_text = false;
    for (const json& piece : *single) {
      if (const json* seq = tj_.field(piece, "Sequence")) {
        if (seen_text || tj_.get_string(*seq, "id", "post_processor Sequence.") != "A")
          tj_.fail("post_processor TemplateProcessing: unexpected single template");
        seen_text = true;
        continue;
      }
      const json* st = tj_.field(piece, "SpecialToken");
      const auto name = st ? tj_.get_string(*st, "id", "post_processor SpecialToken.") : std::nullopt;
      if (!name) tj_.fail("post_processor TemplateProcessing: unexpected single template");
      if (seen_text)
        tj_.fail("post_processor TemplateProcessing adds " + show(*name) + " after the text, which is not supported");
      const json* entry = specials ? tj_.field(*specials, name->c_str()) : nullptr;
      const json* ids = entry ? tj_.field(*entry, "ids") : nullptr;
      if (!ids || !ids->is_array()) tj_.fail("post_processor TemplateProcessing: no ids for " + show(*name));
      for (const json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(tokens_.size()))
          tj_.fail("post_processor TemplateProcessing: " + show(*name) + " has an id that is not a token");
        before.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    if (!seen_text) tj_.fail("post_processor TemplateProcessing: the single template has no $A");
    if (before.size() > 1)
      tj_.fail("post_processor TemplateProcessing adds " + std::to_string(before.size()) +
               " tokens before the text (only one BOS is supported)");
    if (before.size() == 1) {
      if (template_bos_ && *template_bos_ != before[0])
        tj_.fail("post_processor: two templates add different tokens before the text");
      template_bos_ = before[0];
    }
  }

  // Decoding is byte-level (token_to_piece): any other decoder would give other text.
  void check_decoder(const json& dec) {
    const std::string type = File::type_of(dec);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json* list = tj_.field(dec, "decoders");
      if (list && list->is_array()) {
        for (const json& d : *list) check_decoder(d);
        return;
      }
    }
    tj_.fail("decoder " + show(describe(dec)) + " is not supported (supported: none, ByteLevel)");
  }

  // ---- tokenizer_config.json and friends ----

  // the vocabulary, then the added tokens (a few lookups: a scan is fine)
  std::optional<int32_t> token_id(const std::string& text) const {
    if (auto it = vocab_ids_.find(text); it != vocab_ids_.end()) return it->second;
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (types_[i] != kNormal && tokens_[i] == text) return static_cast<int32_t>(i);
    return std::nullopt;
  }

  // A special token entry: "text", {"content": "text", ...} or null.
  std::optional<std::string> token_text(const File& f, const json& cfg, const char* key) const {
    const json* v = f.field(cfg, key);
    if (!v) return std::nullopt;
    if (v->is_string()) return v->get<std::string>();
    if (v->is_object()) {
      if (auto c = f.get_string(*v, "content", std::string(key) + ".")) return c;
    }
    f.fail(std::string(key) + " is neither a string nor an object with a content string");
  }

  void special_from(const File& f, const json& cfg, const char* key, std::optional<int32_t>& id) const {
    if (id) return;
    const auto text = token_text(f, cfg, key);
    if (!text) return;
    const auto found = token_id(*text);
    if (!found) f.fail(std::string(key) + " " + show(*text) + " is not a token of tokenizer.json");
    id = found;
  }

  static bool exists(const std::string& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
  }

  void read_config() {
    const File cfg_file(folder_ + "/tokenizer_config.json");
    std::optional<bool> add_bos;
    if (exists(cfg_file.path())) {
      const json cfg = cfg_file.parse();
      if (!cfg.is_object()) cfg_file.fail("is not a JSON object");
      if (const json* dec = cfg_file.field(cfg, "added_tokens_decoder")) read_added_tokens_decoder(cfg_file, *dec);
      // GPT2TokenizerFast lets the config put a space before the text
      if (cfg_file.get_bool(cfg, "add_prefix_space", false, ""))
        cfg_file.fail("add_prefix_space = true is not supported");
      special_from(cfg_file, cfg, "bos_token", bos_);
      special_from(cfg_file, cfg, "eos_token", eos_);
      special_from(cfg_file, cfg, "pad_token", pad_);
      special_from(cfg_file, cfg, "unk_token", unk_);
      if (cfg_file.field(cfg, "add_bos_token")) add_bos = cfg_file.get_bool(cfg, "add_bos_token", false, "");
      if (cfg_file.get_bool(cfg, "add_eos_token", false, ""))
        cfg_file.fail("add_eos_token = true is not supported (tessera does not append EOS when tokenizing)");
      if (const json* ct = cfg_file.field(cfg, "chat_template")) read_chat_template(cfg_file, *ct);
    }
    // newer transformers keep the template beside the config
    if (templates_.empty()) {
      const std::string jinja = folder_ + "/chat_template.jinja";
      const File ct_json(folder_ + "/chat_template.json");
      if (exists(jinja)) {
        std::ifstream f(jinja, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        if (!f) File(jinja).fail("cannot be read");
        templates_.emplace_back("", ss.str());
      } else if (exists(ct_json.path())) {
        const json j = ct_json.parse();
        if (const json* ct = ct_json.field(j, "chat_template")) read_chat_template(ct_json, *ct);
      }
    }
    const File map_file(folder_ + "/special_tokens_map.json");
    if (exists(map_file.path()) && (!bos_ || !eos_ || !pad_ || !unk_)) {
      const json m = map_file.parse();
      special_from(map_file, m, "bos_token", bos_);
      special_from(map_file, m, "eos_token", eos_);
      special_from(map_file, m, "pad_token", pad_);
      special_from(map_file, m, "unk_token", unk_);
    }
    const File model_cfg(folder_ + "/config.json");
    if (exists(model_cfg.path()) && (!bos_ || !eos_ || !pad_)) {
      const json m = model_cfg.parse();
      auto id_from = [&](const char* key, std::optional<int32_t>& id) {
        if (id) return;
        const json* v = model_cfg.field(m, key);
        if (v && v->is_array() && !v->empty()) v = &(*v)[0];  // eos_token_id: [128001, 128008, 128009]
        if (v && v->is_number_integer() && v->get<int64_t>() >= 0 && v->get<int64_t>() < static_cast<int64_t>(tokens_.size()))
          id = static_cast<int32_t>(v->get<int64_t>());
      };
      id_from("bos_token_id", bos_);
      id_from("eos_token_id", eos_);
      id_from("pad_token_id", pad_);
    }
    if (!unk_ && model_unk_) {
      const auto found = token_id(*model_unk_);
      if (!found) tj_.fail("model.unk_token " + show(*model_unk_) + " is not a token");
      unk_ = found;
    }

    if (add_bos) {
      add_bos_ = *add_bos;
      if (add_bos_ && !bos_) bos_ = template_bos_;
      if (add_bos_ && !bos_) cfg_file.fail("add_bos_token = true without a bos_token");
    } else if (template_bos_) {
      if (bos_ && *bos_ != *template_bos_)
        tj_.fail("post_processor adds " + show(tokens_[*template_bos_]) + " before the text but the bos token is " +
                 show(tokens_[*bos_]));
      bos_ = template_bos_;
      add_bos_ = true;
    }
  }

  // transformers adds these to the tokenizer.json's added tokens: they must be tokens
  // already (same id, same text); a vocabulary entry listed here becomes an added token.
  void read_added_tokens_decoder(const File& f, const json& dec) {
    if (!dec.is_object()) f.fail("added_tokens_decoder is not an object of id -> token");
    for (const auto& [key, t] : dec.items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
      }
      if (used != key.size() || id < 0) f.fail("added_tokens_decoder: key " + show(key) + " is not a token id");
      const auto content = f.get_string(t, "content", "added_tokens_decoder[" + key + "].");
      if (!content) f.fail("added_tokens_decoder[" + key + "] has no content");
      if (id >= static_cast<long long>(tokens_.size()) || tokens_[id] != *content)
        f.fail("added_tokens_decoder: " + show(*content) + " with id " + key + " is not that token of tokenizer.json");
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (f.get_bool(t, k, false, "added_tokens_decoder[" + key + "]."))
          f.fail("added token " + show(*content) + " sets " + k + ", which is not supported");
      const bool special = f.get_bool(t, "special", false, "added_tokens_decoder[" + key + "].");
      if (types_[id] == kNormal) {
        types_[id] = special ? kControl : kUserDefined;
        if (nfc_ && f.get_bool(t, "normalized", !special, "added_tokens_decoder[" + key + "]."))
          f.fail("added token " + show(*content) +
                 " is matched after the NFC normalizer (normalized = true), which is not supported");
      }
    }
  }

  // A string, or a list of {name, template}: "default" becomes tokenizer.chat_template,
  // the others tokenizer.chat_template.<name> (as llama.cpp's converter writes them).
  void read_chat_template(const File& f, const json& ct) {
    if (ct.is_string()) {
      templates_.emplace_back("", ct.get<std::string>());
      return;
    }
    if (!ct.is_array()) f.fail("chat_template is neither a string nor a list of {name, template}");
    for (const json& t : ct) {
      const auto name = f.get_string(t, "name", "chat_template[].");
      const auto text = f.get_string(t, "template", "chat_template[].");
      if (!name || !text) f.fail("chat_template list entry without a name and a template");
      templates_.emplace_back(*name == "default" ? "" : *name, *text);
    }
  }

  // ---- output ----

  static MetaValue str(std::string s) {
    MetaValue v;
    v.type = MetaType::String;
    v.value = std::move(s);
    return v;
  }
  static MetaValue boolean(bool b) {
    MetaValue v;
    v.type = MetaType::Bool;
    v.value = int64_t{b ? 1 : 0};
    return v;
  }
  static MetaValue id_value(const std::optional<int32_t>& id) {
    MetaValue v;
    v.type = id ? MetaType::U32 : MetaType::I32;
    v.value = int64_t{id ? *id : -1};  // -1: none (tokenizer.h)
    return v;
  }
  static MetaValue str_array(std::vector<std::string>&& items) {
    MetaValue v;
    v.type = MetaType::Array;
    v.elem_type = MetaType::String;
    std::vector<MetaValue> arr;
    arr.reserve(items.size());
    for (std::string& s : items) arr.push_back(str(std::move(s)));
    v.value = std::move(arr);
    return v;
  }

  void emit(Metadata& md) {
    MetaValue types;
    types.type = MetaType::Array;
    types.elem_type = MetaType::I32;
    std::vector<MetaValue> tv;
    tv.reserve(types_.size());
    for (int32_t t : types_) {
      MetaValue e;
      e.type = MetaType::I32;
      e.value = int64_t{t};
      tv.push_back(std::move(e));
    }
    types.value = std::move(tv);

    // built completely before md is touched, so a failure above leaves md as it was
    md.set("tokenizer.ggml.model", str("gpt2"));
    md.set("tokenizer.ggml.pre", str(pre_));
    md.set("tokenizer.ggml.tokens", str_array(std::move(tokens_)));
    md.set("tokenizer.ggml.token_type", std::move(types));
    md.set("tokenizer.ggml.merges", str_array(std::move(merges_)));
    md.set("tokenizer.ggml.ignore_merges", boolean(ignore_merges_));
    if (nfc_) md.set("tokenizer.tessera.normalizer", str("nfc"));
    md.set("tokenizer.ggml.bos_token_id", id_value(bos_));
    md.set("tokenizer.ggml.eos_token_id", id_value(eos_));
    if (pad_) md.set("tokenizer.ggml.padding_token_id", id_value(pad_));
    if (unk_) md.set("tokenizer.ggml.unknown_token_id", id_value(unk_));
    md.set("tokenizer.ggml.add_bos_token", boolean(add_bos_));
    for (auto& [name, text] : templates_)
      md.set(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name, str(std::move(text)));
  }

  static constexpr int64_t kMaxTokens = int64_t{1} << 24;
  static constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4;

  std::string folder_;
  File tj_;
  std::vector<std::string> tokens_;
  std::vector<bool> have_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> vocab_ids_;  // model.vocab only
  std::vector<std::string> merges_;
  std::vector<std::string> normalized_added_;
  std::optional<std::string> model_unk_;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::string pre_;
  std::optional<int32_t> template_bos_;
  std::optional<int32_t> bos_, eos_, pad_, unk_;
  bool add_bos_ = false;
  std::vector<std::pair<std::string, std::string>> templates_;  // name ("" = default), text
};

}  // namespace

bool read_tokenizer(const std::string& folder, Metadata& md) {
  std::error_code ec;
  if (!fs::is_regular_file(folder + "/tokenizer.json", ec)) return false;
  Reader(folder).read(md);
  return true;
}

}  // namespace tessera::hf
