#include "gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "tessera/error.h"

namespace tessera::gguf {

namespace {

// The core's rules for bytes from the file in a message (control characters, invalid
// UTF-8 and bidirectional overrides escaped), cut at 80 characters unless told.
std::string printable(std::string_view s, size_t max_len = 80) { return tessera::printable(s, max_len); }

bool valid_meta_type(uint32_t t) { return t <= static_cast<uint32_t>(MetaType::F64); }

// Smallest encoded size of one value of type t (for bounding counts by remaining bytes).
uint64_t min_encoded_size(MetaType t) {
  switch (t) {
    case MetaType::U8: case MetaType::I8: case MetaType::Bool: return 1;
    case MetaType::U16: case MetaType::I16: return 2;
    case MetaType::U32: case MetaType::I32: case MetaType::F32: return 4;
    case MetaType::U64: case MetaType::I64: case MetaType::F64: return 8;
    case MetaType::String: return 8;
    case MetaType::Array: return 12;
  }
  return 1;
}

std::string type_label(uint32_t t) {
  if (valid_meta_type(t)) return std::string(meta_type_name(static_cast<MetaType>(t)));
  return std::to_string(t);
}

}  // namespace

class Parser {
 public:
  explicit Parser(GgufFile& f) : f_(f), p_(f.base_), size_(f.size_) {}

  void run() {
    parse_header();
    parse_kv();
    resolve_alignment();
    parse_tensor_infos();
    place_tensors();
  }

 private:
  // ---- errors -------------------------------------------------------------------------
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(printable(f_.path_, 200) + ": " + msg + hint_);
  }
  [[noreturn]] void fail_at(const std::string& msg, size_t pos) const {
    fail(msg + " at byte " + std::to_string(pos));
  }
  void need(size_t n, const char* what) const {
    if (size_ - pos_ < n) {
      std::string w = what;
      if (elem_index_ >= 0) w += " (array element " + std::to_string(elem_index_) + ")";
      if (!where_.empty()) w += " of " + where_;
      fail_at("truncated while reading " + w, pos_);
    }
  }

