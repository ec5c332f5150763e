// Tokenizers built from GGUF tokenizer metadata, following llama.cpp's semantics
// (src/llama-vocab.cpp) so that ids match its test vectors:
//
//  * "llama" (SentencePiece): spaces escaped to U+2581, a space prepended to each
//    text fragment that starts the input or follows a special token (when
//    add_space_prefix, default true), then bigram merging by highest piece score
//    over UTF-8 characters (ties: leftmost first); characters that end up outside
//    the vocabulary become <0xNN> byte tokens (or <unk> without them).
//  * "gpt2" (byte-level BPE): the text is split by the pre-tokenizer that
//    tokenizer.ggml.pre selects (see pretokenize.h), each piece's UTF-8 bytes are
//    mapped through GPT-2's byte-to-unicode table and merged by merge rank (lowest
//    rank first, ties leftmost). For llama3-style vocabs a piece that is itself a
//    token is taken whole (llama.cpp's ignore_merges; tokenizer.ggml.ignore_merges
//    overrides the pre type's default). Invalid UTF-8 becomes U+FFFD. With
//    tokenizer.tessera.normalizer = "nfc" each text fragment (between special
//    tokens) is put in Unicode NFC before pre-tokenizing, as Hugging Face's NFC
//    normalizer does.
//
// Special tokens: user-defined tokens (type 4) are always matched in the text, as
// llama.cpp and Hugging Face do; control (3) and unknown (2) tokens only in
// encode_with_special(). Matching goes token by token, longest text first.
//
// End of generation: eos, eot (tokenizer.ggml.eot_token_id or a token named
// <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|end_of_text|>,
// <EOT>, <end_of_utterance>, <|return|>, <|call|>), eom (tokenizer.ggml.eom_token_id
// or <|eom_id|>), and every token whose text is in that list (llama.cpp's text
// heuristic). In a harmony vocabulary (gpt-oss: it has <|return|> and <|call|>),
// <|end|> ends one message of an answer, not the answer, so it is not one (as in
// llama.cpp).
//
// decode(): concatenates token_to_piece() (control tokens give ""); for SPM vocabs
// with the space prefix, the leading space of the first text token is dropped so
// that decode(encode(s)) == s. No clean-up of spaces before punctuation is done.
#include "tessera/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <queue>
#include <string>
#include <unordered_set>

#include "tessera/error.h"
#include "tessera/model_file.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

#include <unicode/unorm2.h>
#include <unicode/utf16.h>

