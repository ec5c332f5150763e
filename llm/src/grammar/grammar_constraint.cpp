// GrammarConstraint and GrammarMatcher (grammar.h): a shared automaton behind a lock,
// and one sequence's state in it.
#include <mutex>

#include "grammar/grammar_automaton.h"
#include "tessera/grammar.h"

namespace tessera {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocab_(std::move(vocabulary)) {
  if (!grammar_ || !vocab_) throw Error("GrammarConstraint: a grammar and a vocabulary are needed");
  automaton_ = std::make_unique<GrammarAutomaton>(*grammar_, *vocab_);
}

GrammarConstraint::~GrammarConstraint() = default;

GrammarConstraint::Stats GrammarConstraint::stats() const {
  std::lock_guard lock(mu_);
  return {automaton_->n_states(), automaton_->mask_hits, automaton_->mask_misses};
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarConstraint> constraint) : c_(std::move(constraint)) {
  if (!c_) throw Error("GrammarMatcher: no constraint");
  std::lock_guard lock(c_->mu_);
  state_ = c_->automaton_->initial();
}

std::span<const uint64_t> GrammarMatcher::allowed() {
  std::lock_guard lock(c_->mu_);
  bool continues = false;
  mask_ = c_->automaton_->mask(state_, continues);  // a copy: the cache may drop it
  return mask_;
}

bool GrammarMatcher::accepts(int32_t token) {
  std::lock_guard lock(c_->mu_);
  return c_->automaton_->step_token(state_, token) != GrammarAutomaton::kDead;
}

void GrammarMatcher::accept(int32_t token) {
  std::lock_guard lock(c_->mu_);
  const uint32_t next = c_->automaton_->step_token(state_, token);
  if (next == GrammarAutomaton::kDead)
    throw GrammarError("grammar: token " + std::to_string(token) + " is not allowed here");
  state_ = next;
}

bool GrammarMatcher::complete() const {
  std::lock_guard lock(c_->mu_);
  return c_->automaton_->complete(state_);
}

bool GrammarMatcher::exhausted() {
  std::lock_guard lock(c_->mu_);
  if (!c_->automaton_->complete(state_)) return false;
  bool continues = false;
  c_->automaton_->mask(state_, continues);
  return !continues;
}

}  // namespace tessera
