#include "weight_store.h"

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "tessera/error.h"
#include "tessera/membw.h"

namespace tessera::cpu_avx512 {

uint64_t fingerprint(const Tensor& w) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v;
      std::memcpy(&v, b + i, 8);
      h = (h ^ v) * 1099511628211ull;
      h ^= h >> 29;  // so every bit of v reaches the low bits of later words' products
    }
    for (; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2];
  mix(&K, sizeof K);
  mix(&N, sizeof N);
  mix(&w.nb[1], sizeof w.nb[1]);
  if (E != 1) {
    mix(&E, sizeof E);
    mix(&w.nb[2], sizeof w.nb[2]);
  }
  const size_t n = std::min<size_t>(64, row_bytes(w.type, K));
  for (int64_t e : {int64_t(0), E / 2, E - 1}) {
    const char* base = static_cast<const char*>(w.data) + e * int64_t(w.nb[2]);
    for (int64_t r : {int64_t(0), N / 2, N - 1}) mix(base + r * int64_t(w.nb[1]), n);
    if (E == 1) break;
  }
  return h;
}

void WeightStore::prepare(Tensor& w) {
  if (repack_ && w.data && !kern::repack_supported(w.type) && kern::matmul_type_supported(w.type)) {
    copy_to_streamed_pages(w);
    return;
  }
  if (!repack_ || !w.data || !repackable(w)) return;
  Repacked r;
  r.type = w.type;
  r.K = w.ne[0];
  r.N = w.ne[1];
  r.E = w.ne[2];
  r.wstride = w.nb[1];
  r.estride = r.E > 1 ? w.nb[2] : 0;
  r.ebytes = kern::repacked_bytes(w.type, r.K, r.N);
  const size_t bytes = r.ebytes * size_t(r.E);
  void* p = alloc_streamed(bytes);  // streamed once per token: huge pages
  if (!p) throw Error("cpu_avx512: out of memory repacking '" + w.name + "'");
  r.data.reset(static_cast<uint8_t*>(p));
  const int64_t tiles = (r.N + kern::kTileRows - 1) / kern::kTileRows;
  const auto* src = static_cast<const uint8_t*>(w.data);
  uint8_t* out = r.data.get();
  // Items = (expert, tile); each call covers one expert's part of [i0, i1).
  parallel_for(pool_, tiles * r.E, [&](int64_t i0, int64_t i1) {
    while (i0 < i1) {
      const int64_t e = i0 / tiles, t0 = i0 % tiles, t1 = std::min(tiles, t0 + (i1 - i0));
      kern::repack(r.type, src + size_t(e) * r.estride, int64_t(w.nb[1]), r.K, r.N, out + size_t(e) * r.ebytes, t0,
                   t1);
      i0 += t1 - t0;
    }
  });
  r.fp = fingerprint(w);
  if (repacked_.count(w.data)) drop(w.data);
  repacked_[w.data] = std::move(r);
}

// A matrix the kernels read in its own layout (the format-kernel types, F16, BF16, F32):
// copied as it is into huge pages, which stream faster than a model file's 4 KiB
// page-cache pages, and the tensor points at the copy (the same layout, so every
// reader may use it; the engine hands the original's pages back). 2-D contiguous
// matrices only: a 3-D expert tensor may be streamed from disk, and a vector is not
// streamed.
void WeightStore::copy_to_streamed_pages(Tensor& w) {
  if (w.ne[1] < 2 || w.ne[2] != 1 || w.ne[3] != 1 || !w.is_contiguous()) return;
  const size_t bytes = w.nbytes();
  void* p = alloc_streamed(bytes);
  if (!p) throw Error("cpu_avx512: out of memory copying '" + w.name + "'");
  std::unique_ptr<uint8_t[], AlignedFree> copy(static_cast<uint8_t*>(p));
  const auto* src = static_cast<const uint8_t*>(w.data);
  constexpr int64_t kChunk = 1 << 20;
  parallel_for(pool_, int64_t((bytes + kChunk - 1) / kChunk), [&](int64_t b, int64_t e) {
    const size_t lo = size_t(b) * kChunk, hi = std::min(bytes, size_t(e) * kChunk);
    std::memcpy(copy.get() + lo, src + lo, hi - lo);
  });
  w.data = copy.get();
  copies_.push_back(std::move(copy));
}

std::span<const std::byte> WeightStore::repacked_bytes(const Tensor& w) {
  if (const Repacked* r = find(w)) return {reinterpret_cast<const std::byte*>(r->data.get()), r->ebytes * size_t(r->E)};
  return {};
}

bool WeightStore::repackable(const Tensor& w) {
  return kern::repack_supported(w.type) && w.ne[2] >= 1 && w.ne[3] == 1 && w.ne[1] >= 1 &&
         w.ne[0] % dtype_traits(w.type).block_elems == 0 && w.nb[1] >= row_bytes(w.type, w.ne[0]) &&
         (w.ne[2] == 1 || w.nb[2] >= w.nb[1] * size_t(w.ne[1]));
}

const Repacked* WeightStore::lookup(const Tensor& w) const {
  auto it = repacked_.find(w.data);
  if (it == repacked_.end()) return nullptr;
  const Repacked& r = it->second;
  // Another view of the same memory (e.g. the first rows of the weight): not ours.
  if (r.type != w.type || r.K != w.ne[0] || r.N != w.ne[1] || r.wstride != w.nb[1] || r.E != w.ne[2] ||
      w.ne[3] != 1 || (r.E > 1 && r.estride != w.nb[2]))
    return nullptr;
  return &r;
}

void WeightStore::drop(const void* key) {
  if (pool_) pool_.cancel_idle_prefetch();
  repacked_.erase(key);
}

const Repacked* WeightStore::find(const Tensor& w) {
  const Repacked* r = lookup(w);
  if (r && r->fp != fingerprint(w)) {
    drop(w.data);  // stale: the memory now holds another tensor
    return nullptr;
  }
  return r;
}

}  // namespace tessera::cpu_avx512
