// The bookkeeping of one pool of KV pages: reference counts, the free list, and the
// prefix cache's keyed pages. It knows page ids only; the K/V storage the ids index is
// the KvCache's. A KvCache has one pool for its full-attention layers and, for a model
// with sliding-window layers, a second one for those.
//
// Every page is exactly one of free (refcount 0, no key, on the free list), cached
// (refcount 0, a key, on the LRU list, least recently released first) or in use
// (refcount > 0, with or without a key). take() prefers the free list and otherwise
// evicts the least recently released cached page.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tessera {

class PagePool {
 public:
  using Key = uint64_t;  // 0 is "no key"

  PagePool() = default;
  PagePool(int n_pages, int page_tokens);

  int size() const { return int(refcount_.size()); }
  // A page with refcount 1 (throws when none is free or cached: callers check available()).
  int32_t take();
  // One more reference (a cached page leaves the LRU list).
  void retain(int32_t page);
  // One reference less; at none the page is cached if it has a key, else free.
  void release(int32_t page);
  int refcount(int32_t page) const { return refcount_[size_t(page)]; }
  // Pages take() can hand out: the free list plus the cached pages.
  int available() const { return int(free_list_.size()) + cached_count_; }
  int cached() const { return cached_count_; }

  Key key(int32_t page) const { return key_[size_t(page)]; }
  // The page_tokens token ids a keyed page was registered with.
  std::span<const int32_t> key_tokens(int32_t page) const;
  // Registers page under key with its tokens; false, changing nothing, if the page has
  // a key already or the key names another page.
  bool add_key(int32_t page, Key key, std::span<const int32_t> tokens);
  // Forgets the key of an in-use page (it is about to be written).
  void drop_key(int32_t page);
  // The page registered under key whose tokens equal `tokens`, or -1.
  int32_t find(Key key, std::span<const int32_t> tokens) const;
  // Forgets every key; cached pages go back to the free list.
  void clear_keys();

  // Throws an Error naming the first broken invariant, given how many block-table
  // entries hold each page. `name` says which pool (for the message).
  void check(std::span<const int64_t> uses, const std::string& name) const;

 private:
  void lru_push_back(int32_t page);
  void lru_remove(int32_t page);

  size_t page_tokens_ = 0;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_list_;
  std::vector<Key> key_;
  std::vector<int32_t> key_tokens_;  // page_tokens ids per page
  std::unordered_map<Key, int32_t> key_to_page_;
  std::vector<int32_t> lru_prev_, lru_next_;  // over page ids; -1 ends the list
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int cached_count_ = 0;
};

}  // namespace tessera
