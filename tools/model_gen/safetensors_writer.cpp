#include "safetensors_writer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "tessera/error.h"

namespace tessera::gen::safetensors {

namespace {
using ordered_json = nlohmann::ordered_json;

size_t element_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    default: throw Error("safetensors: dtype " + std::string(dtype_name(t)) + " is not F32, F16 or BF16");
  }
}
}  // namespace

uint64_t Entry::nbytes() const {
  uint64_t n = element_size(type);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

const char* dtype_string(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: throw Error("safetensors: dtype " + std::string(dtype_name(t)) + " is not F32, F16 or BF16");
  }
}

uint64_t parse_size(const std::string& text) {
  const std::string bad = "invalid size '" + text + "' (a number of bytes, or with a unit: 500MB, 5GB, 2GiB)";
  size_t i = 0;
  while (i < text.size() && std::isdigit(uint8_t(text[i]))) ++i;
  size_t frac_end = i;
  if (frac_end < text.size() && text[frac_end] == '.') {
    ++frac_end;
    while (frac_end < text.size() && std::isdigit(uint8_t(text[frac_end]))) ++frac_end;
  }
  if (i == 0) throw Error(bad);
  const double number = std::strtod(text.substr(0, frac_end).c_str(), nullptr);
  std::string unit = text.substr(frac_end);
  for (char& c : unit) c = char(std::toupper(uint8_t(c)));
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {{"", 1},         {"B", 1},          {"K", 1e3},         {"KB", 1e3},
                                {"M", 1e6},      {"MB", 1e6},       {"G", 1e9},         {"GB", 1e9},
                                {"T", 1e12},     {"TB", 1e12},      {"KIB", 1024.0},    {"MIB", 1048576.0},
                                {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = number * u.scale;
    if (!(bytes >= 1) || bytes > double(std::numeric_limits<int64_t>::max())) throw Error(bad);
    return uint64_t(bytes);
  }
  throw Error(bad);
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<Entry>& entries, uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const uint64_t n = entries[i].nbytes();
    if (n > max_shard_bytes) {  // alone in a shard of its own
      shards.push_back({i});
      continue;
    }
    if (!current.empty() && current_bytes + n > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

FileLayout layout_file(const std::vector<Entry>& entries, const std::vector<size_t>& members) {
  FileLayout l;
  l.order = members;
  std::stable_sort(l.order.begin(), l.order.end(), [&](size_t a, size_t b) {
    return element_size(entries[a].type) > element_size(entries[b].type);
  });
  ordered_json h = ordered_json::object();
  uint64_t at = 0;
  for (size_t i : l.order) {
    const Entry& e = entries[i];
    const uint64_t n = e.nbytes();
    h[e.name] = {{"dtype", dtype_string(e.type)}, {"shape", e.shape}, {"data_offsets", {at, at + n}}};
    l.offsets.push_back(at);
    at += n;
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string text = h.dump();
  // Padded with spaces so the data section starts on 8 bytes (the size field is 8).
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t size = text.size();
  l.header.resize(8);
  for (int b = 0; b < 8; ++b) l.header[size_t(b)] = char((size >> (8 * b)) & 0xFF);
  l.header += text;
  l.file_size = l.header.size() + at;
  return l;
}

void write_file(const std::string& path, const std::vector<Entry>& entries, const FileLayout& layout,
                const FillFn& fill) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(layout.header.data(), 1, layout.header.size(), f) == layout.header.size();
  std::vector<uint8_t> data;  // one tensor at a time; capacity stays at the largest
  for (size_t k = 0; ok && k < layout.order.size(); ++k) {
    const size_t i = layout.order[k];
    const size_t n = size_t(entries[i].nbytes());
    data.resize(n);
    fill(i, data.data(), n);
    ok = n == 0 || std::fwrite(data.data(), 1, n, f) == n;
  }
  int err = ok ? 0 : errno;  // the first failure's cause (EFBIG, ENOSPC)
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) throw Error(path + ": write failed: " + std::strerror(err));
}

std::string index_json(const std::vector<Entry>& entries, const std::vector<std::vector<size_t>>& shards) {
  ordered_json map = ordered_json::object();
  std::vector<std::string> shard_of(entries.size());
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s)
    for (size_t i : shards[s]) shard_of[i] = shard_name(s, shards.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    map[entries[i].name] = shard_of[i];
    total += entries[i].nbytes();
  }
  ordered_json j = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  return j.dump(2) + "\n";
}

}  // namespace tessera::gen::safetensors
