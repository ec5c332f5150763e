// Reading safetensors files and Hugging Face checkpoint folders: every header is
// validated before anything is trusted (the same strictness as the GGUF reader), the
// files are memory-mapped, and every problem is one tessera::Error line naming the
// file and, where there is one, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::safetensors {

// One tensor of a safetensors file, as the file describes it.
struct RawTensor {
  std::string name;                // the file's name ("model.layers.0.self_attn.q_proj.weight")
  std::string dtype;               // the file's dtype string ("F32", "BF16", "I64", ...)
  std::optional<DType> type;       // tessera's dtype for F32, F16 and BF16; nullopt for the others
  std::vector<int64_t> shape;      // row-major, outermost first, as in the file
  const void* data = nullptr;      // into the mapping, valid while the file object lives
  size_t nbytes = 0;
  uint64_t file_offset = 0;        // of the first byte, from the start of the file
  std::string file;                // path of the file holding it
};

// One memory-mapped .safetensors file, validated at open: 8-byte little-endian header
// size within the file, the header a JSON object (and nothing else but trailing
// spaces), each entry {dtype, shape, data_offsets} of known dtype, non-negative shape
// whose element count times the dtype size equals the byte range without overflow,
// ranges inside the data section and not overlapping; "__metadata__" a map of strings.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const std::vector<RawTensor>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse();  // validates the mapped header and fills tensors_ and metadata_
  std::string path_;
  uint64_t size_ = 0;
  void* map_ = nullptr;
  std::vector<RawTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a checkpoint folder: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names in its weight_map (every tensor the index names
// must be in the shard it names, no tensor in two shards, no shard missing; a tensor a
// shard holds that the index does not name is an error too).
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& folder);

  const std::string& folder() const { return folder_; }
  // Every tensor of every shard: shards in name order, each in data order.
  const std::vector<const RawTensor*>& tensors() const { return tensors_; }
  const RawTensor* find(std::string_view name) const;
  uint64_t total_file_bytes() const;  // sum of the shards' sizes
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string folder_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const RawTensor*> tensors_;
  std::map<std::string, const RawTensor*, std::less<>> by_name_;
};

// The folder a path names: the path itself if it is a folder, its parent if it names
// a config.json; empty if neither.
std::string checkpoint_folder(const std::string& path);
// Cheap check for the loader's recognizes(): checkpoint_folder(path) is non-empty and
// holds config.json and model.safetensors or model.safetensors.index.json.
bool looks_like_checkpoint(const std::string& path);

}  // namespace tessera::safetensors