namespace tessera {

namespace {

using tok::PreType;

enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// ---- metadata access (straight from the variant, so any integer width works) ----

const MetaValue* meta_find(const Metadata& md, std::string_view key) {
  const auto& all = md.all();
  auto it = all.find(key);
  return it == all.end() ? nullptr : &it->second;
}

std::optional<int64_t> meta_int(const MetaValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> meta_num(const MetaValue& v) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (auto i = meta_int(v)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string> opt_string(const Metadata& md, std::string_view key) {
  const MetaValue* v = meta_find(md, key);
  if (!v) return std::nullopt;
  const auto* s = std::get_if<std::string>(&v->value);
  if (!s) throw Error("tokenizer metadata: " + std::string(key) + " is not a string");
  return *s;
}

std::optional<int64_t> opt_int(const Metadata& md, std::string_view key) {
  const MetaValue* v = meta_find(md, key);
  if (!v) return std::nullopt;
  auto i = meta_int(*v);
  if (!i) throw Error("tokenizer metadata: " + std::string(key) + " is not an integer");
  return i;
}

std::optional<bool> opt_bool(const Metadata& md, std::string_view key) {
  auto i = opt_int(md, key);
  if (!i) return std::nullopt;
  return *i != 0;
}

const std::vector<MetaValue>* opt_array(const Metadata& md, std::string_view key) {
  const MetaValue* v = meta_find(md, key);
  if (!v) return nullptr;
  const auto* a = std::get_if<std::vector<MetaValue>>(&v->value);
  if (!a) throw Error("tokenizer metadata: " + std::string(key) + " is not an array");
  return a;
}

enum class Normalizer { None, Nfc };

// tokenizer.tessera.normalizer: absent or "none", or "nfc"; anything else is refused
// (tokenizing without a normalizer the file asks for would give other ids).
Normalizer read_normalizer(const Metadata& md) {
  const auto v = opt_string(md, "tokenizer.tessera.normalizer");
  if (!v || *v == "none") return Normalizer::None;
  if (*v == "nfc") return Normalizer::Nfc;
  throw Error("tokenizer metadata: unsupported tokenizer.tessera.normalizer = '" + *v + "' (supported: none, nfc)");
}

// Unicode NFC of a code point sequence (ICU). Code points below U+0300 are NFC and
// never compose with what precedes them, so text made only of them is returned as is.
std::vector<uint32_t> to_nfc(std::vector<uint32_t> cpts) {
  if (std::all_of(cpts.begin(), cpts.end(), [](uint32_t c) { return c < 0x300; })) return cpts;
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&err);
  if (U_FAILURE(err)) throw Error(std::string("tokenizer: ICU NFC normalizer unavailable: ") + u_errorName(err));
  std::vector<UChar> src;
  src.reserve(cpts.size() + 8);
  for (uint32_t c : cpts) {
    if (c > 0x10FFFF) c = 0xFFFD;
    if (c >= 0x10000) {
      src.push_back(static_cast<UChar>(U16_LEAD(c)));
      src.push_back(static_cast<UChar>(U16_TRAIL(c)));
    } else {
      src.push_back(static_cast<UChar>(c));
    }
  }
  std::vector<UChar> dst(src.size() + 16);
  int32_t len = unorm2_normalize(nfc, src.data(), static_cast<int32_t>(src.size()), dst.data(),
                                 static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.resize(static_cast<size_t>(len));
    len = unorm2_normalize(nfc, src.data(), static_cast<int32_t>(src.size()), dst.data(),
                           static_cast<int32_t>(dst.size()), &err);
  }
  if (U_FAILURE(err)) throw Error(std::string("tokenizer: NFC normalization failed: ") + u_errorName(err));
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(len));
  for (int32_t i = 0; i < len;) {
    UChar32 c;
    U16_NEXT(dst.data(), i, len, c);
    out.push_back(static_cast<uint32_t>(c));
  }
  return out;
}

const std::vector<std::string_view>& eog_names() {
  static const std::vector<std::string_view> names = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
      "<|eom_id|>", "<EOT>", "<end_of_utterance>", "<|return|>", "<|call|>",
  };
  return names;
}

// ---- the common part: vocabulary, special tokens, partitioning ----

class TokenizerBase : public Tokenizer {
 public:
  explicit TokenizerBase(const Metadata& md, std::string model) : model_(std::move(model)) {
    const auto* toks = opt_array(md, "tokenizer.ggml.tokens");
    if (!toks) throw Error("tokenizer metadata: missing tokenizer.ggml.tokens");
    if (toks->empty()) throw Error("tokenizer metadata: tokenizer.ggml.tokens is empty");
    if (toks->size() > static_cast<size_t>(INT32_MAX)) throw Error("tokenizer metadata: too many tokens");
    const size_t n = toks->size();
    text_.reserve(n);
    for (const MetaValue& v : *toks) {
      const auto* s = std::get_if<std::string>(&v.value);
      if (!s) throw Error("tokenizer metadata: tokenizer.ggml.tokens is not an array of strings");
      text_.push_back(*s);
    }
    type_.assign(n, kNormal);
    if (const auto* types = opt_array(md, "tokenizer.ggml.token_type")) {
      if (types->size() < n)
        throw Error("tokenizer metadata: tokenizer.ggml.token_type has " + std::to_string(types->size()) +
                    " entries for " + std::to_string(n) + " tokens");
      for (size_t i = 0; i < n; ++i) {
        auto t = meta_int((*types)[i]);
        type_[i] = t ? static_cast<int32_t>(*t) : kNormal;
      }
    }
    score_.assign(n, 0.0f);
    if (const auto* scores = opt_array(md, "tokenizer.ggml.scores")) {
      if (scores->size() < n)
        throw Error("tokenizer metadata: tokenizer.ggml.scores has " + std::to_string(scores->size()) +
                    " entries for " + std::to_string(n) + " tokens");
      for (size_t i = 0; i < n; ++i) score_[i] = static_cast<float>(meta_num((*scores)[i]).value_or(0.0));
    }
    ids_.build(text_);  // text_ is not modified afterwards
  }

