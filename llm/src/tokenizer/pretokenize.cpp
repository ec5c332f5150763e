#include "tokenizer/pretokenize.h"

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

// Contraction at `pos`: returns its end, or 0. `any_case`: (?i:...) / '[sS]...
size_t contraction(const Chunk& ch, size_t pos, bool any_case) {
  if (ch.c[pos] != '\'' || pos + 1 >= ch.hi) return 0;
  auto low = [&](size_t i) { return any_case ? ascii_lower(ch.c[i]) : ch.c[i]; };
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
