// Non-finite values in a model file's tensors (tensor_scan.h).
#include "tessera/tensor_scan.h"

#include <cmath>
#include <string>
#include <vector>

#include "tessera/quant.h"

namespace tessera {

namespace {

// Non-finite values of `n` consecutive floats, counted into r (first index offset by `base`).
void count_non_finite(const float* v, int64_t n, int64_t base, NonFiniteTensor& r) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    if (r.count++ == 0) {
      r.first = base + i;
      r.first_value = v[i];
    }
  }
}

// One tensor's non-finite values (count 0: none, or a tensor that is not read: integer
// or empty).
NonFiniteTensor scan_tensor(const TensorInfo& t, std::vector<float>& buf) {
  NonFiniteTensor r;
  r.name = t.name;
  r.type = t.type;
  if (t.type == DType::I32 || t.ne.empty() || !t.data) return r;
  const DTypeTraits& tr = dtype_traits(t.type);
  int64_t n = 1;
  for (int64_t d : t.ne) n *= d;  // the reader checked the product for overflow
  const auto* p = static_cast<const uint8_t*>(t.data);
  if (t.type == DType::F32) {
    for (int64_t i = 0; i < n; ++i) {  // bit test: no float loads of a signalling NaN
      uint32_t b;
      std::memcpy(&b, p + 4 * i, 4);
      if ((b & 0x7f800000u) == 0x7f800000u) {
        if (r.count++ == 0) r.first = i, r.first_value = std::bit_cast<float>(b);
      }
    }
  } else if (t.type == DType::F16 || t.type == DType::BF16) {
    const uint16_t mask = t.type == DType::F16 ? 0x7c00 : 0x7f80;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if ((h & mask) == mask) {
        if (r.count++ == 0)
          r.first = i, r.first_value = t.type == DType::F16 ? quant::fp16_to_fp32(h) : quant::bf16_to_fp32(h);
      }
    }
  } else {
    // Quantized: dequantize a run of blocks at a time (scales are F16/E8M0; a NaN or
    // infinite scale makes its block's values non-finite).
    const int64_t be = tr.block_elems;
    const int64_t chunk_blocks = std::max<int64_t>(1, 65536 / be);
    const int64_t blocks = n / be;
    buf.resize(size_t(chunk_blocks * be));
    for (int64_t b0 = 0; b0 < blocks; b0 += chunk_blocks) {
      const int64_t nb = std::min(chunk_blocks, blocks - b0);
      quant::dequantize_row(t.type, p + size_t(b0) * tr.block_bytes, buf.data(), nb * be);
      count_non_finite(buf.data(), nb * be, b0 * be, r);
    }
  }
  return r;
}

// At most one extent above 1: a norm, a bias, a scale vector.
bool is_vector(const TensorInfo& t) {
  int wide = 0;
  for (int64_t d : t.ne) wide += d > 1;
  return wide <= 1;
}

std::vector<NonFiniteTensor> scan_tensors(const ModelFile& file, bool vectors_only) {
  std::vector<NonFiniteTensor> bad;
  std::vector<float> buf;
  for (const TensorInfo& t : file.tensors()) {
    if (vectors_only && !is_vector(t)) continue;
    NonFiniteTensor r = scan_tensor(t, buf);
    if (r.count) bad.push_back(std::move(r));
  }
  return bad;
}

}  // namespace

std::vector<NonFiniteTensor> find_non_finite_tensors(const ModelFile& file) { return scan_tensors(file, false); }

std::vector<NonFiniteTensor> find_non_finite_vectors(const ModelFile& file) { return scan_tensors(file, true); }

std::string describe(const NonFiniteTensor& t) {
  const char* what = std::isnan(t.first_value) ? "nan" : t.first_value > 0 ? "+inf" : "-inf";
  return "tensor '" + printable(t.name, 120) + "' (" + std::string(dtype_name(t.type)) + ") holds " +
         std::to_string(t.count) + " non-finite value" + (t.count == 1 ? "" : "s") + " (first: " + what +
         " at element " + std::to_string(t.first) + ")";
}

}  // namespace tessera
