// Every token's bytes in a trie (grammar.h), so that a grammar state's mask is one walk
// that drops whole subtrees at the first byte the grammar refuses.
#include <algorithm>
#include <numeric>

#include "tessera/grammar.h"
#include "tessera/tokenizer.h"

namespace tessera {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& shown_control) {
  const int32_t n = tokenizer.n_vocab();
  pieces_.reserve(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    const bool shown = std::find(shown_control.begin(), shown_control.end(), id) != shown_control.end();
    pieces_.push_back(tokenizer.token_to_piece(id, shown));
    if (tokenizer.is_end_of_generation(id)) eog_.push_back(id);
  }
  build();
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation)
    : pieces_(std::move(pieces)), eog_(std::move(end_of_generation)) {
  for (int32_t id : eog_)
    if (id < 0 || size_t(id) >= pieces_.size()) throw Error("TokenVocabulary: end-of-generation id out of range");
  build();
}

TokenVocabulary::~TokenVocabulary() = default;

// Sorted by bytes, the tokens under one trie node are a contiguous range: a node's
// children are laid out together, then each child's subtree is built in turn.
void TokenVocabulary::build() {
  std::vector<int32_t> ids;
  std::vector<bool> is_eog(pieces_.size(), false);
  for (int32_t id : eog_) is_eog[size_t(id)] = true;
  for (int32_t id = 0; id < int32_t(pieces_.size()); ++id)  // end-of-generation tokens are never text
    if (!pieces_[size_t(id)].empty() && !is_eog[size_t(id)]) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return pieces_[size_t(a)] != pieces_[size_t(b)] ? pieces_[size_t(a)] < pieces_[size_t(b)] : a < b;
  });
  nodes_.assign(1, Node{});
  struct Work {
    uint32_t node;
    size_t begin, end, depth;  // ids[begin, end) share their first `depth` bytes
  };
  std::vector<Work> todo{{0, 0, ids.size(), 0}};
  while (!todo.empty()) {
    const Work w = todo.back();
    todo.pop_back();
    size_t i = w.begin;
    // Tokens whose bytes end here come first in sorted order.
    std::vector<int32_t> here;
    while (i < w.end && pieces_[size_t(ids[i])].size() == w.depth) here.push_back(ids[i++]);
    if (!here.empty()) {
      nodes_[w.node].token = here[0];
      nodes_[w.node].more_tokens = uint32_t(extra_.size());
      nodes_[w.node].n_more = uint32_t(here.size() - 1);
      extra_.insert(extra_.end(), here.begin() + 1, here.end());
    }
    nodes_[w.node].first_child = uint32_t(edges_.size());
    while (i < w.end) {
      const unsigned char b = static_cast<unsigned char>(pieces_[size_t(ids[i])][w.depth]);
      size_t j = i;
      while (j < w.end && static_cast<unsigned char>(pieces_[size_t(ids[j])][w.depth]) == b) ++j;
      const uint32_t child = uint32_t(nodes_.size());
      nodes_.push_back(Node{});
      edges_.push_back(Edge{b, child});
      todo.push_back({child, i, j, w.depth + 1});
      i = j;
    }
    nodes_[w.node].n_children = uint32_t(edges_.size()) - nodes_[w.node].first_child;
  }
}

}  // namespace tessera
