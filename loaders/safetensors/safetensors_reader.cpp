#include "safetensors_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "tessera/error.h"
#include "tessera/model_file.h"

namespace tessera::safetensors {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's cap
constexpr uint64_t kMaxIndexBytes = 100'000'000;
constexpr int kMaxJsonDepth = 64;  // a real header nests 3 deep (root, entry, shape)
constexpr size_t kMaxDims = 8;

std::string shown(std::string_view s) { return printable(s, 200); }
std::string q(std::string_view s) { return std::string("'").append(printable(s, 120)).append("'"); }

[[noreturn]] void fail(const std::string& file, const std::string& msg) { throw Error(shown(file) + ": " + msg); }

// Bytes per element of the safetensors dtypes; 0 for a name that is not one.
size_t dtype_size(std::string_view d) {
  struct Entry {
    std::string_view name;
    size_t size;
  };
  static constexpr Entry kTable[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},     {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},      {"BOOL", 1},    {"F8_E4M3", 1},
      {"F8_E5M2", 1},
  };
  for (const Entry& e : kTable)
    if (e.name == d) return e.size;
  return 0;
}

std::optional<DType> tessera_dtype(std::string_view d) {
  if (d == "F32") return DType::F32;
  if (d == "F16") return DType::F16;
  if (d == "BF16") return DType::BF16;
  return std::nullopt;
}

std::string json_kind(const json& j) {
  if (j.is_number_unsigned()) return "unsigned integer";
  if (j.is_number_integer()) return "negative integer";
  if (j.is_number_float()) return "floating-point number";
  return j.type_name();  // "object", "array", "string", "boolean", "null"
}

// Parses `text` as one JSON document, strictly: nesting deeper than kMaxJsonDepth and
// duplicate object keys are refused (nlohmann would silently keep the last value), and
// parse errors become one-line tessera::Errors naming `file` and `what`.
json parse_json(std::string_view text, const std::string& file, const char* what) {
  // One key set per open object or array (arrays never use theirs); the depth is the
  // stack's size, so a hostile header is stopped at the 65th open bracket.
  std::vector<std::unordered_set<std::string>> keys;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (keys.size() >= static_cast<size_t>(kMaxJsonDepth))
          fail(file, std::string(what) + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(k).second)
          fail(file, "duplicate key " + q(k) + " in " + what);
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    // nlohmann's message quotes the last token read: raw bytes of the file.
    fail(file, std::string(what) + " is not valid JSON: " + printable(e.what(), 300));
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// ---- SafetensorsFile ------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() {
  if (map_) {
    unregister_mapped_file(map_);
    munmap(map_, static_cast<size_t>(size_));
  }
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    if (size == 0) fail(path, "empty file, not a safetensors file");
    fail(path, "truncated: " + std::to_string(size) +
                   " bytes, too small for the 8-byte header size of a safetensors file");
  }
  void* m = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(path, "cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(e));
  f->map_ = m;
  f->size_ = size;
  register_mapped_file(m, static_cast<size_t>(size), path);  // a later truncation's SIGBUS names the file
  f->parse();
  return f;
}

