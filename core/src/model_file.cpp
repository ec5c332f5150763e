// Non-virtual parts of model_file.h: metadata access and tensor views.
#include "tessera/model_file.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <csignal>
#include <mutex>
#include <unistd.h>
#include <cstring>
#include <limits>

#include "tessera/error.h"
#include "tessera/quant.h"

namespace tessera {

std::string_view meta_type_name(MetaType t) {
  switch (t) {
    case MetaType::U8: return "u8";
    case MetaType::I8: return "i8";
    case MetaType::U16: return "u16";
    case MetaType::I16: return "i16";
    case MetaType::U32: return "u32";
    case MetaType::I32: return "i32";
    case MetaType::F32: return "f32";
    case MetaType::Bool: return "bool";
    case MetaType::String: return "string";
    case MetaType::Array: return "array";
    case MetaType::U64: return "u64";
    case MetaType::I64: return "i64";
    case MetaType::F64: return "f64";
  }
  return "unknown";
}

bool is_integer_type(MetaType t) {
  switch (t) {
    case MetaType::U8: case MetaType::I8: case MetaType::U16: case MetaType::I16:
    case MetaType::U32: case MetaType::I32: case MetaType::U64: case MetaType::I64:
    case MetaType::Bool:
      return true;
    default:
      return false;
  }
}

namespace {

[[noreturn]] void wrong_type(std::string_view key, const MetaValue& v, const char* expected) {
  std::string msg = "metadata key '";
  msg += key;
  msg += "' has type ";
  msg += meta_type_name(v.type);
  if (v.type == MetaType::Array) {
    msg += " of ";
    msg += meta_type_name(v.elem_type);
  }
  msg += ", expected ";
  msg += expected;
  throw Error(msg);
}

[[noreturn]] void missing(std::string_view key) {
  throw Error("missing metadata key '" + std::string(key) + "'");
}

}  // namespace

std::optional<int64_t> MetaValue::as_int() const {
  if (!is_integer_type(type)) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> MetaValue::as_float() const {
  if (type == MetaType::Bool) return std::nullopt;
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (!is_integer_type(type)) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  return std::nullopt;
}

const std::string* MetaValue::as_string() const { return std::get_if<std::string>(&value); }

const std::vector<MetaValue>* MetaValue::as_array() const {
  return std::get_if<std::vector<MetaValue>>(&value);
}

const MetaValue* Metadata::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<int64_t> Metadata::get_int(std::string_view key) const {
  const MetaValue* v = find(key);
  if (!v) return std::nullopt;
  if (auto i = v->as_int()) return i;
  if (is_integer_type(v->type)) {
    throw Error("metadata key '" + std::string(key) + "' has type " +
                std::string(meta_type_name(v->type)) + " with a value that does not fit in int64");
  }
  wrong_type(key, *v, "integer");
}

std::optional<double> Metadata::get_float(std::string_view key) const {
  const MetaValue* v = find(key);
  if (!v) return std::nullopt;
  if (auto d = v->as_float()) return d;
  wrong_type(key, *v, "float");
}

std::optional<std::string> Metadata::get_string(std::string_view key) const {
  const MetaValue* v = find(key);
  if (!v) return std::nullopt;
  if (const std::string* s = v->as_string()) return *s;
  wrong_type(key, *v, "string");
}

std::optional<bool> Metadata::get_bool(std::string_view key) const {
  const MetaValue* v = find(key);
  if (!v) return std::nullopt;
  if (is_integer_type(v->type)) {
    if (const auto* i = std::get_if<int64_t>(&v->value)) return *i != 0;
    if (const auto* u = std::get_if<uint64_t>(&v->value)) return *u != 0;
  }
  wrong_type(key, *v, "bool");
}

int64_t Metadata::require_int(std::string_view key) const {
  if (auto v = get_int(key)) return *v;
  missing(key);
}

double Metadata::require_float(std::string_view key) const {
  if (auto v = get_float(key)) return *v;
  missing(key);
}

std::string Metadata::require_string(std::string_view key) const {
  if (auto v = get_string(key)) return std::move(*v);
  missing(key);
}

Tensor TensorInfo::view() const {
  if (ne.empty() || ne.size() > static_cast<size_t>(Tensor::kMaxDims)) {
    throw Error("tensor '" + name + "' has " + std::to_string(ne.size()) +
                " dimensions, expected 1 to " + std::to_string(Tensor::kMaxDims));
  }
  const DTypeTraits& tr = dtype_traits(type);
  Tensor t;
  t.type = type;
  t.name = name;
  for (size_t i = 0; i < ne.size(); ++i) t.ne[i] = ne[i];
  if (tr.block_elems <= 0 || t.ne[0] % tr.block_elems != 0) {
    throw Error("tensor '" + name + "' has ne[0] = " + std::to_string(t.ne[0]) +
                ", not a multiple of the block size " + std::to_string(tr.block_elems) + " of " +
                std::string(tr.name));
  }
  // GGML convention: nb[0] is the size of one block (one element for plain types),
  // nb[1] the bytes of a row, higher strides contiguous.
  t.nb[0] = tr.block_bytes;
  t.nb[1] = static_cast<size_t>(t.ne[0] / tr.block_elems) * tr.block_bytes;
  for (int i = 2; i < Tensor::kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * static_cast<size_t>(t.ne[i - 1]);
  t.data = const_cast<void*>(data);
  t.buffer = nullptr;
  return t;
}

const TensorInfo* ModelFile::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string printable(std::string_view s, size_t max_len) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max_len ? max_len : s.size()) + 8);
  auto escape_byte = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  size_t i = 0;
  while (i < s.size()) {
    if (max_len && out.size() >= max_len) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
      else escape_byte(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes, no
    // overlong forms, surrogates or values above U+10FFFF.
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    bool ok = len != 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok) ok = !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
    if (!ok) {
      escape_byte(c);
      ++i;
      continue;
    }
    if (cp >= 0x80 && cp <= 0x9f) {  // C1 controls (CSI is U+009B)
      for (size_t k = 0; k < len; ++k) escape_byte(static_cast<unsigned char>(s[i + k]));
    } else if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) {
      out += "\\u{";
      for (int sh = 12; sh >= 0; sh -= 4) out += hex[(cp >> sh) & 15];
      out += '}';
    } else {
      out.append(s.data() + i, len);
    }
    i += len;
  }
  return out;
}

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