  // Reads bos/eos/unk/eot/eom and the end-of-generation set; call after defaults are set.
  void init_specials(const Metadata& md) {
    auto in_range = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(text_.size()); };
    auto read = [&](const char* key, int32_t& id) {
      if (!in_range(id)) id = -1;
      // a negative id says "none" (the default of the model type does not apply)
      if (auto v = opt_int(md, key); v && *v < 0) id = -1;
      else if (v && in_range(*v)) id = static_cast<int32_t>(*v);
    };
    read("tokenizer.ggml.bos_token_id", bos_);
    read("tokenizer.ggml.eos_token_id", eos_);
    read("tokenizer.ggml.unknown_token_id", unk_);
    int32_t eot = -1, eom = -1;
    read("tokenizer.ggml.eot_token_id", eot);
    read("tokenizer.ggml.eom_token_id", eom);
    if (auto b = opt_bool(md, "tokenizer.ggml.add_bos_token")) add_bos_ = *b;
    if (add_bos_ && bos_ < 0) add_bos_ = false;

    const auto& names = eog_names();
    for (size_t i = 0; i < text_.size(); ++i) {
      if (std::find(names.begin(), names.end(), text_[i]) != names.end()) {
        eog_.insert(static_cast<int32_t>(i));
        // llama.cpp treats these as control tokens even if the file says otherwise
        if (type_[i] == kNormal) type_[i] = kControl;
      }
    }
    for (int32_t id : {eos_, eot, eom})
      if (id >= 0) eog_.insert(id);
    int32_t end_id = -1;
    bool has_return = false, has_call = false;
    for (int32_t id : eog_) {
      if (text_[size_t(id)] == "<|end|>") end_id = id;
      has_return = has_return || text_[size_t(id)] == "<|return|>";
      has_call = has_call || text_[size_t(id)] == "<|call|>";
    }
    if (end_id >= 0 && has_return && has_call) eog_.erase(end_id);

    // special tokens, longest text first (ties: lower id first)
    for (size_t i = 0; i < text_.size(); ++i) {
      const int32_t t = type_[i];
      if ((t == kControl || t == kUserDefined || t == kUnknown) && !text_[i].empty())
        specials_.push_back(static_cast<int32_t>(i));
    }
    std::stable_sort(specials_.begin(), specials_.end(),
                     [&](int32_t a, int32_t b) { return text_[a].size() > text_[b].size(); });
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    return encode_impl(text, add_bos, false);
  }
  std::vector<int32_t> encode_with_special(std::string_view text, bool add_bos) const override {
    return encode_impl(text, add_bos, true);
  }

  std::string token_to_piece(int32_t id, bool show_special) const override {
    if (id < 0 || id >= n_vocab()) return {};
    const int32_t t = type_[id];
    if (t == kControl || t == kUnknown) return show_special ? text_[id] : std::string();
    if (t == kUserDefined) return text_[id];
    if (t == kByte) {
      if (int b = byte_value(text_[id]); b >= 0) return std::string(1, static_cast<char>(b));
      return text_[id];
    }
    if (t == kUnused) return {};
    return normal_piece(id);
  }

  std::string decode_ids(const std::vector<int32_t>& ids) const {
    std::string out;
    bool strip_space = add_space_prefix_;
    for (int32_t id : ids) {
      std::string piece = token_to_piece(id, false);
      if (strip_space && id != bos_ && !piece.empty()) {
        if (piece[0] == ' ') piece.erase(0, 1);
        strip_space = false;
      }
      out += piece;
    }
    return out;
  }