void SafetensorsFile::parse() {
  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(base[i]) << (8 * i);  // little-endian
  const uint64_t room = size_ - 8;
  if (header_size == 0) fail(path_, "header size is 0: no JSON header");
  if (header_size > kMaxHeaderBytes && header_size <= room)
    fail(path_, "header size " + std::to_string(header_size) + " exceeds the limit of " +
                    std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_size > room)
    fail(path_, "truncated: header size " + std::to_string(header_size) + " exceeds the " + std::to_string(room) +
                    " bytes after the size field (file has " + std::to_string(size_) + " bytes)");

  std::string_view text(reinterpret_cast<const char*>(base + 8), static_cast<size_t>(header_size));
  // Writers pad the header with spaces so the data starts aligned; nothing else may follow
  // the JSON object.
  size_t end = text.find_last_not_of(' ');
  if (end == std::string_view::npos) fail(path_, "header is all spaces: no JSON object");
  text = text.substr(0, end + 1);
  if (text.front() != '{')
    fail(path_, "header is not a JSON object (starts with " + q(text.substr(0, 16)) + ")");
  if (text.back() != '}')
    fail(path_, "header does not end with '}' before its space padding (ends with " +
                    q(text.substr(text.size() - std::min<size_t>(text.size(), 16))) + ")");
  json header = parse_json(text, path_, "the header");
  if (!header.is_object()) fail(path_, "header is a JSON " + json_kind(header) + ", expected an object");

  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = size_ - data_start;
  struct Range {
    uint64_t begin, end;
  };
  std::vector<Range> ranges;
  tensors_.reserve(header.size());
  ranges.reserve(header.size());
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        fail(path_, "__metadata__ is a JSON " + json_kind(entry) + ", expected an object of strings");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string())
          fail(path_, "__metadata__ value of " + q(k) + " is a JSON " + json_kind(v) + ", expected a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string tn = "tensor " + q(name);
    if (name.empty()) fail(path_, "empty tensor name in the header");
    if (!entry.is_object())
      fail(path_, tn + " is a JSON " + json_kind(entry) + ", expected an object with dtype, shape and data_offsets");
    for (auto& [k, v] : entry.items()) {
      (void)v;
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        fail(path_, tn + " has unexpected key " + q(k) + " (expected dtype, shape and data_offsets)");
    }
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(k)) fail(path_, tn + " has no " + k);

    RawTensor t;
    t.name = name;
    t.file = path_;
    const json& jd = entry["dtype"];
    if (!jd.is_string()) fail(path_, tn + " dtype is a JSON " + json_kind(jd) + ", expected a string");
    t.dtype = jd.get<std::string>();
    const size_t esize = dtype_size(t.dtype);
    if (esize == 0) fail(path_, tn + " has unknown dtype " + q(t.dtype));
    t.type = tessera_dtype(t.dtype);

    const json& js = entry["shape"];
    if (!js.is_array()) fail(path_, tn + " shape is a JSON " + json_kind(js) + ", expected an array");
    if (js.size() > kMaxDims)
      fail(path_, tn + " has " + std::to_string(js.size()) + " dimensions, at most " + std::to_string(kMaxDims) +
                      " are supported");
    uint64_t nelem = 1;
    bool overflow = false, empty = false;
    for (size_t d = 0; d < js.size(); ++d) {
      const json& v = js[d];
      if (!v.is_number_unsigned())
        fail(path_, tn + " shape[" + std::to_string(d) + "] is a " + json_kind(v) +
                        ", expected a non-negative integer");
      uint64_t n = v.get<uint64_t>();
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path_, tn + " shape[" + std::to_string(d) + "] = " + std::to_string(n) + " is too large (overflow)");
      t.shape.push_back(static_cast<int64_t>(n));
      empty = empty || n == 0;
      overflow = overflow || __builtin_mul_overflow(nelem, n, &nelem);
    }
    uint64_t nbytes = 0;
    // A zero dimension makes the tensor empty whatever the others are (the wrapped
    // product of an overflow can itself be 0, so the flag decides, not nelem).
    if (empty) overflow = false, nelem = 0;
    if (overflow || __builtin_mul_overflow(nelem, static_cast<uint64_t>(esize), &nbytes))
      fail(path_, tn + " shape " + shape_text(t.shape) + " of " + t.dtype + " has a byte size that overflows");

    const json& jo = entry["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      fail(path_, tn + " data_offsets is a " +
                      (jo.is_array() ? std::to_string(jo.size()) + "-element array" : "JSON " + json_kind(jo)) +
                      ", expected [begin, end]");
    for (size_t k = 0; k < 2; ++k)
      if (!jo[k].is_number_unsigned())
        fail(path_, tn + " data_offsets[" + std::to_string(k) + "] is a " + json_kind(jo[k]) +
                        ", expected an unsigned integer");
    const uint64_t begin = jo[0].get<uint64_t>(), stop = jo[1].get<uint64_t>();
    const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(stop) + "]";
    if (begin > stop) fail(path_, tn + " data_offsets " + range + " has begin > end");
    if (stop - begin != nbytes)
      fail(path_, tn + " shape " + shape_text(t.shape) + " of " + t.dtype + " is " + std::to_string(nbytes) +
                      " bytes but data_offsets " + range + " span " + std::to_string(stop - begin));
    if (stop > data_size)
      fail(path_, tn + " data_offsets " + range + " lie outside the data section (" + std::to_string(data_size) +
                      " bytes; file truncated?)");
    t.nbytes = static_cast<size_t>(nbytes);
    t.file_offset = data_start + begin;
    // safetensors does not align tensor data: a writer's header padding usually puts the
    // data section on 8 bytes, but nothing guarantees it, so an F32 or BF16 tensor's
    // pointer may be unaligned for its type. It is kept as is (never dereferenced here as
    // a typed pointer); the model loader copies or checks before using it typed.
    t.data = base + t.file_offset;
    tensors_.push_back(std::move(t));
    ranges.push_back({begin, stop});
  }

  // Data order: by begin, then end (empty tensors first at a shared offset), then name.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (ranges[x].begin != ranges[y].begin) return ranges[x].begin < ranges[y].begin;
    if (ranges[x].end != ranges[y].end) return ranges[x].end < ranges[y].end;
    return tensors_[x].name < tensors_[y].name;
  });
  // No two tensors share a byte (empty tensors share none and may sit anywhere).
  const size_t none = std::numeric_limits<size_t>::max();
  size_t reach = none;  // the non-empty tensor that ends furthest so far
  for (size_t i : order) {
    if (ranges[i].begin == ranges[i].end) continue;
    if (reach != none && ranges[i].begin < ranges[reach].end)
      fail(path_, "tensor " + q(tensors_[i].name) + " data_offsets [" + std::to_string(ranges[i].begin) + ", " +
                      std::to_string(ranges[i].end) + "] overlap tensor " + q(tensors_[reach].name) + " [" +
                      std::to_string(ranges[reach].begin) + ", " + std::to_string(ranges[reach].end) + "]");
    if (reach == none || ranges[i].end > ranges[reach].end) reach = i;
  }
  std::vector<RawTensor> sorted;
  sorted.reserve(tensors_.size());
  for (size_t i : order) sorted.push_back(std::move(tensors_[i]));
  tensors_ = std::move(sorted);
}