namespace {

// The registry the SIGBUS handler reads: fixed slots, published with release stores so
// the handler (async-signal-safe: loads, write(2), raise) never sees a half-written one.
struct MappedSlot {
  std::atomic<const uint8_t*> base{nullptr};
  std::atomic<size_t> size{0};
  char path[512] = {};
};
MappedSlot g_mapped[64];
std::mutex g_mapped_mutex;  // writers only
struct sigaction g_prev_sigbus;

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const auto* addr = static_cast<const uint8_t*>(info ? info->si_addr : nullptr);
  for (const MappedSlot& m : g_mapped) {
    const uint8_t* b = m.base.load(std::memory_order_acquire);
    if (!b || addr < b || addr >= b + m.size.load(std::memory_order_relaxed)) continue;
    write_str("tessera: fatal: model file ");
    write_str(m.path);
    write_str(" changed while in use (truncated or rewritten in place: SIGBUS reading its mapped weights); "
              "replace model files by writing a new file and renaming it\n");
    break;
  }
  // Then the signal takes its course: the handler that was there before (a sanitizer's),
  // or the default action (terminate, core dump) once this handler returns.
  if ((g_prev_sigbus.sa_flags & SA_SIGINFO) && g_prev_sigbus.sa_sigaction) {
    g_prev_sigbus.sa_sigaction(sig, info, ctx);
  } else if (g_prev_sigbus.sa_handler != SIG_DFL && g_prev_sigbus.sa_handler != SIG_IGN) {
    g_prev_sigbus.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);  // pending until this handler returns; re-executing the load would fault again anyway
  }
}

}  // namespace

void register_mapped_file(const void* base, size_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev_sigbus);
  });
  std::lock_guard<std::mutex> lock(g_mapped_mutex);
  for (MappedSlot& m : g_mapped) {
    if (m.base.load(std::memory_order_relaxed)) continue;
    const std::string shown = printable(path, sizeof m.path - 1);
    std::memcpy(m.path, shown.c_str(), std::min(shown.size() + 1, sizeof m.path));
    m.path[sizeof m.path - 1] = '\0';
    m.size.store(size, std::memory_order_relaxed);
    m.base.store(static_cast<const uint8_t*>(base), std::memory_order_release);
    return;
  }
}

void unregister_mapped_file(const void* base) {
  std::lock_guard<std::mutex> lock(g_mapped_mutex);
  for (MappedSlot& m : g_mapped)
    if (m.base.load(std::memory_order_relaxed) == base) m.base.store(nullptr, std::memory_order_release);
}

}  // namespace tessera