  // ---- bounded reads ------------------------------------------------------------------
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what_len, const char* what) {
    size_t at = pos_;
    uint64_t len = read<uint64_t>(what_len);
    if (len > size_ - pos_) {
      std::string w = what;
      if (elem_index_ >= 0) w += " (array element " + std::to_string(elem_index_) + ")";
      if (!where_.empty()) w += " of " + where_;
      fail("truncated while reading " + w + " at byte " + std::to_string(pos_) + ": string length " +
           std::to_string(len) + " (at byte " + std::to_string(at) + ") exceeds the " +
           std::to_string(size_ - pos_) + " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  // ---- header -------------------------------------------------------------------------
  void parse_header() {
    where_.clear();
    if (size_ < 4) fail_at("truncated while reading the magic (file has " + std::to_string(size_) + " bytes)", 0);
    uint32_t magic = read<uint32_t>("the magic");
    if (magic != kMagic) {
      std::string got(reinterpret_cast<const char*>(p_), 4);
      fail_at("not a GGUF file: bad magic '" + printable(got) + "' (expected 'GGUF')", 0);
    }
    uint32_t version = read<uint32_t>("the version");
    if (version == 1) fail_at("GGUF version 1 is not supported (the format before v2 used 32-bit lengths; re-convert the model)", 4);
    if (version != 2 && version != 3) {
      // A byte-swapped small version means a big-endian file.
      uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= 1 && swapped <= 3)
        fail_at("big-endian GGUF files are not supported (version field " + std::to_string(version) + ")", 4);
      fail_at("unsupported GGUF version " + std::to_string(version) + " (supported: 2, 3)", 4);
    }
    f_.version_ = version;
    n_tensors_ = read<uint64_t>("the tensor count");
    n_kv_ = read<uint64_t>("the metadata count");
    // Counts are not rejected up front (a truncated file would then report its counts
    // rather than where it ends); the loops below stop at the first entry that does not
    // fit, and an implausible count is named in any error of its section. Memory
    // reserved from a count is capped by what the file could hold.
  }

  // Every tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8 (offset);
  // every metadata entry at least 8 (key length) + 4 (type) + 1 (smallest value).
  static constexpr uint64_t kMinTensorInfo = 32;
  static constexpr uint64_t kMinKv = 13;

  void set_count_hint(uint64_t count, uint64_t min_size, const char* what, size_t field_at) {
    hint_.clear();
    uint64_t left = size_ - pos_;
    if (count > left / min_size)
      hint_ = " (the " + std::string(what) + " " + std::to_string(count) + " at byte " + std::to_string(field_at) +
              " is more than the " + std::to_string(left) + " remaining bytes can hold)";
  }

  // ---- metadata -----------------------------------------------------------------------
  void parse_kv() {
    set_count_hint(n_kv_, kMinKv, "metadata count", 16);
    f_.key_order_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv_, (size_ - pos_) / kMinKv)));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      where_ = "metadata entry " + std::to_string(i);
      size_t key_at = pos_;
      std::string key = read_string("the key length", "the key");
      where_ += " ('" + printable(key) + "')";
      if (key.empty()) fail_at("empty key in metadata entry " + std::to_string(i), key_at);
      if (f_.meta_.find(key)) fail_at("duplicate metadata key '" + printable(key) + "'", key_at);
      size_t type_at = pos_;
      uint32_t type = read<uint32_t>("the value type");
      if (!valid_meta_type(type))
        fail_at("unknown metadata value type " + std::to_string(type) + " in " + where_, type_at);
      MetaValue v = read_value(static_cast<MetaType>(type), 0);
      f_.meta_.set(key, std::move(v));
      f_.key_order_.push_back(std::move(key));
    }
    where_.clear();
    hint_.clear();
  }

  MetaValue read_value(MetaType t, int depth) {
    MetaValue v;
    v.type = t;
    switch (t) {
      case MetaType::U8: v.value = int64_t{read<uint8_t>("a u8 value")}; break;
      case MetaType::I8: v.value = int64_t{read<int8_t>("an i8 value")}; break;
      case MetaType::U16: v.value = int64_t{read<uint16_t>("a u16 value")}; break;
      case MetaType::I16: v.value = int64_t{read<int16_t>("an i16 value")}; break;
      case MetaType::U32: v.value = int64_t{read<uint32_t>("a u32 value")}; break;
      case MetaType::I32: v.value = int64_t{read<int32_t>("an i32 value")}; break;
      case MetaType::U64: v.value = uint64_t{read<uint64_t>("a u64 value")}; break;
      case MetaType::I64: v.value = int64_t{read<int64_t>("an i64 value")}; break;
      case MetaType::F32: v.value = double{read<float>("an f32 value")}; break;
      case MetaType::F64: v.value = read<double>("an f64 value"); break;
      case MetaType::Bool: {
        size_t at = pos_;
        uint8_t b = read<uint8_t>("a bool value");
        if (b > 1) fail_at("invalid bool value " + std::to_string(b) + " in " + where_, at);
        v.value = int64_t{b};
        break;
      }
      case MetaType::String: v.value = read_string("a string length", "a string value"); break;
      case MetaType::Array: read_array(v, depth + 1); break;
    }
    return v;
  }

  void read_array(MetaValue& v, int depth) {
    size_t at = pos_;
    if (depth > kMaxArrayDepth)
      fail_at("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels in " + where_, at);
    uint32_t et = read<uint32_t>("an array element type");
    if (!valid_meta_type(et))
      fail_at("unknown array element type " + std::to_string(et) + " in " + where_, at);
    size_t len_at = pos_;
    uint64_t n = read<uint64_t>("an array length");
    MetaType elem = static_cast<MetaType>(et);
    uint64_t left = size_ - pos_;
    if (n > left / min_encoded_size(elem))
      fail_at("array length " + std::to_string(n) + " of " + type_label(et) + " in " + where_ +
                  " exceeds the " + std::to_string(left) + " bytes left in the file",
              len_at);
    v.elem_type = elem;
    std::vector<MetaValue> items;
    items.reserve(static_cast<size_t>(n));
    int64_t saved = elem_index_;
    for (uint64_t k = 0; k < n; ++k) {
      elem_index_ = static_cast<int64_t>(k);
      items.push_back(read_value(elem, depth));
    }
    elem_index_ = saved;
    v.value = std::move(items);
  }

  void resolve_alignment() {
    const MetaValue* a = f_.meta_.find("general.alignment");
    if (!a) return;
    auto val = a->as_int();
    if (!val) {
      fail("metadata key 'general.alignment' has type " + std::string(meta_type_name(a->type)) +
           ", expected an unsigned integer");
    }
    if (*val <= 0 || (*val & (*val - 1)) != 0 || *val > (int64_t{1} << 30))
      fail("general.alignment = " + std::to_string(*val) + " is not a power of two between 1 and 2^30");
    f_.alignment_ = static_cast<uint32_t>(*val);
  }

  // ---- tensor infos -------------------------------------------------------------------
  void parse_tensor_infos() {
    set_count_hint(n_tensors_, kMinTensorInfo, "tensor count", 8);
    const size_t cap = static_cast<size_t>(std::min<uint64_t>(n_tensors_, (size_ - pos_) / kMinTensorInfo));
    f_.tensors_.reserve(cap);
    std::unordered_set<std::string> names;
    names.reserve(cap);
    offset_pos_.reserve(cap);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      where_ = "tensor info " + std::to_string(i);
      TensorInfo ti;
      size_t name_at = pos_;
      ti.name = read_string("the name length", "the name");
      const std::string pname = printable(ti.name);
      where_ += " ('" + pname + "')";
      if (ti.name.empty()) fail_at("empty tensor name in tensor info " + std::to_string(i), name_at);
      if (!names.insert(ti.name).second) fail_at("duplicate tensor name '" + pname + "'", name_at);
      const std::string tn = "tensor '" + pname + "'";

      size_t nd_at = pos_;
      uint32_t n_dims = read<uint32_t>("the dimension count");
      if (n_dims < 1 || n_dims > static_cast<uint32_t>(kMaxDims))
        fail_at(tn + " has n_dims = " + std::to_string(n_dims) + ", expected 1 to " + std::to_string(kMaxDims), nd_at);
      int64_t nelem = 1;
      ti.ne.resize(n_dims);
      for (uint32_t d = 0; d < n_dims; ++d) {
        size_t at = pos_;
        int64_t ne = read<int64_t>("a dimension");
        if (ne <= 0)
          fail_at(tn + " has ne[" + std::to_string(d) + "] = " + std::to_string(ne) + ", expected > 0", at);
        if (__builtin_mul_overflow(nelem, ne, &nelem))
          fail_at(tn + " has an element count that overflows int64 (dimension " + std::to_string(d) + ")", at);
        ti.ne[d] = ne;
      }

      size_t type_at = pos_;
      uint32_t raw = read<uint32_t>("the type");
      const DTypeTraits* tr = dtype_traits(raw);
      if (!tr) {
        std::string_view tname = ggml_type_name(raw);
        if (tname.substr(0, 5) == "type ")
          fail_at(tn + " has unknown type id " + std::to_string(raw), type_at);
        fail_at(tn + " has unsupported type " + std::string(tname), type_at);
      }
      ti.type = tr->type;
      if (tr->block_elems <= 0 || ti.ne[0] % tr->block_elems != 0)
        fail_at(tn + " has ne[0] = " + std::to_string(ti.ne[0]) + ", not a multiple of the block size " +
                    std::to_string(tr->block_elems) + " of " + std::string(tr->name),
                type_at);
      uint64_t row = static_cast<uint64_t>(ti.ne[0] / tr->block_elems);
      uint64_t nbytes = 0;
      if (__builtin_mul_overflow(row, static_cast<uint64_t>(tr->block_bytes), &row) ||
          __builtin_mul_overflow(row, static_cast<uint64_t>(nelem / ti.ne[0]), &nbytes) ||
          nbytes > std::numeric_limits<size_t>::max())
        fail_at(tn + " has a byte size that overflows", type_at);
      ti.nbytes = static_cast<size_t>(nbytes);

      size_t off_at = pos_;
      ti.offset = read<uint64_t>("the data offset");
      if (ti.offset % f_.alignment_ != 0)
        fail_at(tn + " has data offset " + std::to_string(ti.offset) + ", not a multiple of the alignment " +
                    std::to_string(f_.alignment_),
                off_at);
      offset_pos_.push_back(off_at);
      f_.tensors_.push_back(std::move(ti));
    }
    where_.clear();
    hint_.clear();
  }

  void place_tensors() {
    uint64_t a = f_.alignment_;
    uint64_t data = (static_cast<uint64_t>(pos_) + a - 1) / a * a;  // pos_ <= size_ < 2^63: no overflow
    f_.data_offset_ = data;
    if (f_.tensors_.empty()) return;  // vocab-only files: the padding may be absent
    if (data > size_)
      fail("truncated: the tensor data section starts at byte " + std::to_string(data) +
           " but the file has only " + std::to_string(size_) + " bytes");
    uint64_t data_size = size_ - data;
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      TensorInfo& ti = f_.tensors_[i];
      if (ti.offset > data_size || ti.nbytes > data_size - ti.offset) {
        std::string tn = "tensor '" + printable(ti.name) + "'";
        if (ti.offset >= data_size)
          fail_at(tn + " has data offset " + std::to_string(ti.offset) + " beyond the end of the data section (" +
                      std::to_string(data_size) + " bytes)",
                  offset_pos_[i]);
        fail_at(tn + " data [" + std::to_string(ti.offset) + ", " + std::to_string(ti.offset + ti.nbytes) +
                    ") crosses the end of the data section (" + std::to_string(data_size) +
                    " bytes; file truncated?)",
                offset_pos_[i]);
      }
      ti.data = f_.base_ + data + ti.offset;
      ti.file_offset = data + ti.offset;
    }
    // No two tensors may share bytes.
    std::vector<size_t> order(f_.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return f_.tensors_[x].offset < f_.tensors_[y].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = f_.tensors_[order[k - 1]];
      const TensorInfo& cur = f_.tensors_[order[k]];
      if (cur.offset < prev.offset + prev.nbytes)
        fail_at("tensor '" + printable(cur.name) + "' data at offset " + std::to_string(cur.offset) +
                    " overlaps tensor '" + printable(prev.name) + "' [" + std::to_string(prev.offset) + ", " +
                    std::to_string(prev.offset + prev.nbytes) + ")",
                offset_pos_[order[k]]);
    }
  }

  GgufFile& f_;
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::string where_;
  std::string hint_;  // appended to every error while a section's count is implausible
  int64_t elem_index_ = -1;
  std::vector<size_t> offset_pos_;
};

void GgufFile::parse() {
  Parser(*this).run();
  file_size_ = size_;
}

GgufFile::~GgufFile() {
  if (map_) {
    unregister_mapped_file(map_);
    munmap(map_, map_size_);
  }
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const std::string shown = printable(path, 200);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(shown + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(shown + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(shown + ": not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw Error(shown + ": empty file, not a GGUF model");
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw Error(shown + ": cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(e));
  f->map_ = m;
  f->map_size_ = size;
  register_mapped_file(m, size, path);  // a later truncation's SIGBUS names the file (docs/hardening.md)
  f->base_ = static_cast<const uint8_t*>(m);
  f->size_ = size;
  f->parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

bool looks_like_gguf(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  ssize_t n = ::read(fd, magic, 4);
  ::close(fd);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace tessera::gguf
