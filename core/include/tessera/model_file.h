// What a loader plugin presents: a model file's metadata (GGUF key/values, or the
// equivalent for other formats) and tensor descriptors over memory-mapped data.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/printable.h"  // what the loaders and their callers show of a file
#include "tessera/tensor.h"

namespace tessera {

// GGUF metadata value types (numeric values are GGUF's).
enum class MetaType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view meta_type_name(MetaType t);
bool is_integer_type(MetaType t);  // the integer types and Bool

struct MetaValue {
  MetaType type = MetaType::U8;
  // Scalars are widened: integers (and bool) to int64/uint64, floats to double.
  std::variant<int64_t, uint64_t, double, std::string, std::vector<MetaValue>> value;
  MetaType elem_type = MetaType::U8;  // for arrays

  std::optional<int64_t> as_int() const;    // any integer or bool type (range-checked)
  std::optional<double> as_float() const;   // any numeric type
  const std::string* as_string() const;
  const std::vector<MetaValue>* as_array() const;
};

class Metadata {
 public:
  void set(std::string key, MetaValue v) { kv_[std::move(key)] = std::move(v); }
  const MetaValue* find(std::string_view key) const;
  const std::map<std::string, MetaValue, std::less<>>& all() const { return kv_; }

  // Typed getters: nullopt if absent; throw tessera::Error if present with a wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // Required variants: throw tessera::Error naming the missing key.
  int64_t require_int(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::string require_string(std::string_view key) const;

 private:
  std::map<std::string, MetaValue, std::less<>> kv_;
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;  // ggml order, ne[0] contiguous
  uint64_t offset = 0;      // in the file's data section
  uint64_t file_offset = 0; // of the first byte, from the start of the file
  size_t nbytes = 0;
  const void* data = nullptr;  // into the mapping, valid while the ModelFile lives

  Tensor view() const;  // a Tensor over the mapped data
};

struct ModelDescription;

class ModelFile {
 public:
  virtual ~ModelFile() = default;
  virtual std::string format() const = 0;  // "gguf v3", "safetensors"
  virtual std::string path() const = 0;
  // The file's own metadata and tensors, under the format's names (what `tessera
  // info` shows).
  virtual const Metadata& metadata() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // The model under tessera's names (model_description.h); throws tessera::Error when
  // the file does not say what the model is or says something tessera cannot express.
  virtual ModelDescription describe() const = 0;
  const TensorInfo* find_tensor(std::string_view name) const;
  uint64_t file_size() const { return file_size_; }

 protected:
  uint64_t file_size_ = 0;
};

// Memory-mapped model files: a loader registers each mapping so that a SIGBUS inside
// one (the file was truncated or shrunk by another process while mapped) ends the
// process with a message naming the file instead of a bare "Bus error" (the signal
// then takes its course: the previous handler, or the default action). At most 64
// mappings at once are named; more still work, unnamed.
void register_mapped_file(const void* base, size_t size, const std::string& path);
void unregister_mapped_file(const void* base);

// The object a loader plugin's create() returns.
class ModelLoader {
 public:
  virtual ~ModelLoader() = default;
  virtual std::string name() const = 0;
  // Cheap check of the first bytes / folder layout: can this loader open it?
  virtual bool recognizes(const std::string& path) const = 0;
  // Open and validate; throws tessera::Error with one line naming the problem.
  virtual std::unique_ptr<ModelFile> open(const std::string& path) const = 0;
};

}  // namespace tessera
