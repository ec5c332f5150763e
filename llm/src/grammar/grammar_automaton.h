// The grammar's states as a lazily built automaton over bytes (behind
// GrammarConstraint). A position in the grammar is a set of stacks, as in a
// pushdown recogniser: each stack lists where to go on in the rules entered so far,
// its top a character set to match next. Stacks are hash-consed nodes (position,
// parent), so equal stacks are one id and a set of stacks is a short sorted list; a
// state is that list and any partial UTF-8 code point. Byte transitions are memoised
// per state, so walking the vocabulary's trie costs one table lookup per trie node
// once a state's neighbourhood is known, and a state's token mask is computed once.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "tessera/grammar.h"

namespace tessera {

class GrammarAutomaton {
 public:
  static constexpr uint32_t kDead = 0xFFFFFFFFu;
  GrammarAutomaton(const Grammar& grammar, const TokenVocabulary& vocab);

  uint32_t initial() const { return initial_; }
  // The state after one more byte, or kDead.
  uint32_t step(uint32_t state, uint8_t byte);
  // The state after a token's bytes, or kDead (end-of-generation tokens: the same
  // state when it is complete).
  uint32_t step_token(uint32_t state, int32_t token);
  bool complete(uint32_t state) const { return states_[state].complete; }
  // The tokens allowed after `state`; `continues` says whether any of them is not an
  // end-of-generation token.
  const TokenMask& mask(uint32_t state, bool& continues);

  size_t n_states() const { return states_.size(); }
  uint64_t mask_hits = 0, mask_misses = 0;

 private:
  static constexpr uint32_t kEmptyStack = 0xFFFFFFFEu;
  struct State {
    std::vector<uint32_t> stacks;  // sorted stack ids (kEmptyStack: the grammar may end)
    uint32_t partial = 0;          // bits of an unfinished UTF-8 code point
    uint8_t need = 0;              // its continuation bytes still to come
    uint8_t length = 0;            // its total length in bytes
    bool complete = false;
    std::unique_ptr<std::array<uint32_t, 256>> next;  // memoised step(); kUnknown until asked
  };
  struct Mask {
    TokenMask bits;
    bool continues = false;
  };

  uint32_t node(uint32_t pos, uint32_t parent);
  void expand(uint32_t stack, std::vector<uint32_t>& out, int depth);
  uint32_t intern(std::vector<uint32_t> stacks, uint32_t partial, uint8_t need, uint8_t length);
  uint32_t advance(const std::vector<uint32_t>& stacks, uint32_t code_point);
  uint32_t compute_step(uint32_t state, uint8_t byte);
  bool feasible(const std::vector<uint32_t>& stacks, uint32_t partial, uint8_t need, uint8_t length) const;
  void compute_mask(uint32_t state, Mask& out);

  const Grammar& g_;
  const TokenVocabulary& vocab_;
  struct Node {
    uint32_t pos, parent;
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> state_ids_;  // hash -> candidate ids
  uint32_t initial_ = kDead;
  std::unordered_map<uint32_t, Mask> masks_;
  size_t mask_bytes_ = 0;
};

}  // namespace tessera
