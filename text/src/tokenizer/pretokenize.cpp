#include "tokenizer/pretokenize.h"

#include <iterator>

#include "tokenizer/unicode.h"

namespace tessera::tok {

namespace {

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
inline bool is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

// One chunk [lo, hi) of code points with their classes; positions outside the
// chunk have class 0 and are never consumed.
struct Chunk {
  const std::vector<uint32_t>& c;
  const std::vector<uint8_t>& k;
  size_t lo, hi;
  uint8_t cls(size_t i) const { return i < hi ? k[i] : 0; }
  bool has(size_t i, uint8_t mask) const { return i < hi && (k[i] & mask); }
};

// Contraction at `pos`: returns its end, or 0. `any_case`: (?i:...), where Unicode
// case folding also makes U+017F (long s) an s.
size_t contraction(const Chunk& ch, size_t pos, bool any_case) {
  if (pos >= ch.hi || ch.c[pos] != '\'' || pos + 1 >= ch.hi) return 0;
  auto low = [&](size_t i) { return any_case ? (ch.c[i] == 0x17F ? uint32_t('s') : ascii_lower(ch.c[i])) : ch.c[i]; };
  const uint32_t n1 = low(pos + 1);
  if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return pos + 2;
  if (pos + 2 < ch.hi) {
    const uint32_t n2 = low(pos + 2);
    if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return pos + 3;
  }
  return 0;
}

// \s+(?!\S) | \s+ at pos (and, with `newlines`, \s*[\r\n]+ first); 0 if no whitespace.
size_t whitespace(const Chunk& ch, size_t pos, bool newlines) {
  size_t n = 0, last_nl = 0;
  while (ch.has(pos + n, kWhitespace)) {
    if (is_nl(ch.c[pos + n])) last_nl = pos + n + 1;
    ++n;
  }
  if (newlines && last_nl > 0) return last_nl;            // \s*[\r\n]+
  if (n > 1 && pos + n < ch.hi) return pos + n - 1;       // \s+(?!\S)
  if (n > 0) return pos + n;                              // \s+
  return 0;
}

void split_gpt2(const Chunk& ch, std::vector<Span>& out) {
  size_t pos = ch.lo;
  while (pos < ch.hi) {
    size_t end = contraction(ch, pos, /*any_case=*/false);
    if (!end) {
      const size_t p = pos + (ch.c[pos] == ' ' ? 1 : 0);
      if (ch.has(p, kLetter)) {  // ' ?\p{L}+'
        end = p;
        while (ch.has(end, kLetter)) ++end;
      } else if (ch.has(p, kNumber)) {  // ' ?\p{N}+'
        end = p;
        while (ch.has(end, kNumber)) ++end;
      } else if (p < ch.hi && !(ch.cls(p) & (kWhitespace | kLetter | kNumber))) {  // ' ?[^\s\p{L}\p{N}]+'
        end = p;
        while (end < ch.hi && !(ch.cls(end) & (kWhitespace | kLetter | kNumber))) ++end;
      } else {
        end = whitespace(ch, pos, /*newlines=*/false);
        if (!end) end = pos + 1;
      }
    }
    out.push_back({pos, end});
    pos = end;
  }
}

// Llama 3 / Qwen 2 / Qwen 3.5 family.
void split_llama3_family(const Chunk& ch, std::vector<Span>& out, size_t digit_group, bool marks) {
  const uint8_t word = marks ? (kLetter | kMark) : kLetter;
  const uint8_t not_punct = kWhitespace | kLetter | kNumber | (marks ? kMark : 0);
  size_t pos = ch.lo;
  while (pos < ch.hi) {
    const uint32_t cp = ch.c[pos];
    const uint8_t f = ch.cls(pos);
    size_t end = contraction(ch, pos, /*any_case=*/true);
    if (end) {
      out.push_back({pos, end});
      pos = end;
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)
    if (!is_nl(cp) && !(f & kNumber) && ((f & word) || ch.has(pos + 1, word))) {
      end = pos + 1;
      while (ch.has(end, word)) ++end;
      out.push_back({pos, end});
      pos = end;
      continue;
    }
    // \p{N}{1,3} or \p{N}
    if (f & kNumber) {
      size_t n = 0;
      end = pos;
      while (n < digit_group && ch.has(end, kNumber)) {
        ++end;
        ++n;
      }
      out.push_back({pos, end});
      pos = end;
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    {
      const size_t p = pos + (cp == ' ' ? 1 : 0);
      if (p < ch.hi && !(ch.cls(p) & not_punct)) {
        end = p + 1;
        while (end < ch.hi && !(ch.cls(end) & not_punct)) ++end;
        while (end < ch.hi && is_nl(ch.c[end])) ++end;
        out.push_back({pos, end});
        pos = end;
        continue;
      }
    }
    end = whitespace(ch, pos, /*newlines=*/true);
    if (!end) end = pos + 1;
    out.push_back({pos, end});
    pos = end;
  }
}

// GPT-4o's o200k: words by case, numbers by three, punctuation with its trailing
// newlines and slashes, whitespace.
void split_gpt4o(const Chunk& ch, std::vector<Span>& out) {
  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]
  auto upper = [&](size_t i) { return ch.has(i, kMark) || (ch.has(i, kLetter) && !ch.has(i, kLower)); };
  auto lower = [&](size_t i) { return ch.has(i, kMark) || (ch.has(i, kLetter) && !ch.has(i, kUpper)); };
  // U*L+ from p as a backtracking matcher would end it (0: no match): the longest U*
  // after which an L starts, then the L run.
  auto upper_then_lower = [&](size_t p) -> size_t {
    size_t u = p;
    while (upper(u)) ++u;
    for (size_t q = u + 1; q-- > p;) {
      if (!lower(q)) continue;
      size_t e = q;
      while (lower(e)) ++e;
      return e;
    }
    return 0;
  };
  // U+L* from p (0: no match).
  auto upper_run = [&](size_t p) -> size_t {
    size_t e = p;
    while (upper(e)) ++e;
    if (e == p) return 0;
    while (lower(e)) ++e;
    return e;
  };
  size_t pos = ch.lo;
  while (pos < ch.hi) {
    const uint32_t cp = ch.c[pos];
    const uint8_t f = ch.cls(pos);
    // Each word alternative with its optional lead character [^\r\n\p{L}\p{N}] first,
    // then without it; a contraction may follow.
    const bool lead = !is_nl(cp) && !(f & (kLetter | kNumber));
    size_t end = 0;
    if (lead) end = upper_then_lower(pos + 1);
    if (!end) end = upper_then_lower(pos);
    if (!end && lead) end = upper_run(pos + 1);
    if (!end) end = upper_run(pos);
    if (end) {
      if (const size_t c = contraction(ch, end, /*any_case=*/true)) end = c;
    } else if (f & kNumber) {  // \p{N}{1,3}
      end = pos;
      while (end < pos + 3 && ch.has(end, kNumber)) ++end;
    } else {
      // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
      const size_t p = pos + (cp == ' ' ? 1 : 0);
      if (p < ch.hi && !(ch.cls(p) & (kWhitespace | kLetter | kNumber))) {
        end = p + 1;
        while (end < ch.hi && !(ch.cls(end) & (kWhitespace | kLetter | kNumber))) ++end;
        while (end < ch.hi && (is_nl(ch.c[end]) || ch.c[end] == '/')) ++end;
      } else {
        end = whitespace(ch, pos, /*newlines=*/true);
        if (!end) end = pos + 1;
      }
    }
    out.push_back({pos, end});
    pos = end;
  }
}

inline bool ascii_punct(uint32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}
inline bool ascii_letter(uint32_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// DeepSeek-V3's last regex at pos: the end of its match there, or 0.
size_t deepseek_v3_word(const Chunk& ch, size_t pos) {
  const uint8_t word = kLetter | kMark, punct = kPunct | kSymbol;
  const uint32_t cp = ch.c[pos];
  const uint8_t f = ch.cls(pos);
  size_t end = 0;
  if (ascii_punct(cp) && pos + 1 < ch.hi && ascii_letter(ch.c[pos + 1])) {  // [!-/:-@\[-`{-~][A-Za-z]+
    end = pos + 1;
    while (end < ch.hi && ascii_letter(ch.c[end])) ++end;
  } else if ((!is_nl(cp) && !(f & (kLetter | punct)) && ch.has(pos + 1, word)) || (f & word)) {
    end = pos + 1;  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    while (ch.has(end, word)) ++end;
  } else if (const size_t p = pos + (cp == ' ' ? 1 : 0); ch.has(p, punct)) {  // ' ?[\p{P}\p{S}]+[\r\n]*'
    end = p + 1;
    while (ch.has(end, punct)) ++end;
    while (end < ch.hi && is_nl(ch.c[end])) ++end;
  } else {
    end = whitespace(ch, pos, /*newlines=*/true);
  }
  return end;
}

// DeepSeek-V2's letter class: the cased letters its tokenizer.json lists range by
// range (Unicode's Lu, Ll and Lt as of that file, without later additions).
bool deepseek_llm_letter(uint32_t c) {
  struct Range {
    uint32_t lo, hi;
  };
  static constexpr Range kRanges[] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6},
    {0x00D8, 0x00F6}, {0x00F8, 0x01BA}, {0x01BC, 0x01BF}, {0x01C4, 0x0293},
    {0x0295, 0x02AF}, {0x0370, 0x0373}, {0x0376, 0x0377}, {0x037B, 0x037D},
    {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A}, {0x038C, 0x038C},
    {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F},
    {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
    {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115},
    {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D},
    {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E},
    {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
  };
  if (c < 0x41) return false;
  size_t a = 0, b = std::size(kRanges);
  while (a < b) {  // first range whose end is >= c
    const size_t m = (a + b) / 2;
    if (kRanges[m].hi < c) a = m + 1;
    else b = m;
  }
  return a < std::size(kRanges) && kRanges[a].lo <= c;
}

// Punctuation of DeepSeek-V2's third split: ASCII !-/ and :-~, their fullwidth forms,
// curly quotes and the first CJK punctuation.
bool deepseek_llm_punct(uint32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
         (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
}

// Each span split by a regex's matches, the text between them kept as pieces too.
// match(ch, pos): the end of the match starting at pos, or 0.
template <class Match>
std::vector<Span> isolate(const std::vector<uint32_t>& c, const std::vector<uint8_t>& k, const std::vector<Span>& in,
                          Match match) {
  std::vector<Span> out;
  out.reserve(in.size() * 2);
  for (const Span& s : in) {
    const Chunk ch{c, k, s.begin, s.end};
    size_t pos = s.begin, gap = s.begin;
    while (pos < s.end) {
      const size_t end = match(ch, pos);
      if (!end) {
        ++pos;
        continue;
      }
      if (gap < pos) out.push_back({gap, pos});
      out.push_back({pos, end});
      pos = gap = end;
    }
    if (gap < s.end) out.push_back({gap, s.end});
  }
  return out;
}

// \s?[class]+ at pos (0: none).
template <class Pred>
size_t space_then_run(const Chunk& ch, size_t pos, Pred in_class) {
  size_t p = pos;
  if (ch.has(pos, kWhitespace) && pos + 1 < ch.hi && in_class(ch.c[pos + 1])) p = pos + 1;
  else if (!in_class(ch.c[pos])) return 0;
  while (p < ch.hi && in_class(ch.c[p])) ++p;
  return p;
}

// Splits each span into maximal runs of `pred` and the gaps between them.
template <class Pred>
std::vector<Span> split_runs(const std::vector<Span>& in, Pred pred) {
  std::vector<Span> out;
  out.reserve(in.size() * 2);
  for (const Span& s : in) {
    size_t i = s.begin;
    while (i < s.end) {
      const bool p = pred(i);
      size_t j = i + 1;
      while (j < s.end && pred(j) == p) ++j;
      out.push_back({i, j});
      i = j;
    }
  }
  return out;
}

}  // namespace

std::vector<Span> pretokenize(PreType type, const std::vector<uint32_t>& cpts) {
  std::vector<uint8_t> cls(cpts.size());
  for (size_t i = 0; i < cpts.size(); ++i) cls[i] = cp_class(cpts[i]);
  std::vector<Span> out;
  out.reserve(cpts.size() / 3 + 1);
  if (cpts.empty()) return out;
  switch (type) {
    case PreType::Gpt2:
      split_gpt2(Chunk{cpts, cls, 0, cpts.size()}, out);
      break;
    case PreType::Llama3:
      split_llama3_family(Chunk{cpts, cls, 0, cpts.size()}, out, 3, false);
      break;
    case PreType::Qwen2:
      split_llama3_family(Chunk{cpts, cls, 0, cpts.size()}, out, 1, false);
      break;
    case PreType::Qwen35:
      split_llama3_family(Chunk{cpts, cls, 0, cpts.size()}, out, 1, true);
      break;
    case PreType::Gpt4o:
      split_gpt4o(Chunk{cpts, cls, 0, cpts.size()}, out);
      break;
    case PreType::DeepseekV3: {
      std::vector<Span> pass{{0, cpts.size()}};
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) -> size_t {  // \p{N}{1,3}
        size_t j = i;
        while (j < i + 3 && ch.has(j, kNumber)) ++j;
        return j > i ? j : 0;
      });
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) -> size_t {  // CJK ideographs and kana
        auto cjk = [](uint32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF); };
        size_t j = i;
        while (j < ch.hi && cjk(ch.c[j])) ++j;
        return j > i ? j : 0;
      });
      out = isolate(cpts, cls, pass, deepseek_v3_word);
      break;
    }
    case PreType::DeepseekLlm: {
      std::vector<Span> pass{{0, cpts.size()}};
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) { return is_nl(ch.c[i]) ? i + 1 : 0; });
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) { return space_then_run(ch, i, deepseek_llm_letter); });
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) { return space_then_run(ch, i, deepseek_llm_punct); });
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) -> size_t {  // \s+$
        for (size_t j = i; j < ch.hi; ++j)
          if (!ch.has(j, kWhitespace)) return 0;
        return ch.hi;
      });
      pass = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) -> size_t {
        auto cjk = [](uint32_t c) { return (c >= 0x0800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF); };
        size_t j = i;
        while (j < ch.hi && cjk(ch.c[j])) ++j;
        return j > i ? j : 0;
      });
      out = isolate(cpts, cls, pass, [](const Chunk& ch, size_t i) -> size_t {
        size_t j = i;
        while (ch.has(j, kNumber)) ++j;
        return j > i ? j : 0;
      });
      break;
    }
    case PreType::Default: {
      auto is_p = [&](size_t i) {
        const uint32_t c = cpts[i];
        return (cls[i] & kPunct) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
               c == '~' || c == '|';
      };
      std::vector<Span> pass = split_runs(std::vector<Span>{{0, cpts.size()}}, is_p);
      std::vector<Span> pass2;
      for (const Span& s : pass) split_gpt2(Chunk{cpts, cls, s.begin, s.end}, pass2);
      pass = split_runs(pass2, [&](size_t i) { return (cls[i] & kNumber) != 0; });
      // [0-9][0-9][0-9]: non-overlapping, left to right
      auto digit = [&](size_t i) { return cpts[i] >= '0' && cpts[i] <= '9'; };
      for (const Span& s : pass) {
        size_t start = s.begin, i = s.begin;
        while (i + 3 <= s.end) {
          if (digit(i) && digit(i + 1) && digit(i + 2)) {
            if (i > start) out.push_back({start, i});
            out.push_back({i, i + 3});
            i += 3;
            start = i;
          } else {
            ++i;
          }
        }
        if (start < s.end) out.push_back({start, s.end});
      }
      break;
    }
  }
  return out;
}

}  // namespace tessera::tok
