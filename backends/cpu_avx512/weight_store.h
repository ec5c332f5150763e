// cpu_avx512's prepared weights: the row-interleaved copies its tile kernels read
// (repacked at load, one per expert of a 3-D expert tensor), and the matrices copied
// as they are into huge pages. A copy is found by the weight's address and shape and
// used only while the weight's bytes still match it (fingerprint), so memory that is
// freed and reused for another tensor never picks up a stale copy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "tessera/pool_ref.h"
#include "tessera/tensor.h"

namespace tessera::cpu_avx512 {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

// On the pool when there is more than one executor and more than one item; f(b, e)
// covers items [b, e).
template <typename F>
void parallel_for(PoolRef pool, int64_t n, F&& f) {
  if (pool && pool.executor_count() > 1 && n > 1) {
    auto fn = f;
    pool.parallel_for(n, std::move(fn));
  } else if (n > 0) {
    f(int64_t(0), n);
  }
}

// A cheap fingerprint of a weight's bytes (shape plus 64 bytes of its first, middle
// and last rows; of the first, middle and last expert for a 3-D expert tensor). It
// runs before every product, so it mixes 8-byte words (a byte-wise hash showed in
// decode profiles, docs/performance.md).
uint64_t fingerprint(const Tensor& w);

// One weight's repacked copy.
struct Repacked {
  DType type = DType::F32;
  int64_t K = 0, N = 0, E = 1;  // E: experts of a 3-D [K, N, E] tensor
  size_t wstride = 0;
  size_t estride = 0;  // bytes between experts in the tensor
  size_t ebytes = 0;   // bytes of one expert's repacked copy
  uint64_t fp = 0;
  std::unique_ptr<uint8_t[], AlignedFree> data;
};

class WeightStore {
 public:
  // `repack` false: weights stay as the file has them (no copies at all).
  WeightStore(PoolRef pool, bool repack) : pool_(pool), repack_(repack) {}

  // Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K weights get a row-interleaved copy (see kernels.h); a 3-D
  // expert tensor [K, N, E] (MatMulId) gets one per expert, back to back. The tensor
  // itself is left untouched, so every other reader (GetRows of a tied embedding,
  // another backend, the reference) still sees the GGUF layout. The other types the
  // kernels take are copied to huge pages (copy_to_streamed_pages).
  void prepare(Tensor& w);
  // The repacked copy made for w's address and shape, without checking that the
  // bytes there are still the ones it was made from (see find).
  const Repacked* lookup(const Tensor& w) const;
  // The repacked copy of w if its fingerprint still matches; a stale one is dropped.
  const Repacked* find(const Tensor& w);
  // Frees a repacked copy, after the workers stopped reading it (idle prefetch).
  void drop(const void* key);
  // The bytes a product reading w streams: its repacked copy, or none (empty).
  std::span<const std::byte> repacked_bytes(const Tensor& w);
  // Whether this store repacks at all, and whether w has a layout the tiles take.
  bool repacks() const { return repack_; }
  static bool repackable(const Tensor& w);

 private:
  void copy_to_streamed_pages(Tensor& w);

  PoolRef pool_;
  bool repack_ = true;
  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> copies_;  // copy_to_streamed_pages
  std::unordered_map<const void*, Repacked> repacked_;
};

}  // namespace tessera::cpu_avx512