  int32_t n_vocab() const override { return static_cast<int32_t>(text_.size()); }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  bool add_bos_default() const override { return add_bos_; }
  bool is_end_of_generation(int32_t id) const override { return eog_.count(id) > 0; }
  std::string model_name() const override { return model_; }

 protected:
  // "<0xNN>" -> NN, else -1
  static int byte_value(const std::string& s) {
    if (s.size() != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = hex(s[3]), lo = hex(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
  }

  int32_t find(std::string_view s) const { return ids_.find(s); }

  virtual std::string normal_piece(int32_t id) const = 0;
  // Encodes one fragment of plain text; `after_special`: it starts the input or follows a special token.
  virtual void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;

  std::vector<std::string> text_;
  std::vector<int32_t> type_;
  std::vector<float> score_;
  tok::TextIndex ids_;
  std::string model_;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false;
  bool add_space_prefix_ = false;
  std::unordered_set<int32_t> eog_;
  std::vector<int32_t> specials_;

 private:
  struct Fragment {
    int32_t token;  // -1: raw text [off, off+len)
    size_t off, len;
  };

  std::vector<int32_t> encode_impl(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    if (text.empty()) return out;
    std::vector<Fragment> frags{{-1, 0, text.size()}};
    for (int32_t sid : specials_) {
      const int32_t t = type_[sid];
      if (!parse_special && t != kUserDefined) continue;
      const std::string& st = text_[sid];
      std::vector<Fragment> next;
      bool changed = false;
      for (const Fragment& f : frags) {
        if (f.token >= 0 || f.len < st.size()) {
          next.push_back(f);
          continue;
        }
        std::string_view raw = text.substr(f.off, f.len);
        size_t start = 0;
        for (size_t m = raw.find(st); m != std::string_view::npos; m = raw.find(st, start)) {
          if (m > start) next.push_back({-1, f.off + start, m - start});
          next.push_back({sid, 0, 0});
          start = m + st.size();
          changed = true;
        }
        if (start < raw.size()) next.push_back({-1, f.off + start, raw.size() - start});
      }
      if (changed) frags.swap(next);
    }
    bool after_special = true;  // the start of the input counts as "after a special token"
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
      } else {
        encode_fragment(text.substr(f.off, f.len), after_special, out);
        after_special = false;
      }
    }
    return out;
  }
};

// ---- SentencePiece ("llama") ----

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(const Metadata& md) : TokenizerBase(md, "llama") {
    bos_ = 1;
    eos_ = 2;
    unk_ = 0;
    add_bos_ = true;
    add_space_prefix_ = opt_bool(md, "tokenizer.ggml.add_space_prefix").value_or(true);
    if (read_normalizer(md) != Normalizer::None)
      throw Error("tokenizer metadata: tokenizer.tessera.normalizer is only supported for gpt2 (byte-level BPE) tokenizers");
    init_specials(md);
    for (int b = 0; b < 256; ++b) {
      static const char* hex = "0123456789ABCDEF";
      const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      int32_t id = find(std::string_view(buf, 6));
      const char raw = static_cast<char>(b);
      if (id < 0) id = find(std::string_view(&raw, 1));  // vocabularies that store the byte itself
      byte_tok_[b] = id;
    }
  }

 protected:
  std::string normal_piece(int32_t id) const override {
    const std::string& s = text_[id];
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
        out.push_back(' ');
        i += 3;
      } else {
        out.push_back(s[i++]);
      }
    }
    return out;
  }

  void encode_fragment(std::string_view frag, bool after_special, std::vector<int32_t>& out) const override {
    std::string text;
    text.reserve(frag.size() * 2 + 3);
    if (add_space_prefix_ && after_special) text += "\xE2\x96\x81";
    for (char c : frag) {
      if (c == ' ')
        text += "\xE2\x96\x81";
      else
        text.push_back(c);
    }

    struct Sym {
      int prev, next;
      size_t off, n;
    };
    std::vector<Sym> syms;
    syms.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
      const size_t n = std::min(tok::utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
      off += n;
    }
    if (syms.empty()) return;

    struct Bigram {
      int left, right;
      float score;
      size_t size;
    };
    auto worse = [](const Bigram& a, const Bigram& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const size_t size = syms[l].n + syms[r].n;
      const int32_t id = find(std::string_view(text).substr(syms[l].off, size));
      if (id < 0) return;
      queue.push({l, r, score_[id], size});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Sym& l = syms[b.left];
      Sym& r = syms[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = 0; i != -1; i = syms[i].next) {
      const Sym& s = syms[i];
      const std::string_view piece = std::string_view(text).substr(s.off, s.n);
      const int32_t id = find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (unsigned char c : piece) {
        const int32_t bt = byte_tok_[c];
        if (bt >= 0)
          out.push_back(bt);
        else if (unk_ >= 0)
          out.push_back(unk_);
      }
    }
  }

 private:
  int32_t byte_tok_[256];
};

