// Tokenizer built from GGUF tokenizer metadata (tokenizer.ggml.*):
//  - "llama": SentencePiece BPE over pieces with scores, byte fallback <0xNN>,
//    a leading space added and spaces shown as U+2581;
//  - "gpt2": byte-level BPE with merges, after a pre-tokenizer chosen by
//    tokenizer.ggml.pre (llama-bpe/llama3, qwen2, qwen35, gpt-2, default).
// encode() does not parse special tokens in the text (as the fixtures expect);
// encode_with_special() does.
//
// Keys beyond GGUF's, written by the Hugging Face tokenizer.json reader
// (loaders/safetensors/hf_tokenizer.h) and honoured here:
//  - tokenizer.ggml.ignore_merges (bool): take a pre-tokenized piece that is itself a
//    token whole instead of merging it; when present it overrides the default of the
//    pre type (true for llama3-style vocabularies, false otherwise);
//  - tokenizer.tessera.normalizer (string): "nfc" puts each text fragment in Unicode
//    NFC before pre-tokenizing (gpt2 model only); absent or "none": no normalizer;
//    any other value is refused;
//  - a negative tokenizer.ggml.{bos,eos,unknown}_token_id means "none": the model
//    type's default id (e.g. 11 for gpt2) does not apply.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Metadata;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Throws tessera::Error if the metadata lacks or contradicts what the model needs.
  static std::unique_ptr<Tokenizer> from_metadata(const Metadata& md);

  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // Like encode(), but text matching a control/user-defined token becomes that token.
  virtual std::vector<int32_t> encode_with_special(std::string_view text, bool add_bos) const = 0;
  // The bytes a token stands for (may be a partial UTF-8 sequence); control tokens
  // decode to "" unless `show_special`.
  virtual std::string token_to_piece(int32_t id, bool show_special = false) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos() const = 0;  // -1 if none
  virtual int32_t eos() const = 0;  // -1 if none
  virtual bool add_bos_default() const = 0;  // tokenizer.ggml.add_bos_token (or model default)
  virtual bool is_end_of_generation(int32_t id) const = 0;
  virtual std::string model_name() const = 0;  // "llama" / "gpt2"
};

}  // namespace tessera
