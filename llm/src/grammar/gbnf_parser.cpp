// GBNF text into a Grammar (grammar.h). Groups and repetitions become rules of their
// own (X* is R ::= X R | ε, right-recursive, so a matcher's stacks do not grow with
// the repetition); a rule's alternatives are stored flat, as grammar.h describes.
// Left recursion is refused here: the matcher expands rules top-down and would not
// terminate on it.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tessera/utf8.h"
#include "tessera/grammar.h"

namespace tessera {

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  std::shared_ptr<const Grammar> parse(std::string_view root_name) {
    reserve_defined_names();
    skip_space(true);
    while (p_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) fail_at(ref_pos_[r], "undefined rule '" + names_[r] + "'");
    auto root = ids_.find(std::string(root_name));
    if (root == ids_.end() || !defined_[root->second])
      throw GrammarError("grammar: no rule named '" + std::string(root_name) + "' (the start rule)");
    check_left_recursion();
    return build(root->second);
  }

 private:
  struct Item {  // one element while parsing: a rule reference or a character set
    bool is_ref = false;
    uint32_t rule = 0;
    bool negated = false;
    std::vector<Grammar::Range> ranges;
  };
  using Sequence = std::vector<Item>;
  using Alternatives = std::vector<Sequence>;

  std::string_view s_;
  size_t p_ = 0;
  std::vector<Alternatives> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> ref_pos_;  // where an undefined rule was first referred to
  std::map<std::string, uint32_t> ids_;
  std::set<std::string> defined_names_;  // every "name ::=" of the text, kept free for it

  // Names of generated rules (groups, repetitions) must not take a name the text
  // defines further down.
  void reserve_defined_names() {
    for (size_t i = 0; i < s_.size();) {
      size_t j = i;
      while (j < s_.size() && is_name_char(s_[j])) ++j;
      if (j > i) {
        size_t k = j;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
        if (s_.substr(k, 3) == "::=") defined_names_.insert(std::string(s_.substr(i, j - i)));
        i = j;
      } else {
        ++i;
      }
    }
  }

  [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar: line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(p_, what); }

  bool at_end() const { return p_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return p_ + ahead < s_.size() ? s_[p_ + ahead] : '\0'; }

