#include "weight_quantize.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/graph.h"
#include "tessera/host_memory.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/quant.h"
#include "weight_uses.h"

namespace tessera {

namespace {

// Weight formats quant::quantize_row writes (Q8_1 and Q8_K are activation-only; Q2_K,
// Q3_K and IQ4_XS have no quantizer), F16/BF16 for halving an F32 checkpoint.
constexpr DType kTargets[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,  DType::Q5_1, DType::IQ4_NL,
                              DType::MXFP4, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16,  DType::BF16};

std::string lower_name(DType t) {
  std::string s(dtype_name(t));
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::span<const DType> quantize_targets() { return kTargets; }

std::string quantize_target_names() {
  std::string s;
  for (DType t : kTargets) s += (s.empty() ? "" : ", ") + lower_name(t);
  return s;
}

namespace detail {

void QuantizedWeights::FreeAligned::operator()(std::byte* p) const { std::free(p); }

void check_quantize_target(DType target) {
  if (std::find(std::begin(kTargets), std::end(kTargets), target) == std::end(kTargets))
    throw Error("cannot quantize weights to " + lower_name(target) + ": the supported types are " +
                quantize_target_names());
}

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// MoE routers pick experts by a top-k of their products: llama.cpp keeps
// `ffn_gate_inp*` in F32 so that the choice follows the float model.
bool is_router(const WeightGroup& g) {
  for (const Tensor* v : g.views)
    if (v->name.find("ffn_gate_inp") != std::string::npos) return true;
  return false;
}

// Rows [r0, r1) of `src` (F32, F16 or BF16, any row strides) quantized into dst
// (contiguous rows of `target`).
void quantize_rows(const Tensor& src, DType target, std::byte* dst, int64_t r0, int64_t r1) {
  const int64_t K = src.ne[0];
  const size_t out_row = row_bytes(target, K);
  std::vector<float> buf(src.type == DType::F32 ? 0 : size_t(K));
  for (int64_t r = r0; r < r1; ++r) {
    const void* row = src.flat_row<const std::byte>(r);
    const float* x = static_cast<const float*>(row);
    if (src.type != DType::F32) {
      quant::dequantize_row(src.type, row, buf.data(), K);
      x = buf.data();
    }
    quant::quantize_row(target, x, dst + size_t(r) * out_row, K);
  }
}

std::string names_of(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 3; ++i) s += (i ? ", " : "") + printable(names[i], 80);
  if (names.size() > 3) s += ", ...";
  return s;
}

}  // namespace

size_t QuantizedWeights::drop_unreferenced(const std::vector<Tensor*>& weights) {
  std::unordered_set<const void*> live;
  for (const Tensor* w : weights) live.insert(w->data);
  size_t freed = 0, kept = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!live.count(blocks[i].get())) {
      freed += sizes_[i];
      continue;
    }
    blocks[kept] = std::move(blocks[i]);
    sizes_[kept] = sizes_[i];
    ++kept;
  }
  blocks.resize(kept);
  sizes_.resize(kept);
  return freed;
}

std::unique_ptr<QuantizedWeights> quantize_weights(const std::vector<WeightGroup>& groups, DType target,
                                                   FastPool& pool) {
  check_quantize_target(target);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  // A weight qualifies only if every read of its bytes is MatMul's or MatMulId's weight
  // operand or GetRows's table, as the whole tensor (no view or reshape, whose layout a
  // new type would break).

  const DTypeTraits& tt = dtype_traits(target);
  std::vector<const WeightGroup*> todo;
  std::vector<std::string> odd_rows, other_format;
  uint64_t total_bytes = 0;
  for (const WeightGroup& g : groups) {
    const Tensor& w = *g.views.front();
    // A single row is a gating vector, not a matrix (llama.cpp keeps 1-D tensors F32).
    if (!g.used || g.other || w.ne[1] < 2 || is_router(g) || w.type == target) continue;
    if (!is_float(w.type)) {
      other_format.push_back(w.name);
    } else if (w.ne[0] % tt.block_elems != 0) {
      odd_rows.push_back(w.name);
    } else if (w.nb[0] != dtype_traits(w.type).block_bytes) {
      continue;  // elements not packed: not a weight as loaded from a file
    } else {
      todo.push_back(&g);
      total_bytes += w.nbytes();
    }
  }
  if (!other_format.empty())
    spdlog::info("--quantize {}: {} matrix weights already in another format are left as they are ({})",
                 lower_name(target), other_format.size(), names_of(other_format));
  if (!odd_rows.empty())
    spdlog::info("--quantize {}: {} weights keep their type: their rows are not a multiple of {}'s block of {} ({})",
                 lower_name(target), odd_rows.size(), lower_name(target), tt.block_elems, names_of(odd_rows));

  auto out = std::make_unique<QuantizedWeights>();
  uint64_t done_bytes = 0;
  double last_report = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    const WeightGroup& g = *todo[i];
    const Tensor src = *g.views.front();
    Tensor q = Tensor::contiguous(target, {src.ne[0], src.ne[1], src.ne[2], src.ne[3]});
    const size_t bytes = q.nbytes();
    const size_t alloc = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
    std::unique_ptr<std::byte, QuantizedWeights::FreeAligned> mem(static_cast<std::byte*>(std::aligned_alloc(64, alloc)));
    if (!mem) throw Error("out of memory quantizing " + printable(src.name, 80) + " (" + std::to_string(bytes) + " bytes)");
    std::byte* dst = mem.get();
    pool.parallel_for(src.nrows(), [&](int64_t r0, int64_t r1) { quantize_rows(src, target, dst, r0, r1); });
    for (Tensor* v : g.views) {
      v->type = target;
      std::copy(std::begin(q.nb), std::end(q.nb), std::begin(v->nb));
      v->data = dst;
    }
    if (src.is_contiguous()) release_pages(src.data, src.nbytes());  // the source is not read again
    out->blocks.push_back(std::move(mem));
    out->sizes_.push_back(bytes);
    out->bytes_before += src.nbytes();
    out->bytes_after += bytes;
    out->experts = out->experts || g.matmul_id;
    ++out->tensors;
    done_bytes += src.nbytes();
    // Large models take a while (Q4_K's scale search reads every value many times).
    if (const double s = seconds(); s - last_report >= 5.0 && i + 1 < todo.size()) {
      last_report = s;
      spdlog::info("quantizing to {}: {}/{} tensors, {:.0f}/{:.0f} MiB, {:.0f} s", lower_name(target), i + 1,
                   todo.size(), double(done_bytes) / (1 << 20), double(total_bytes) / (1 << 20), s);
    }
  }
  spdlog::info("quantized {} tensors ({:.1f} MiB -> {:.1f} MiB) to {} in {:.2f} s", out->tensors,
               double(out->bytes_before) / (1 << 20), double(out->bytes_after) / (1 << 20), lower_name(target),
               seconds());
  return out;
}

}  // namespace detail
}  // namespace tessera
