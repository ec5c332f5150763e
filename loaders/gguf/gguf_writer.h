// GGUF writer: builds metadata and tensors in memory and writes a valid GGUF v3 (or v2)
// image with alignment padding, to a file or a byte vector. Used by the synthetic model
// generator and by tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/model_file.h"

namespace tessera::gguf {

// MetaValue builders (the value representation of model_file.h).
MetaValue meta_u8(uint8_t v);
MetaValue meta_i8(int8_t v);
MetaValue meta_u16(uint16_t v);
MetaValue meta_i16(int16_t v);
MetaValue meta_u32(uint32_t v);
MetaValue meta_i32(int32_t v);
MetaValue meta_u64(uint64_t v);
MetaValue meta_i64(int64_t v);
MetaValue meta_f32(float v);
MetaValue meta_f64(double v);
MetaValue meta_bool(bool v);
MetaValue meta_string(std::string v);
// An array whose items all have type `elem` (items of an Array elem are arrays themselves).
MetaValue meta_array(MetaType elem, std::vector<MetaValue> items);
MetaValue meta_string_array(const std::vector<std::string>& items);
MetaValue meta_i32_array(const std::vector<int32_t>& items);
MetaValue meta_u32_array(const std::vector<uint32_t>& items);
MetaValue meta_f32_array(const std::vector<float>& items);

// Where things landed in the last written image (byte offsets from the file start).
struct GgufLayout {
  uint64_t kv_begin = 0;                      // first metadata entry (after the 24-byte header)
  std::vector<uint64_t> kv_offsets;           // start of each metadata entry (its key length)
  std::vector<uint64_t> tensor_info_offsets;  // start of each tensor info (its name length)
  uint64_t data_offset = 0;                   // start of the aligned data section
  std::vector<uint64_t> tensor_data_offsets;  // each tensor's offset inside the data section
  uint64_t file_size = 0;
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3);  // 2 or 3

  void set_version(uint32_t version);
  // Sets the data alignment (a power of two) and writes it as `general.alignment` (u32).
  void set_alignment(uint32_t alignment);
  uint32_t alignment() const { return alignment_; }

  // Metadata, kept in insertion order; setting an existing key replaces its value in place.
  // Setting `general.alignment` directly also changes the alignment.
  void set(std::string key, MetaValue value);
  void set_u8(std::string key, uint8_t v) { set(std::move(key), meta_u8(v)); }
  void set_i8(std::string key, int8_t v) { set(std::move(key), meta_i8(v)); }
  void set_u16(std::string key, uint16_t v) { set(std::move(key), meta_u16(v)); }
  void set_i16(std::string key, int16_t v) { set(std::move(key), meta_i16(v)); }
  void set_u32(std::string key, uint32_t v) { set(std::move(key), meta_u32(v)); }
  void set_i32(std::string key, int32_t v) { set(std::move(key), meta_i32(v)); }
  void set_u64(std::string key, uint64_t v) { set(std::move(key), meta_u64(v)); }
  void set_i64(std::string key, int64_t v) { set(std::move(key), meta_i64(v)); }
  void set_f32(std::string key, float v) { set(std::move(key), meta_f32(v)); }
  void set_f64(std::string key, double v) { set(std::move(key), meta_f64(v)); }
  void set_bool(std::string key, bool v) { set(std::move(key), meta_bool(v)); }
  void set_string(std::string key, std::string v) { set(std::move(key), meta_string(std::move(v))); }
  void set_array(std::string key, MetaType elem, std::vector<MetaValue> items) {
    set(std::move(key), meta_array(elem, std::move(items)));
  }
  void set_string_array(std::string key, const std::vector<std::string>& v) { set(std::move(key), meta_string_array(v)); }
  void set_i32_array(std::string key, const std::vector<int32_t>& v) { set(std::move(key), meta_i32_array(v)); }
  void set_u32_array(std::string key, const std::vector<uint32_t>& v) { set(std::move(key), meta_u32_array(v)); }
  void set_f32_array(std::string key, const std::vector<float>& v) { set(std::move(key), meta_f32_array(v)); }
  bool remove(std::string_view key);
  const MetaValue* find(std::string_view key) const;

  // Tensors, in insertion order. `ne` is in GGUF order (ne[0] contiguous), 1 to 4 dims;
  // `nbytes` must equal the size implied by dtype and shape (checked). Data is copied.
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data, size_t nbytes);
  // Same, with a raw ggml type id and no checks at all (for writing deliberately odd files).
  void add_tensor_raw(std::string name, uint32_t raw_type, std::vector<int64_t> ne, std::vector<uint8_t> bytes);
  // A tensor whose data is produced later by write_file_streaming's fill callback, so
  // files larger than memory can be written (the model generator does this).
  void declare_tensor(std::string name, DType type, std::vector<int64_t> ne);
  size_t tensor_count() const { return tensors_.size(); }
  size_t kv_count() const { return kv_.size(); }

  // Serialize. `layout`, if given, receives the positions of the written parts.
  std::vector<uint8_t> to_bytes(GgufLayout* layout = nullptr) const;
  // Write to `path` (throws tessera::Error on I/O failure).
  void write_file(const std::string& path, GgufLayout* layout = nullptr) const;
  // Write to `path` one tensor at a time: fill(index, dst, nbytes) produces the data of
  // each declared tensor (in insertion order) into a zeroed buffer.
  using FillFn = std::function<void(size_t index, uint8_t* dst, size_t nbytes)>;
  void write_file_streaming(const std::string& path, const FillFn& fill, GgufLayout* layout = nullptr) const;

 private:
  struct TensorEntry {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
    uint64_t nbytes = 0;    // size of the data (bytes.size() unless deferred)
    bool deferred = false;  // declared: data comes from write_file_streaming's callback
  };
  uint64_t checked_size(const std::string& name, DType type, const std::vector<int64_t>& ne) const;
  std::vector<uint8_t> header_bytes(GgufLayout& layout) const;
  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, MetaValue>> kv_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace tessera::gguf