  // Skips spaces, tabs and # comments; newlines too when `newlines` (inside groups,
  // and between rules).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++p_;
      } else if (c == '#') {
        while (!at_end() && s_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }
  // At top level a newline ends a rule unless the next line goes on with '|'.
  bool continues_on_next_line() {
    size_t q = p_;
    while (q < s_.size()) {
      const char c = s_[q];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++q;
      } else if (c == '#') {
        while (q < s_.size() && s_[q] != '\n') ++q;
      } else {
        break;
      }
    }
    if (q < s_.size() && s_[q] == '|') {
      p_ = q;
      return true;
    }
    return false;
  }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string parse_name() {
    const size_t start = p_;
    while (!at_end() && is_name_char(s_[p_])) ++p_;
    if (p_ == start) fail("expected a rule name");
    return std::string(s_.substr(start, p_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t pos) {
    auto [it, fresh] = ids_.emplace(name, uint32_t(rules_.size()));
    if (fresh) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(false);
      ref_pos_.push_back(pos);
    }
    return it->second;
  }
  uint32_t new_rule(const std::string& base, Alternatives alts) {
    std::string name;
    for (int n = 1;; ++n) {
      name = base + "-" + std::to_string(n);
      if (!ids_.count(name) && !defined_names_.count(name)) break;
    }
    const uint32_t id = rule_id(name, p_);
    rules_[id] = std::move(alts);
    defined_[id] = true;
    return id;
  }

  void parse_rule() {
    const size_t start = p_;
    const std::string name = parse_name();
    skip_space(false);
    if (s_.substr(p_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
    p_ += 3;
    const uint32_t id = rule_id(name, start);
    if (defined_[id]) fail_at(start, "rule '" + name + "' is defined twice");
    defined_[id] = true;
    Alternatives alts = parse_alternatives(name, false);
    rules_[id] = std::move(alts);
    if (!at_end() && peek() != '\n') fail(std::string("unexpected '") + peek() + "'");
  }

  Alternatives parse_alternatives(const std::string& rule, bool nested) {
    Alternatives alts;
    alts.push_back(parse_sequence(rule, nested));
    for (;;) {
      skip_space(nested);
      if (peek() == '|' || (!nested && peek() == '\n' && continues_on_next_line())) {
        ++p_;
        alts.push_back(parse_sequence(rule, nested));
      } else {
        break;
      }
    }
    return alts;
  }

  Sequence parse_sequence(const std::string& rule, bool nested) {
    Sequence seq;
    size_t last_start = 0;  // where the last item (which a quantifier applies to) begins in seq
    bool have_last = false;
    for (;;) {
      skip_space(nested);
      if (at_end()) break;
      const char c = peek();
      if (c == '"') {
        last_start = seq.size();
        parse_literal(seq);
        have_last = true;
      } else if (c == '[') {
        last_start = seq.size();
        seq.push_back(parse_class());
        have_last = true;
      } else if (c == '.') {
        ++p_;
        last_start = seq.size();
        Item any;
        any.negated = true;  // nothing excluded: any code point
        seq.push_back(any);
        have_last = true;
      } else if (c == '(') {
        ++p_;
        Alternatives inner = parse_alternatives(rule, true);
        skip_space(true);
        if (peek() != ')') fail("expected ')'");
        ++p_;
        last_start = seq.size();
        Item ref;
        ref.is_ref = true;
        ref.rule = new_rule(rule, std::move(inner));
        seq.push_back(ref);
        have_last = true;
      } else if (is_name_char(c)) {
        const size_t at = p_;
        const std::string name = parse_name();
        skip_space(false);
        if (s_.substr(p_, 3) == "::=") {  // the next rule begins: this one had no newline
          fail_at(at, "expected a newline before rule '" + name + "'");
        }
        last_start = seq.size();
        Item ref;
        ref.is_ref = true;
        ref.rule = rule_id(name, at);
        seq.push_back(ref);
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) fail(std::string("'") + c + "' follows nothing");
        Sequence item(seq.begin() + ptrdiff_t(last_start), seq.end());
        seq.resize(last_start);
        repeat(rule, std::move(item), seq);
        have_last = false;  // "x**" is not GBNF
      } else {
        break;
      }
    }
    return seq;
  }

  // X with the quantifier at p_ appended to seq.
  void repeat(const std::string& rule, Sequence item, Sequence& seq) {
    size_t min = 0, max = SIZE_MAX;
    const char q = s_[p_++];
    if (q == '+') {
      min = 1;
    } else if (q == '?') {
      max = 1;
    } else if (q == '{') {
      skip_space(true);
      min = parse_count();
      skip_space(true);
      if (peek() == ',') {
        ++p_;
        skip_space(true);
        if (peek() != '}') max = parse_count();
      } else {
        max = min;
      }
      skip_space(true);
      if (peek() != '}') fail("expected '}'");
      ++p_;
      if (max < min) fail("repetition {" + std::to_string(min) + "," + std::to_string(max) + "}: the maximum is below the minimum");
    }
    constexpr size_t kMaxCopies = 4096;
    if (min > kMaxCopies || (max != SIZE_MAX && max > kMaxCopies))
      fail("repetition counts above " + std::to_string(kMaxCopies) + " are not supported");
    for (size_t i = 0; i < min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    auto ref_to = [](uint32_t r) {
      Item ref;
      ref.is_ref = true;
      ref.rule = r;
      return ref;
    };
    if (max == SIZE_MAX) {  // R ::= X R | ε
      const uint32_t r = new_rule(rule, {});
      Sequence again = item;
      again.push_back(ref_to(r));
      rules_[r] = {again, {}};
      seq.push_back(ref_to(r));
      return;
    }
    // max - min optional copies, nested: O1 ::= X | ε, Ok ::= X O(k-1) | ε.
    uint32_t inner = 0;
    bool have_inner = false;
    for (size_t k = min; k < max; ++k) {
      Sequence first = item;
      if (have_inner) first.push_back(ref_to(inner));
      inner = new_rule(rule, {first, {}});
      have_inner = true;
    }
    if (have_inner) seq.push_back(ref_to(inner));
  }

  size_t parse_count() {
    const size_t start = p_;
    size_t v = 0;
    while (!at_end() && s_[p_] >= '0' && s_[p_] <= '9') {
      v = v * 10 + size_t(s_[p_++] - '0');
      if (v > 1000000) fail("repetition count too large");
    }
    if (p_ == start) fail("expected a number");
    return v;
  }

  // One code point of UTF-8 text, or an escape.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of grammar");
    const unsigned char c = static_cast<unsigned char>(s_[p_]);
    if (c == '\\') {
      ++p_;
      if (at_end()) fail("unexpected end after '\\'");
      const char e = s_[p_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '/': case '^': case '\'': return uint32_t(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: fail_at(p_ - 2, std::string("unknown escape '\\") + e + "'");
      }
    }
    const size_t at = p_;
    const uint32_t cp = next_code_point(s_, p_);
    if (cp == 0xFFFD && s_.substr(at, 3) != "\xEF\xBF\xBD") fail_at(at, "invalid UTF-8 in grammar");
    return cp;
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + uint32_t(d);
      ++p_;
    }
    if (v > 0x10FFFF) fail("code point beyond U+10FFFF");
    return v;
  }

  void parse_literal(Sequence& seq) {
    ++p_;  // "
    while (true) {
      if (at_end() || peek() == '\n') fail("unterminated string literal");
      if (peek() == '"') break;
      const uint32_t cp = parse_char();
      Item it;
      it.ranges.push_back({cp, cp});
      seq.push_back(it);
    }
    ++p_;
  }

  Item parse_class() {
    ++p_;  // [
    Item it;
    if (peek() == '^') {
      it.negated = true;
      ++p_;
    }
    while (true) {
      if (at_end() || peek() == '\n') fail("unterminated character class");
      if (peek() == ']') break;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0' && peek(1) != '\n') {
        ++p_;
        hi = parse_char();
        if (hi < lo) fail("character range ends before it starts");
      }
      it.ranges.push_back({lo, hi});
    }
    ++p_;
    return it;
  }

  void check_left_recursion() const {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Sequence& alt : rules_[r]) {
          const bool all = std::all_of(alt.begin(), alt.end(), [&](const Item& it) { return it.is_ref && nullable[it.rule]; });
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s where s can be the first thing r expands to.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& alt : rules_[r])
        for (const Item& it : alt) {
          if (!it.is_ref) break;
          first[r].push_back(it.rule);
          if (!nullable[it.rule]) break;
        }
    std::vector<uint8_t> mark(n, 0);  // 0 unseen, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      mark[r] = 1;
      for (uint32_t s : first[r]) {
        if (mark[s] == 1) throw GrammarError("grammar: rule '" + names_[s] + "' is left-recursive (not supported)");
        if (mark[s] == 0) visit(s);
      }
      mark[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r)
      if (mark[r] == 0) visit(r);
  }

  std::shared_ptr<const Grammar> build(uint32_t root) {
    auto g = std::make_shared<Grammar>();
    g->root_ = root;
    g->names_ = names_;
    for (const Alternatives& alts : rules_) {
      g->rule_start_.push_back(uint32_t(g->elements_.size()));
      for (size_t a = 0; a < alts.size(); ++a) {
        for (const Item& it : alts[a]) {
          Grammar::Element e;
          if (it.is_ref) {
            e.kind = Grammar::Element::Kind::RuleRef;
            e.value = it.rule;
          } else {
            e.kind = Grammar::Element::Kind::Chars;
            e.negated = it.negated;
            e.value = uint32_t(g->ranges_.size());
            e.count = uint32_t(it.ranges.size());
            g->ranges_.insert(g->ranges_.end(), it.ranges.begin(), it.ranges.end());
          }
          g->elements_.push_back(e);
        }
        Grammar::Element end;
        end.kind = a + 1 < alts.size() ? Grammar::Element::Kind::Alt : Grammar::Element::Kind::End;
        g->elements_.push_back(end);
      }
    }
    return g;
  }
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::string_view root) {
  return GbnfParser(gbnf).parse(root);
}

bool Grammar::matches(const Element& e, uint32_t cp) const {
  bool in = false;
  for (uint32_t i = 0; i < e.count && !in; ++i) in = cp >= ranges_[e.value + i].lo && cp <= ranges_[e.value + i].hi;
  return in != e.negated;
}

bool Grammar::may_match(const Element& e, uint32_t lo, uint32_t hi) const {
  if (!e.negated) {
    for (uint32_t i = 0; i < e.count; ++i)
      if (ranges_[e.value + i].lo <= hi && ranges_[e.value + i].hi >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range.
  std::vector<Range> rs(ranges_.begin() + e.value, ranges_.begin() + e.value + e.count);
  std::sort(rs.begin(), rs.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  uint32_t next = lo;  // the smallest candidate not yet excluded
  for (const Range& r : rs) {
    if (r.lo > next) break;
    if (r.hi >= next) {
      if (r.hi >= hi) return false;
      next = r.hi + 1;
    }
  }
  return next <= hi;
}

}  // namespace tessera
