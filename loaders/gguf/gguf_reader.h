// GGUF reader: parses and validates a GGUF v2/v3 file (little-endian) over a read-only
// memory mapping (or a caller-provided byte buffer) and presents it as a ModelFile.
// Every rejection is a tessera::Error with one line naming the file, the problem and
// the byte position; no input can make it read out of bounds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/model_file.h"

namespace tessera::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxArrayDepth = 8;  // arrays of arrays nested at most this deep
inline constexpr int kMaxDims = 4;

class GgufFile final : public ModelFile {
 public:
  // Memory-maps `path` read-only and parses it.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image; the file keeps the bytes. `name` is used in messages.
  static std::unique_ptr<GgufFile> from_bytes(std::vector<uint8_t> bytes, std::string name);

  ~GgufFile() override;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  std::string format() const override { return "gguf v" + std::to_string(version_); }
  std::string path() const override { return path_; }
  const Metadata& metadata() const override { return meta_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  // gguf_description.cpp: GGUF's names are tessera's, less the architecture prefix.
  ModelDescription describe() const override;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  // Metadata keys in file order (Metadata itself is sorted).
  const std::vector<std::string>& key_order() const { return key_order_; }
  const uint8_t* bytes() const { return base_; }
  size_t size() const { return size_; }

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;  // mmap'd region (munmap in the destructor) or null
  size_t map_size_ = 0;
  std::vector<uint8_t> owned_;

  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  Metadata meta_;
  std::vector<std::string> key_order_;
  std::vector<TensorInfo> tensors_;

  friend class Parser;
};

// True if the file at `path` starts with the GGUF magic (cheap; never throws).
bool looks_like_gguf(const std::string& path);

}  // namespace tessera::gguf
