// Compiled grammars of a served model, by their GBNF text: requests that repeat a
// schema (as clients of structured output do) share its automaton and its cached
// token masks. Thread-safe; keeps the most recently used ones.
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "tessera/grammar.h"

namespace tessera::server {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity = 32);
  // The constraint for a grammar; throws GrammarError if it does not parse.
  std::shared_ptr<GrammarConstraint> get(const std::string& gbnf);
  size_t size() const;

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<GrammarConstraint>>> entries_;  // most recent first
};

}  // namespace tessera::server
