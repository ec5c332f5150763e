// One pool of KV pages (see page_pool.h).
#include "tessera/page_pool.h"

#include <algorithm>

#include "tessera/error.h"

namespace tessera {

PagePool::PagePool(int n_pages, int page_tokens)
    : page_tokens_(size_t(page_tokens)),
      refcount_(size_t(n_pages), 0),
      key_(size_t(n_pages), 0),
      key_tokens_(size_t(n_pages) * size_t(page_tokens), 0),
      lru_prev_(size_t(n_pages), -1),
      lru_next_(size_t(n_pages), -1) {
  free_list_.reserve(size_t(n_pages));
  // Pop from the back: page 0 is handed out first.
  for (int32_t i = n_pages - 1; i >= 0; --i) free_list_.push_back(i);
}

int32_t PagePool::take() {
  int32_t p;
  if (!free_list_.empty()) {
    p = free_list_.back();
    free_list_.pop_back();
  } else {
    if (lru_head_ < 0) throw Error("KvCache: out of pages");
    p = lru_head_;
    lru_remove(p);
    key_to_page_.erase(key_[size_t(p)]);
    key_[size_t(p)] = 0;
  }
  refcount_[size_t(p)] = 1;
  return p;
}

void PagePool::retain(int32_t page) {
  if (refcount_[size_t(page)]++ == 0) lru_remove(page);
}

void PagePool::release(int32_t page) {
  if (--refcount_[size_t(page)] != 0) return;
  if (key_[size_t(page)] != 0)
    lru_push_back(page);
  else
    free_list_.push_back(page);
}

std::span<const int32_t> PagePool::key_tokens(int32_t page) const {
  return {key_tokens_.data() + size_t(page) * page_tokens_, page_tokens_};
}

bool PagePool::add_key(int32_t page, Key key, std::span<const int32_t> tokens) {
  if (key_[size_t(page)] != 0 || key_to_page_.count(key)) return false;
  key_to_page_.emplace(key, page);
  key_[size_t(page)] = key;
  std::copy(tokens.begin(), tokens.end(), key_tokens_.begin() + ptrdiff_t(size_t(page) * page_tokens_));
  return true;
}

void PagePool::drop_key(int32_t page) {
  key_to_page_.erase(key_[size_t(page)]);
  key_[size_t(page)] = 0;
}

int32_t PagePool::find(Key key, std::span<const int32_t> tokens) const {
  auto it = key_to_page_.find(key);
  if (it == key_to_page_.end() || tokens.size() != page_tokens_) return -1;
  const auto ids = key_tokens(it->second);
  return std::equal(tokens.begin(), tokens.end(), ids.begin()) ? it->second : -1;
}

void PagePool::clear_keys() {
  for (int32_t p = lru_head_; p >= 0; p = lru_next_[size_t(p)]) free_list_.push_back(p);
  std::fill(lru_prev_.begin(), lru_prev_.end(), -1);
  std::fill(lru_next_.begin(), lru_next_.end(), -1);
  lru_head_ = lru_tail_ = -1;
  cached_count_ = 0;
  std::fill(key_.begin(), key_.end(), Key(0));
  key_to_page_.clear();
}

void PagePool::lru_push_back(int32_t page) {
  lru_prev_[size_t(page)] = lru_tail_;
  lru_next_[size_t(page)] = -1;
  if (lru_tail_ >= 0)
    lru_next_[size_t(lru_tail_)] = page;
  else
    lru_head_ = page;
  lru_tail_ = page;
  ++cached_count_;
}

void PagePool::lru_remove(int32_t page) {
  const int32_t prev = lru_prev_[size_t(page)], next = lru_next_[size_t(page)];
  (prev >= 0 ? lru_next_[size_t(prev)] : lru_head_) = next;
  (next >= 0 ? lru_prev_[size_t(next)] : lru_tail_) = prev;
  lru_prev_[size_t(page)] = lru_next_[size_t(page)] = -1;
  --cached_count_;
}

void PagePool::check(std::span<const int64_t> uses, const std::string& name) const {
  auto fail = [&](const std::string& what) { throw Error("KvCache::check_invariants: " + name + ": " + what); };
  const size_t n = refcount_.size();
  for (size_t p = 0; p < n; ++p)
    if (refcount_[p] != uses[p])
      fail("page " + std::to_string(p) + " has refcount " + std::to_string(refcount_[p]) + " but " +
           std::to_string(uses[p]) + " block-table entries");

  std::vector<int> in_free(n, 0), in_lru(n, 0);
  for (int32_t p : free_list_) {
    if (p < 0 || size_t(p) >= n) fail("free list holds page " + std::to_string(p));
    ++in_free[size_t(p)];
  }
  size_t count = 0;
  for (int32_t p = lru_head_, prev = -1; p >= 0; prev = p, p = lru_next_[size_t(p)]) {
    if (size_t(p) >= n || count >= n) fail("LRU list is corrupt at page " + std::to_string(p));
    if (lru_prev_[size_t(p)] != prev) fail("LRU list has a wrong back link at page " + std::to_string(p));
    if (lru_next_[size_t(p)] < 0 && lru_tail_ != p) fail("LRU list tail is not its last page");
    ++in_lru[size_t(p)];
    ++count;
  }
  if (lru_head_ < 0 && lru_tail_ >= 0) fail("LRU list is empty but has a tail");
  if (int(count) != cached_count_)
    fail("LRU list holds " + std::to_string(count) + " pages, cached count is " + std::to_string(cached_count_));

  size_t keyed = 0;
  for (size_t p = 0; p < n; ++p) {
    const std::string page = "page " + std::to_string(p);
    const bool has_key = key_[p] != 0;
    keyed += has_key;
    if (refcount_[p] < 0) fail(page + " has a negative refcount");
    if (refcount_[p] > 0) {
      if (in_free[p] || in_lru[p]) fail(page + " is in use but on the free or LRU list");
    } else if (has_key) {
      if (in_lru[p] != 1 || in_free[p]) fail(page + " is cached but not on the LRU list exactly once");
    } else if (in_free[p] != 1 || in_lru[p]) {
      fail(page + " is free but not on the free list exactly once");
    }
    if (has_key) {
      auto it = key_to_page_.find(key_[p]);
      if (it == key_to_page_.end() || it->second != int32_t(p)) fail(page + "'s key maps to another page");
    }
  }
  if (keyed != key_to_page_.size())
    fail("the key map has " + std::to_string(key_to_page_.size()) + " entries for " + std::to_string(keyed) +
         " keyed pages");
}

}  // namespace tessera
