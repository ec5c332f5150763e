#include "gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "gguf_reader.h"
#include "tessera/error.h"

namespace tessera::gguf {

namespace {

MetaValue scalar(MetaType t, int64_t v) {
  MetaValue m;
  m.type = t;
  m.value = v;
  return m;
}

class Out {
 public:
  explicit Out(std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  void put(T v) {
    size_t n = b_.size();
    b_.resize(n + sizeof(T));
    std::memcpy(b_.data() + n, &v, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t a) {
    while (b_.size() % a != 0) b_.push_back(0);
  }
  size_t size() const { return b_.size(); }

 private:
  std::vector<uint8_t>& b_;
};

[[noreturn]] void bad_value(std::string_view key, const std::string& why) {
  throw Error("gguf writer: metadata key '" + std::string(key) + "': " + why);
}

// Integer payload of a scalar MetaValue, whichever alternative holds it.
template <typename T>
T int_as(std::string_view key, const MetaValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v.value)) {
    if constexpr (std::is_signed_v<T>) {
      if (*i < std::numeric_limits<T>::min() || *i > std::numeric_limits<T>::max())
        bad_value(key, "value " + std::to_string(*i) + " out of range for " + std::string(meta_type_name(v.type)));
    } else {
      if (*i < 0 || static_cast<uint64_t>(*i) > std::numeric_limits<T>::max())
        bad_value(key, "value " + std::to_string(*i) + " out of range for " + std::string(meta_type_name(v.type)));
    }
    return static_cast<T>(*i);
  }
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      bad_value(key, "value " + std::to_string(*u) + " out of range for " + std::string(meta_type_name(v.type)));
    return static_cast<T>(*u);
  }
  bad_value(key, "type " + std::string(meta_type_name(v.type)) + " does not hold an integer");
}

double float_of(std::string_view key, const MetaValue& v) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  bad_value(key, "type " + std::string(meta_type_name(v.type)) + " does not hold a number");
}

