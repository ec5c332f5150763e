// Writing safetensors files and the sharded layout of transformers' save_pretrained:
// a header (8-byte little-endian size, then JSON naming each tensor's dtype, shape and
// data_offsets plus __metadata__ {"format": "pt"}, padded with spaces to a multiple of
// 8), then the tensors' bytes back to back. The data is produced one tensor at a time
// by a callback, so a file never has to fit in memory.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::gen::safetensors {

struct Entry {
  std::string name;
  DType type;                  // F32, F16 or BF16
  std::vector<int64_t> shape;  // row-major, outermost first (the reverse of ggml's ne)
  uint64_t nbytes() const;
};

// "F32", "F16", "BF16"; throws tessera::Error for a type safetensors cannot hold as is.
const char* dtype_string(DType t);

// A size with an optional unit, as save_pretrained's max_shard_size takes it: "5GB"
// (decimal units, KB MB GB TB; a bare K M G T too) or "2GiB" (binary, KiB MiB GiB TiB);
// a plain number is bytes. Throws tessera::Error on anything else or zero.
uint64_t parse_size(const std::string& text);

// The entries' indices per shard, as huggingface_hub's split_torch_state_dict_into_shards
// (save_pretrained's max_shard_size) groups them: in order, a new shard when the next
// tensor would take the current one over max_shard_bytes; a tensor larger than that
// goes alone into a shard of its own at once, ahead of the shard still being filled.
std::vector<std::vector<size_t>> plan_shards(const std::vector<Entry>& entries, uint64_t max_shard_bytes);

// Shard file names: "model.safetensors" for one shard, else model-00001-of-0000N.safetensors.
std::string shard_name(size_t index, size_t count);

// One file's layout: its entries (indices into the caller's list) in data order, F32
// before the 2-byte types so every tensor starts aligned to its element size (the
// safetensors library sorts by dtype for the same reason; the format allows no gaps).
struct FileLayout {
  std::vector<size_t> order;        // entry indices in data order
  std::vector<uint64_t> offsets;    // data_offsets begin of order[i], from the data start
  std::string header;               // the 8 size bytes and the padded JSON
  uint64_t file_size = 0;
};
FileLayout layout_file(const std::vector<Entry>& entries, const std::vector<size_t>& members);

// Writes `path`: the header, then each tensor of `layout` produced by
// fill(entry index, dst, nbytes) into one buffer of the largest tensor's size. Throws
// tessera::Error naming the path when it cannot be created or a write fails.
using FillFn = std::function<void(size_t entry, uint8_t* dst, size_t nbytes)>;
void write_file(const std::string& path, const std::vector<Entry>& entries, const FileLayout& layout,
                const FillFn& fill);

// model.safetensors.index.json: metadata.total_size (the tensors' bytes) and the
// weight_map from each tensor name to its shard, in the entries' order.
std::string index_json(const std::vector<Entry>& entries, const std::vector<std::vector<size_t>>& shards);

}  // namespace tessera::gen::safetensors