// ---- Checkpoint -----------------------------------------------------------------------

namespace {

std::string read_small_file(const std::string& path, uint64_t cap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > cap) {
    ::close(fd);
    fail(path, "is " + std::to_string(st.st_size) + " bytes, more than the limit of " + std::to_string(cap));
  }
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    ssize_t n = ::read(fd, s.data() + got, s.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      fail(path, n == 0 ? std::string("file shrank while being read") : std::string("cannot read: ") + std::strerror(e));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return s;
}

bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& folder) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->folder_ = folder;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) fail(folder, "not a folder");
  const fs::path dir(folder);
  const std::string index_path = (dir / "model.safetensors.index.json").string();
  const std::string single_path = (dir / "model.safetensors").string();

  // tensor -> shard, from the index (empty for a single-file checkpoint)
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  const bool indexed = fs::exists(index_path, ec);
  if (indexed) {
    std::string text = read_small_file(index_path, kMaxIndexBytes);
    json idx = parse_json(text, index_path, "the index");
    if (!idx.is_object()) fail(index_path, "the index is a JSON " + json_kind(idx) + ", expected an object");
    if (idx.contains("metadata") && !idx["metadata"].is_object())
      fail(index_path, "\"metadata\" is a JSON " + json_kind(idx["metadata"]) + ", expected an object");
    if (!idx.contains("weight_map")) fail(index_path, "the index has no \"weight_map\"");
    const json& wm = idx["weight_map"];
    if (!wm.is_object()) fail(index_path, "\"weight_map\" is a JSON " + json_kind(wm) + ", expected an object");
    if (wm.empty()) fail(index_path, "\"weight_map\" names no tensors");
    for (auto& [tensor, shard] : wm.items()) {
      if (!shard.is_string())
        fail(index_path, "weight_map entry of tensor " + q(tensor) + " is a JSON " + json_kind(shard) +
                             ", expected a shard file name");
      const std::string& s = shard.get_ref<const std::string&>();
      if (!is_plain_file_name(s))
        fail(index_path, "shard " + q(s) + " of tensor " + q(tensor) +
                             " is not a plain file name inside the folder ('/' and '..' are refused)");
      weight_map[tensor] = s;
      shards.insert(s);
    }
    for (const std::string& s : shards) {
      const fs::path p = dir / s;
      if (!fs::exists(p, ec)) fail(index_path, "shard " + q(s) + " named by the index is missing from the folder");
    }
  } else if (fs::exists(single_path, ec)) {
    shards.insert("model.safetensors");
  } else {
    fail(folder, "no model.safetensors or model.safetensors.index.json in the folder");
  }

  for (const std::string& s : shards) {  // std::set: name order
    c->files_.push_back(SafetensorsFile::open((dir / s).string()));
    const SafetensorsFile& f = *c->files_.back();
    for (const RawTensor& t : f.tensors()) {
      auto [it, inserted] = c->by_name_.emplace(t.name, &t);
      if (!inserted)
        fail(indexed ? index_path : f.path(), "tensor " + q(t.name) + " is in two shards: " +
                                                  q(fs::path(it->second->file).filename().string()) + " and " +
                                                  q(s));
      if (indexed) {
        auto w = weight_map.find(t.name);
        if (w == weight_map.end())
          fail(index_path, "tensor " + q(t.name) + " of shard " + q(s) + " is not named by the index");
        if (w->second != s)
          fail(index_path, "tensor " + q(t.name) + " is in shard " + q(s) + " but the index puts it in " +
                               q(w->second));
      }
      c->tensors_.push_back(&t);
    }
  }
  for (const auto& [tensor, shard] : weight_map)
    if (!c->by_name_.count(tensor))
      fail(index_path, "tensor " + q(tensor) + " named by the index is missing from shard " + q(shard));
  return c;
}

const RawTensor* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

uint64_t Checkpoint::total_file_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

// ---- folder recognition ---------------------------------------------------------------

std::string checkpoint_folder(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return {};
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return path;
  if (p.filename() == "config.json" && fs::is_regular_file(p, ec)) {
    fs::path parent = p.parent_path();
    return parent.empty() ? std::string(".") : parent.string();
  }
  return {};
}

bool looks_like_checkpoint(const std::string& path) {
  const std::string folder = checkpoint_folder(path);
  if (folder.empty()) return false;
  std::error_code ec;
  const fs::path dir(folder);
  return fs::is_regular_file(dir / "config.json", ec) &&
         (fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / "model.safetensors.index.json", ec));
}

}  // namespace tessera::safetensors
