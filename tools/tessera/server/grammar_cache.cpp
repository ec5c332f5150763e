#include "server/grammar_cache.h"

namespace tessera::server {

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity)
    : vocab_(std::move(vocabulary)), capacity_(capacity) {}

std::shared_ptr<GrammarConstraint> GrammarCache::get(const std::string& gbnf) {
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == gbnf) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().second;
      }
  }
  // Parsed outside the lock: a large grammar does not hold up other requests.
  auto constraint = std::make_shared<GrammarConstraint>(Grammar::parse(gbnf), vocab_);
  std::lock_guard lock(mu_);
  entries_.emplace_front(gbnf, constraint);
  while (entries_.size() > capacity_) entries_.pop_back();
  return constraint;
}

size_t GrammarCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace tessera::server
