// Private: the byte-level BPE pre-tokenizers, written as hand matchers over code
// points that reproduce the regexes llama.cpp uses for each tokenizer.ggml.pre
// (leftmost alternative wins, as in ECMAScript / PCRE alternation).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tessera::tok {

enum class PreType {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Llama3,
  // as Llama3 with \p{N} (one digit per piece)
  Qwen2,
  // as Qwen2 with [\p{L}\p{M}]+ for words and \p{M} out of the punctuation class:
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen35,
  // GPT-4o's o200k (gpt-oss, Llama 4): words by case,
  // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
  // |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
  // |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Gpt4o,
  // DeepSeek-V3 / R1: successive splits by \p{N}{1,3}, by runs of [\u4e00-\u9fa5\u3040-\u30ff],
  // then [!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*
  // |\s*[\r\n]+|\s+(?!\S)|\s+ (what no alternative matches is a piece of its own)
  DeepseekV3,
  // DeepSeek-V2 ("deepseek-llm"): successive splits by [\r\n], \s?[cased letters]+,
  // \s?[ASCII and fullwidth punctuation]+, \s+$, runs of U+0800-U+9FA5 and Hangul
  // syllables, \p{N}+
  DeepseekLlm,
  // llama.cpp's "default": successive splits by [\p{P}\$\+<=>\^~\|]+, the GPT-2
  // regex, \p{N}+ and [0-9][0-9][0-9]
  Default,
};

struct Span {
  size_t begin, end;  // code point indices, [begin, end)
};

// Splits `cpts` into pieces covering it entirely, in order.
std::vector<Span> pretokenize(PreType type, const std::vector<uint32_t>& cpts);

}  // namespace tessera::tok
