// Private: small open-addressing hash tables for the tokenizer's hot lookups
// (token text -> id, merge pair -> rank/result). Linear probing, power-of-two size,
// built once and read-only afterwards; far fewer cache misses than node maps.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tok {

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a 64 with a final mix
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline size_t table_size_for(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

// Maps strings (owned elsewhere: `texts[id]`) to ids; the first insertion of a text wins.
class TextIndex {
 public:
  void build(const std::vector<std::string>& texts) {
    texts_ = &texts;
    slots_.assign(table_size_for(texts.size()), Slot{0, -1});
    mask_ = slots_.size() - 1;
    for (size_t i = 0; i < texts.size(); ++i) {
      const uint64_t h = hash_bytes(texts[i]);
      size_t p = h & mask_;
      for (;; p = (p + 1) & mask_) {
        Slot& s = slots_[p];
        if (s.id < 0) {
          s = Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(i)};
          break;
        }
        if (s.tag == static_cast<uint32_t>(h >> 32) && texts[s.id] == texts[i]) break;  // duplicate
      }
    }
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(key);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t p = h & mask_;; p = (p + 1) & mask_) {
      const Slot& s = slots_[p];
      if (s.id < 0) return -1;
      if (s.tag == tag && (*texts_)[s.id] == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;
    int32_t id;
  };
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Maps a token pair to (rank, merged id); the first insertion of a pair wins.
class PairIndex {
 public:
  struct Value {
    int32_t rank = -1;
    int32_t result = -1;
  };
  void reserve(size_t n) {
    slots_.assign(table_size_for(n), Slot{});
    mask_ = slots_.size() - 1;
  }
  void insert(uint64_t key, Value v) {
    for (size_t p = mix64(key) & mask_;; p = (p + 1) & mask_) {
      Slot& s = slots_[p];
      if (s.v.rank < 0) {
        s = Slot{key, v};
        return;
      }
      if (s.key == key) return;
    }
  }
  const Value* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t p = mix64(key) & mask_;; p = (p + 1) & mask_) {
      const Slot& s = slots_[p];
      if (s.v.rank < 0) return nullptr;
      if (s.key == key) return &s.v;
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Value v;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace tessera::tok