void write_value(Out& o, std::string_view key, const MetaValue& v, int depth) {
  switch (v.type) {
    case MetaType::U8: o.put(int_as<uint8_t>(key, v)); break;
    case MetaType::I8: o.put(int_as<int8_t>(key, v)); break;
    case MetaType::U16: o.put(int_as<uint16_t>(key, v)); break;
    case MetaType::I16: o.put(int_as<int16_t>(key, v)); break;
    case MetaType::U32: o.put(int_as<uint32_t>(key, v)); break;
    case MetaType::I32: o.put(int_as<int32_t>(key, v)); break;
    case MetaType::U64: o.put(int_as<uint64_t>(key, v)); break;
    case MetaType::I64: o.put(int_as<int64_t>(key, v)); break;
    case MetaType::Bool: o.put<uint8_t>(int_as<uint8_t>(key, v) != 0 ? 1 : 0); break;
    case MetaType::F32: o.put(static_cast<float>(float_of(key, v))); break;
    case MetaType::F64: o.put(float_of(key, v)); break;
    case MetaType::String: {
      const std::string* s = v.as_string();
      if (!s) bad_value(key, "type string does not hold a string");
      o.put_string(*s);
      break;
    }
    case MetaType::Array: {
      if (depth >= kMaxArrayDepth) bad_value(key, "arrays nested too deep");
      const std::vector<MetaValue>* a = v.as_array();
      if (!a) bad_value(key, "type array does not hold an array");
      o.put(static_cast<uint32_t>(v.elem_type));
      o.put<uint64_t>(a->size());
      for (const MetaValue& item : *a) {
        if (item.type != v.elem_type)
          bad_value(key, "array of " + std::string(meta_type_name(v.elem_type)) + " holds an item of type " +
                             std::string(meta_type_name(item.type)));
        write_value(o, key, item, depth + 1);
      }
      break;
    }
    default:
      bad_value(key, "unknown type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
}

bool pow2(uint64_t a) { return a > 0 && (a & (a - 1)) == 0; }

}  // namespace

MetaValue meta_u8(uint8_t v) { return scalar(MetaType::U8, v); }
MetaValue meta_i8(int8_t v) { return scalar(MetaType::I8, v); }
MetaValue meta_u16(uint16_t v) { return scalar(MetaType::U16, v); }
MetaValue meta_i16(int16_t v) { return scalar(MetaType::I16, v); }
MetaValue meta_u32(uint32_t v) { return scalar(MetaType::U32, v); }
MetaValue meta_i32(int32_t v) { return scalar(MetaType::I32, v); }
MetaValue meta_i64(int64_t v) { return scalar(MetaType::I64, v); }
MetaValue meta_bool(bool v) { return scalar(MetaType::Bool, v ? 1 : 0); }
MetaValue meta_u64(uint64_t v) {
  MetaValue m;
  m.type = MetaType::U64;
  m.value = v;
  return m;
}
MetaValue meta_f32(float v) {
  MetaValue m;
  m.type = MetaType::F32;
  m.value = static_cast<double>(v);
  return m;
}
MetaValue meta_f64(double v) {
  MetaValue m;
  m.type = MetaType::F64;
  m.value = v;
  return m;
}
MetaValue meta_string(std::string v) {
  MetaValue m;
  m.type = MetaType::String;
  m.value = std::move(v);
  return m;
}
MetaValue meta_array(MetaType elem, std::vector<MetaValue> items) {
  MetaValue m;
  m.type = MetaType::Array;
  m.elem_type = elem;
  m.value = std::move(items);
  return m;
}
MetaValue meta_string_array(const std::vector<std::string>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(meta_string(s));
  return meta_array(MetaType::String, std::move(v));
}
MetaValue meta_i32_array(const std::vector<int32_t>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(meta_i32(x));
  return meta_array(MetaType::I32, std::move(v));
}
MetaValue meta_u32_array(const std::vector<uint32_t>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (uint32_t x : items) v.push_back(meta_u32(x));
  return meta_array(MetaType::U32, std::move(v));
}
MetaValue meta_f32_array(const std::vector<float>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(meta_f32(x));
  return meta_array(MetaType::F32, std::move(v));
}

GgufWriter::GgufWriter(uint32_t version) { set_version(version); }

void GgufWriter::set_version(uint32_t version) {
  if (version != 2 && version != 3) throw Error("gguf writer: version " + std::to_string(version) + " (only 2 and 3 can be written)");
  version_ = version;
}

void GgufWriter::set_alignment(uint32_t alignment) { set_u32("general.alignment", alignment); }

void GgufWriter::set(std::string key, MetaValue value) {
  if (key == "general.alignment") {
    auto a = value.as_int();
    if (!a || !pow2(static_cast<uint64_t>(*a)) || *a > (int64_t{1} << 30))
      throw Error("gguf writer: general.alignment must be a power of two integer");
    alignment_ = static_cast<uint32_t>(*a);
  }
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

bool GgufWriter::remove(std::string_view key) {
  for (auto it = kv_.begin(); it != kv_.end(); ++it) {
    if (it->first == key) {
      if (key == "general.alignment") alignment_ = kDefaultAlignment;
      kv_.erase(it);
      return true;
    }
  }
  return false;
}

const MetaValue* GgufWriter::find(std::string_view key) const {
  for (const auto& kv : kv_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

uint64_t GgufWriter::checked_size(const std::string& name, DType type, const std::vector<int64_t>& ne) const {
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    throw Error("gguf writer: tensor '" + name + "' needs 1 to 4 dimensions");
  const DTypeTraits& tr = dtype_traits(type);
  uint64_t rows = 1;
  for (int64_t d : ne) {
    if (d <= 0) throw Error("gguf writer: tensor '" + name + "' has a dimension <= 0");
    rows *= static_cast<uint64_t>(d);
  }
  rows /= static_cast<uint64_t>(ne[0]);
  if (ne[0] % tr.block_elems != 0)
    throw Error("gguf writer: tensor '" + name + "' ne[0] is not a multiple of the block size of " + std::string(tr.name));
  for (const auto& t : tensors_)
    if (t.name == name) throw Error("gguf writer: duplicate tensor '" + name + "'");
  return static_cast<uint64_t>(ne[0] / tr.block_elems) * tr.block_bytes * rows;
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data, size_t nbytes) {
  uint64_t expect = checked_size(name, type, ne);
  if (expect != nbytes)
    throw Error("gguf writer: tensor '" + name + "' needs " + std::to_string(expect) + " bytes, got " + std::to_string(nbytes));
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({std::move(name), static_cast<uint32_t>(type), std::move(ne), std::vector<uint8_t>(p, p + nbytes),
                      nbytes, false});
}

void GgufWriter::declare_tensor(std::string name, DType type, std::vector<int64_t> ne) {
  uint64_t n = checked_size(name, type, ne);
  tensors_.push_back({std::move(name), static_cast<uint32_t>(type), std::move(ne), {}, n, true});
}

void GgufWriter::add_tensor_raw(std::string name, uint32_t raw_type, std::vector<int64_t> ne, std::vector<uint8_t> bytes) {
  uint64_t n = bytes.size();
  tensors_.push_back({std::move(name), raw_type, std::move(ne), std::move(bytes), n, false});
}

std::vector<uint8_t> GgufWriter::header_bytes(GgufLayout& lay) const {
  const uint64_t a = alignment_;
  std::vector<uint8_t> buf;
  buf.reserve(4096);
  Out o(buf);
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(version_);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  lay.kv_begin = o.size();
  for (const auto& [key, value] : kv_) {
    lay.kv_offsets.push_back(o.size());
    o.put_string(key);
    o.put<uint32_t>(static_cast<uint32_t>(value.type));
    write_value(o, key, value, 0);
  }
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    lay.tensor_info_offsets.push_back(o.size());
    o.put_string(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) o.put<int64_t>(d);
    o.put<uint32_t>(t.type);
    o.put<uint64_t>(off);
    lay.tensor_data_offsets.push_back(off);
    off += (t.nbytes + a - 1) / a * a;
  }
  o.pad_to(a);
  lay.data_offset = o.size();
  lay.file_size = lay.data_offset + off;
  return buf;
}

std::vector<uint8_t> GgufWriter::to_bytes(GgufLayout* layout) const {
  for (const auto& t : tensors_)
    if (t.deferred) throw Error("gguf writer: tensor '" + t.name + "' was declared without data: use write_file_streaming");
  GgufLayout lay;
  std::vector<uint8_t> buf = header_bytes(lay);
  buf.reserve(lay.file_size);
  Out o(buf);
  for (const auto& t : tensors_) {
    buf.insert(buf.end(), t.bytes.begin(), t.bytes.end());
    o.pad_to(alignment_);
  }
  if (layout) *layout = std::move(lay);
  return buf;
}

void GgufWriter::write_file(const std::string& path, GgufLayout* layout) const {
  write_file_streaming(path, [](size_t, uint8_t*, size_t) {}, layout);
}

void GgufWriter::write_file_streaming(const std::string& path, const FillFn& fill, GgufLayout* layout) const {
  GgufLayout lay;
  std::vector<uint8_t> header = header_bytes(lay);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  std::vector<uint8_t> data;
  for (size_t i = 0; ok && i < tensors_.size(); ++i) {
    const TensorEntry& t = tensors_[i];
    const uint64_t padded = (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
    data.assign(padded, 0);
    if (t.deferred) fill(i, data.data(), t.nbytes);
    else std::copy(t.bytes.begin(), t.bytes.end(), data.begin());
    ok = padded == 0 || std::fwrite(data.data(), 1, padded, f) == padded;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw Error(path + ": write failed: " + std::strerror(errno));
  if (layout) *layout = std::move(lay);
}

}  // namespace tessera::gguf