// ---- byte-level BPE ("gpt2") ----

class BpeTokenizer final : public TokenizerBase {
 public:
  BpeTokenizer(const Metadata& md, std::string pre) : TokenizerBase(md, "gpt2") {
    bos_ = 11;
    eos_ = 11;
    unk_ = -1;
    add_bos_ = false;
    if (pre.empty() || pre == "default") {
      pre_ = PreType::Default;
    } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
               pre == "pixtral") {
      pre_ = PreType::Llama3;
      ignore_merges_ = true;
      add_bos_ = true;
    } else if (pre == "dbrx" || pre == "smaug-bpe") {
      pre_ = PreType::Llama3;
    } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2") {
      pre_ = PreType::Qwen2;
    } else if (pre == "qwen35") {
      pre_ = PreType::Qwen35;
    } else if (pre == "glm4" || pre == "chatglm-bpe") {
      pre_ = PreType::Llama3;  // the same regex; no BOS unless the file names one
      bos_ = -1;
    } else if (pre == "gpt-4o" || pre == "llama4") {
      pre_ = PreType::Gpt4o;
    } else if (pre == "deepseek-v3") {
      pre_ = PreType::DeepseekV3;
    } else if (pre == "deepseek-llm") {
      pre_ = PreType::DeepseekLlm;
    } else if (pre == "gpt-2" || pre == "phi-2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
      pre_ = PreType::Gpt2;
    } else {
      throw Error("tokenizer metadata: unsupported pre-tokenizer tokenizer.ggml.pre = '" + pre + "'");
    }
    if (auto im = opt_bool(md, "tokenizer.ggml.ignore_merges")) ignore_merges_ = *im;
    nfc_ = read_normalizer(md) == Normalizer::Nfc;
    init_specials(md);

    for (int b = 0; b < 256; ++b) {
      std::string s;
      tok::append_utf8(s, tok::byte_to_unicode(static_cast<uint8_t>(b)));
      byte_tok_[b] = find(s);
    }

    const auto* merges = opt_array(md, "tokenizer.ggml.merges");
    if (!merges) throw Error("tokenizer metadata: gpt2 tokenizer without tokenizer.ggml.merges");
    merges_.reserve(merges->size());
    std::string joined;
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const auto* m = std::get_if<std::string>(&(*merges)[rank].value);
      if (!m) throw Error("tokenizer metadata: tokenizer.ggml.merges is not an array of strings");
      const size_t sp = m->find(' ', 1);
      if (sp == std::string::npos) continue;
      const std::string_view a = std::string_view(*m).substr(0, sp);
      const std::string_view b = std::string_view(*m).substr(sp + 1);
      const int32_t ia = find(a), ib = find(b);
      if (ia < 0 || ib < 0) continue;
      joined.assign(a);
      joined.append(b);
      const int32_t ij = find(joined);
      if (ij < 0) continue;  // a merge whose result is not a token can never yield a token
      merges_.insert(key(ia, ib), {static_cast<int32_t>(rank), ij});  // first (lowest rank) wins
    }
  }

 protected:
  std::string normal_piece(int32_t id) const override {
    std::string out;
    const std::string& s = text_[id];
    for (uint32_t cp : tok::utf8_to_cpts(s)) {
      const int b = tok::unicode_to_byte(cp);
      if (b >= 0)
        out.push_back(static_cast<char>(b));
      else
        tok::append_utf8(out, cp);
    }
    return out;
  }

  void encode_fragment(std::string_view frag, bool, std::vector<int32_t>& out) const override {
    std::vector<uint32_t> cpts = tok::utf8_to_cpts(frag);
    if (nfc_) cpts = to_nfc(std::move(cpts));
    const std::vector<tok::Span> spans = tok::pretokenize(pre_, cpts);
    std::string word;
    std::string mapped;
    for (const tok::Span& sp : spans) {
      word.clear();
      for (size_t i = sp.begin; i < sp.end; ++i) tok::append_utf8(word, cpts[i]);
      if (ignore_merges_) {
        mapped.clear();
        for (unsigned char c : word) tok::append_utf8(mapped, tok::byte_to_unicode(c));
        if (int32_t id = find(mapped); id >= 0) {
          out.push_back(id);
          continue;
        }
      }
      bpe_word(word, out);
    }
  }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void bpe_word(const std::string& word, std::vector<int32_t>& out) const {
    struct Sym {
      int32_t id;
      int prev, next;
    };
    std::vector<Sym> syms;
    syms.reserve(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      const int idx = static_cast<int>(i);
      syms.push_back({byte_tok_[static_cast<unsigned char>(word[i])], idx - 1,
                      i + 1 == word.size() ? -1 : idx + 1});
    }
    if (syms.size() > 1) {
      struct Pair {
        int32_t rank;
        int left, right;
        int32_t lid, rid;
      };
      auto worse = [](const Pair& a, const Pair& b) {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
      };
      std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> queue(worse);
      auto try_add = [&](int l, int r) {
        if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
        const tok::PairIndex::Value* m = merges_.find(key(syms[l].id, syms[r].id));
        if (!m) return;
        queue.push({m->rank, l, r, syms[l].id, syms[r].id});
      };
      for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
      while (!queue.empty()) {
        const Pair p = queue.top();
        queue.pop();
        Sym& l = syms[p.left];
        Sym& r = syms[p.right];
        // stale: a side was merged away or changed since the pair was queued
        if (l.id != p.lid || r.id != p.rid || l.next != p.right || l.id < 0) continue;
        l.id = merges_.find(key(p.lid, p.rid))->result;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = p.left;
        r.id = -2;  // dead
        try_add(l.prev, p.left);
        try_add(p.left, l.next);
      }
    }
    for (int i = 0; i != -1; i = syms[i].next) {
      if (syms[i].id >= 0)
        out.push_back(syms[i].id);
      else if (syms[i].id == -1 && unk_ >= 0)
        out.push_back(unk_);  // a byte without a token in this vocabulary
    }
  }

  PreType pre_ = PreType::Default;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  int32_t byte_tok_[256];
  tok::PairIndex merges_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_metadata(const Metadata& md) {
  const auto model = opt_string(md, "tokenizer.ggml.model");
  if (!model) throw Error("tokenizer metadata: missing tokenizer.ggml.model");
  if (*model == "llama") return std::make_unique<SpmTokenizer>(md);
  if (*model == "gpt2") return std::make_unique<BpeTokenizer>(md, opt_string(md, "tokenizer.ggml.pre").value_or(""));
  throw Error("tokenizer metadata: unsupported tokenizer.ggml.model = '" + *model + "' (supported: llama, gpt2)");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (const auto* t = dynamic_cast<const TokenizerBase*>(this)) return t->decode_ids(ids);
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, false);
  return out;
}

}  // namespace tessera
