// Grammars that constrain sampling (structured output). A Grammar is a context-free
// grammar over Unicode code points, written in llama.cpp's GBNF:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"     # rules, alternatives with |
//   pair   ::= [a-z]+ ":" ws [0-9]{1,3}           # [ranges], [^negated], ., "literals"
//   ws     ::= [ \t\n]*                           # ( ) * + ? {m} {m,} {m,n}
//
// A GrammarConstraint binds a grammar to a vocabulary (each token's bytes) and answers
// which tokens may come next in a given state, as a bit mask; masks are cached per
// state and shared by every sequence using the constraint. A GrammarMatcher is one
// sequence's position in the grammar.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/error.h"

namespace tessera {

class Tokenizer;

// A grammar that cannot be parsed or used (the message names the line and column, or
// the rule). Requests with such a grammar are the client's error.
class GrammarError : public Error {
 public:
  using Error::Error;
};

// A GBNF string literal that matches exactly `utf8` (quotes, backslashes and control
// characters escaped), for code that writes grammars.
std::string gbnf_literal(std::string_view utf8);

class Grammar {
 public:
  // One element of an alternative. Alternatives of a rule are stored one after the
  // other, each ended by End (the rule's last) or Alt (another follows).
  struct Element {
    enum class Kind : uint8_t { End, Alt, RuleRef, Chars };
    Kind kind = Kind::End;
    bool negated = false;  // Chars: match what is NOT in the ranges
    uint32_t value = 0;    // RuleRef: the rule; Chars: first index into ranges()
    uint32_t count = 0;    // Chars: number of ranges
  };
  struct Range {
    uint32_t lo, hi;  // inclusive code points
  };

  // Parses GBNF text; `root` names the start rule. Throws GrammarError for a syntax
  // error, an undefined rule, a missing root or left recursion (which the matcher
  // cannot run).
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, std::string_view root = "root");

  uint32_t root() const { return root_; }
  size_t n_rules() const { return rule_start_.size(); }
  // The index of the first element of rule r's first alternative.
  uint32_t rule_start(uint32_t r) const { return rule_start_[r]; }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<Range>& ranges() const { return ranges_; }
  bool matches(const Element& chars, uint32_t code_point) const;
  // Whether some code point in [lo, hi] matches (for a partial UTF-8 sequence).
  bool may_match(const Element& chars, uint32_t lo, uint32_t hi) const;

 private:
  friend class GbnfParser;
  uint32_t root_ = 0;
  std::vector<uint32_t> rule_start_;
  std::vector<std::string> names_;
  std::vector<Element> elements_;
  std::vector<Range> ranges_;
};

// The bytes of every token of a vocabulary, in a trie, and which tokens end a
// generation. Built once per tokenizer. Tokens that decode to nothing (control
// tokens) can never match a grammar, except those in `shown_control`, which count as
// their text (a chat format's markers that the server reads in the answer, such as
// harmony's <|channel|>); end-of-generation tokens are allowed exactly where the
// grammar may end.
class TokenVocabulary {
 public:
  explicit TokenVocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& shown_control = {});
  // For tests: the pieces and end-of-generation ids given directly.
  TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation);
  ~TokenVocabulary();
  int32_t size() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  const std::vector<int32_t>& end_of_generation() const { return eog_; }

  struct Node {
    uint32_t first_child = 0, n_children = 0;  // into children()
    int32_t token = -1;                         // the token whose bytes end here, or -1
    uint32_t more_tokens = 0;                   // into extra_tokens(): other tokens with the same bytes
    uint32_t n_more = 0;
  };
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes()[0] is the root
  const std::vector<Edge>& children() const { return edges_; }
  const std::vector<int32_t>& extra_tokens() const { return extra_; }

 private:
  void build();
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> extra_;
};

// Which tokens are allowed: bit i of word i / 64 for token i.
using TokenMask = std::vector<uint64_t>;
inline bool token_allowed(std::span<const uint64_t> mask, int32_t id) {
  return id >= 0 && size_t(id) / 64 < mask.size() && ((mask[size_t(id) / 64] >> (id % 64)) & 1u);
}

class GrammarAutomaton;

// A grammar bound to a vocabulary. Shared by every sequence that uses it: it caches
// the grammar's states, their byte transitions and their token masks. Thread-safe.
class GrammarConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary);
  ~GrammarConstraint();
  const Grammar& grammar() const { return *grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocab_; }
  struct Stats {
    uint64_t states = 0, mask_hits = 0, mask_misses = 0;
  };
  Stats stats() const;
  // A constraint on the same grammar and vocabulary with nothing cached yet.
  std::shared_ptr<GrammarConstraint> fresh() const {
    return std::make_shared<GrammarConstraint>(grammar_, vocab_);
  }

 private:
  friend class GrammarMatcher;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;  // guards the automaton, which grows as states are visited
  std::unique_ptr<GrammarAutomaton> automaton_;
};

// One sequence's position in a constraint's grammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarConstraint> constraint);
  // The tokens that may come next: those whose bytes continue the grammar, and the
  // end-of-generation tokens when the grammar may end here. Valid until the next call.
  std::span<const uint64_t> allowed();
  // Moves past `token`. Throws GrammarError when the grammar does not allow it.
  void accept(int32_t token);
  bool accepts(int32_t token);  // whether accept(token) would succeed
  // The text so far is a whole sentence of the grammar (it may still go on).
  bool complete() const;
  // Nothing can follow: the text is complete and no token can extend it.
  bool exhausted();

 private:
  std::shared_ptr<GrammarConstraint> c_;
  uint32_t state_ = 0;
  TokenMask mask_;  // allowed()'s answer, copied out of the shared cache
};

}  // namespace tessera
