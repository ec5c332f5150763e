#include "grammar/grammar_automaton.h"

#include <algorithm>
#include <string>

namespace tessera {

namespace {

using Kind = Grammar::Element::Kind;
constexpr uint32_t kUnknown = 0xFFFFFFFDu;
// Bounds that turn a pathological grammar into an error instead of exhausting memory.
constexpr int kMaxExpansionDepth = 4096;
constexpr size_t kMaxStacksPerState = 16384;
constexpr size_t kMaxStates = 1u << 20;
constexpr size_t kMaskCacheBytes = size_t(64) << 20;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

GrammarAutomaton::GrammarAutomaton(const Grammar& grammar, const TokenVocabulary& vocab) : g_(grammar), vocab_(vocab) {
  std::vector<uint32_t> stacks;
  // The root rule, entered as a reference would enter it: one stack per alternative.
  for (uint32_t pos = g_.rule_start(g_.root());;) {
    expand(node(pos, kEmptyStack), stacks, 0);
    while (g_.elements()[pos].kind != Kind::End && g_.elements()[pos].kind != Kind::Alt) ++pos;
    if (g_.elements()[pos].kind == Kind::End) break;
    ++pos;
  }
  initial_ = intern(std::move(stacks), 0, 0, 0);
  if (initial_ == kDead) throw GrammarError("grammar: the start rule matches nothing");
}

uint32_t GrammarAutomaton::node(uint32_t pos, uint32_t parent) {
  const uint64_t key = (uint64_t(pos) << 32) | parent;
  auto [it, fresh] = node_ids_.emplace(key, uint32_t(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

// Appends the stacks `stack` stands for once every rule reference on top is entered
// and every finished alternative left: each has a character set on top, or is empty.
void GrammarAutomaton::expand(uint32_t stack, std::vector<uint32_t>& out, int depth) {
  if (depth > kMaxExpansionDepth) throw GrammarError("grammar: rules nest too deeply to match");
  if (stack == kEmptyStack) {
    out.push_back(kEmptyStack);
    return;
  }
  const Node n = nodes_[stack];
  const Grammar::Element& e = g_.elements()[n.pos];
  switch (e.kind) {
    case Kind::End:
    case Kind::Alt:
      expand(n.parent, out, depth + 1);
      return;
    case Kind::Chars:
      out.push_back(stack);
      return;
    case Kind::RuleRef: {
      // What follows the reference; a reference that ends its alternative continues
      // straight with the parent, so right recursion does not deepen the stack.
      const Kind after = g_.elements()[n.pos + 1].kind;
      const uint32_t cont = after == Kind::End || after == Kind::Alt ? n.parent : node(n.pos + 1, n.parent);
      for (uint32_t pos = g_.rule_start(e.value);;) {
        expand(node(pos, cont), out, depth + 1);
        while (g_.elements()[pos].kind != Kind::End && g_.elements()[pos].kind != Kind::Alt) ++pos;
        if (g_.elements()[pos].kind == Kind::End) break;
        ++pos;
      }
      return;
    }
  }
}

uint32_t GrammarAutomaton::intern(std::vector<uint32_t> stacks, uint32_t partial, uint8_t need, uint8_t length) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  if (stacks.size() > kMaxStacksPerState)
    throw GrammarError("grammar: too ambiguous to match (more than " + std::to_string(kMaxStacksPerState) +
                       " parses at once)");
  uint64_t h = mix(partial, uint64_t(need) << 8 | length);
  for (uint32_t s : stacks) h = mix(h, s);
  std::vector<uint32_t>& bucket = state_ids_[h];
  for (uint32_t id : bucket) {
    const State& s = states_[id];
    if (s.partial == partial && s.need == need && s.length == length && s.stacks == stacks) return id;
  }
  if (states_.size() >= kMaxStates) throw GrammarError("grammar: too many states to match");
  State s;
  s.complete = need == 0 && stacks.back() == kEmptyStack;
  s.stacks = std::move(stacks);
  s.partial = partial;
  s.need = need;
  s.length = length;
  states_.push_back(std::move(s));
  bucket.push_back(uint32_t(states_.size() - 1));
  return uint32_t(states_.size() - 1);
}

uint32_t GrammarAutomaton::advance(const std::vector<uint32_t>& stacks, uint32_t cp) {
  std::vector<uint32_t> out;
  for (uint32_t s : stacks) {
    if (s == kEmptyStack) continue;
    const Node n = nodes_[s];
    if (g_.matches(g_.elements()[n.pos], cp)) expand(node(n.pos + 1, n.parent), out, 0);
  }
  return intern(std::move(out), 0, 0, 0);
}

// Whether some stack can match a code point that starts with the given UTF-8 bytes.
bool GrammarAutomaton::feasible(const std::vector<uint32_t>& stacks, uint32_t partial, uint8_t need,
                                uint8_t length) const {
  uint32_t lo = partial << (6 * need);
  uint32_t hi = lo | ((1u << (6 * need)) - 1);
  const uint32_t min_cp = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
  lo = std::max(lo, min_cp);
  hi = std::min(hi, 0x10FFFFu);
  if (lo > hi) return false;
  // Surrogates (U+D800-U+DFFF) are not characters: a prefix that can only end in one
  // is a dead end, however the grammar's classes are written.
  const uint32_t parts[2][2] = {{lo, std::min(hi, 0xD7FFu)}, {std::max(lo, 0xE000u), hi}};
  for (uint32_t s : stacks) {
    if (s == kEmptyStack) continue;
    for (const auto& p : parts)
      if (p[0] <= p[1] && g_.may_match(g_.elements()[nodes_[s].pos], p[0], p[1])) return true;
  }
  return false;
}

uint32_t GrammarAutomaton::compute_step(uint32_t state, uint8_t b) {
  const std::vector<uint32_t> stacks = states_[state].stacks;
  uint32_t partial = states_[state].partial;
  uint8_t need = states_[state].need, length = states_[state].length;
  if (need == 0) {
    if (b < 0x80) return advance(stacks, b);
    if (b >= 0xC2 && b <= 0xDF) {
      partial = b & 0x1Fu, need = 1, length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      partial = b & 0x0Fu, need = 2, length = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
      partial = b & 0x07u, need = 3, length = 4;
    } else {
      return kDead;  // not a UTF-8 lead byte
    }
  } else {
    if ((b & 0xC0) != 0x80) return kDead;
    partial = (partial << 6) | (b & 0x3Fu);
    --need;
    if (need == 0) {
      const uint32_t cp = partial;
      const uint32_t min_cp = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
      if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kDead;
      return advance(stacks, cp);
    }
  }
  if (!feasible(stacks, partial, need, length)) return kDead;
  return intern(stacks, partial, need, length);
}

uint32_t GrammarAutomaton::step(uint32_t state, uint8_t b) {
  if (!states_[state].next) {
    states_[state].next = std::make_unique<std::array<uint32_t, 256>>();
    states_[state].next->fill(kUnknown);
  }
  uint32_t to = (*states_[state].next)[b];
  if (to == kUnknown) {
    to = compute_step(state, b);
    (*states_[state].next)[b] = to;  // states_ may have grown: index again
  }
  return to;
}

uint32_t GrammarAutomaton::step_token(uint32_t state, int32_t token) {
  if (token < 0 || token >= vocab_.size()) return kDead;
  const auto& eog = vocab_.end_of_generation();
  if (std::find(eog.begin(), eog.end(), token) != eog.end()) return complete(state) ? state : kDead;
  const std::string& piece = vocab_.piece(token);
  if (piece.empty()) return kDead;
  for (unsigned char b : piece) {
    state = step(state, b);
    if (state == kDead) return kDead;
  }
  return state;
}

void GrammarAutomaton::compute_mask(uint32_t state, Mask& out) {
  out.bits.assign((size_t(vocab_.size()) + 63) / 64, 0);
  out.continues = false;
  auto allow = [&](int32_t id) {
    out.bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    out.continues = true;
  };
  const auto& nodes = vocab_.nodes();
  const auto& edges = vocab_.children();
  const auto& extra = vocab_.extra_tokens();
  std::vector<std::pair<uint32_t, uint32_t>> todo{{0u, state}};  // (trie node, automaton state)
  while (!todo.empty()) {
    const auto [n, st] = todo.back();
    todo.pop_back();
    const TokenVocabulary::Node& tn = nodes[n];
    for (uint32_t c = tn.first_child; c < tn.first_child + tn.n_children; ++c) {
      const uint32_t next = step(st, edges[c].byte);
      if (next == kDead) continue;
      const TokenVocabulary::Node& child = nodes[edges[c].node];
      if (child.token >= 0) allow(child.token);
      for (uint32_t i = 0; i < child.n_more; ++i) allow(extra[child.more_tokens + i]);
      if (child.n_children) todo.emplace_back(edges[c].node, next);
    }
  }
  if (complete(state))
    for (int32_t id : vocab_.end_of_generation()) out.bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
}

const TokenMask& GrammarAutomaton::mask(uint32_t state, bool& continues) {
  auto it = masks_.find(state);
  if (it != masks_.end()) {
    ++mask_hits;
    continues = it->second.continues;
    return it->second.bits;
  }
  ++mask_misses;
  Mask m;
  compute_mask(state, m);
  const size_t bytes = m.bits.size() * sizeof(uint64_t);
  if (mask_bytes_ + bytes > kMaskCacheBytes) {  // full: start over rather than grow
    masks_.clear();
    mask_bytes_ = 0;
  }
  mask_bytes_ += bytes;
  auto& stored = masks_[state] = std::move(m);
  continues = stored.continues;
  return stored.bits;
}

}  // namespace tessera
