// Non-virtual parts of model_file.h: metadata access and tensor views.
#include "tessera/model_file.h"

#include <cstring>
#include <limits>

#include "tessera/error.h"

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

}  // namespace tessera
