// Host side of a loader plugin (plugin_loader_adapter.h). A model's metadata and tensor
// descriptors are copied out of the plugin once, at open (and its description once, at
// the first describe()): the architectures read them many times, and a tokenizer
// vocabulary of 150k strings is one meta_get per string, once.
#include "plugin/plugin_loader_adapter.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <vector>

#include "tessera/error.h"
#include "tessera/model_description.h"

namespace tessera::detail {

namespace {

constexpr size_t kMessageSize = 4096;
// Arrays nested deeper than this are refused (GGUF allows 8).
constexpr size_t kMaxMetaDepth = 64;

static_assert(uint32_t(MetaType::U8) == TESSERA_META_U8 && uint32_t(MetaType::Bool) == TESSERA_META_BOOL &&
              uint32_t(MetaType::String) == TESSERA_META_STRING && uint32_t(MetaType::Array) == TESSERA_META_ARRAY &&
              uint32_t(MetaType::F64) == TESSERA_META_F64,
              "TesseraMetaType must number the metadata types as tessera::MetaType does");

std::string message(const char* buf) { return std::string(buf, strnlen(buf, kMessageSize)); }

// What a loader instance needs to be destroyed: the last ModelLoader or ModelFile
// holding it destroys it (and only then lets the library go).
struct Instance {
  std::shared_ptr<void> keep;  // released after destroy() ran (members die after the body)
  std::string name;
  const TesseraPluginDescriptor* desc = nullptr;
  const TesseraLoaderApi* api = nullptr;
  void* self = nullptr;

  ~Instance() {
    try {
      if (desc && desc->destroy) desc->destroy(self);
    } catch (...) {  // the ABI forbids it; never let it out of a destructor
    }
  }

  template <typename F>
  auto fn(F TesseraLoaderApi::*field, size_t end) const -> F {
    // `end`: offsetof(field) + sizeof(field), as TESSERA_HAS_FIELD computes it.
    return api && api->struct_size >= end ? api->*field : nullptr;
  }
};

#define LOADER_FN(inst, f) \
  ((inst).fn(&TesseraLoaderApi::f, offsetof(TesseraLoaderApi, f) + sizeof(TesseraLoaderApi::f)))

bool is_unsigned(uint32_t t) {
  return t == TESSERA_META_U8 || t == TESSERA_META_U16 || t == TESSERA_META_U32 || t == TESSERA_META_U64;
}

class PluginModelFile final : public ModelFile {
 public:
  PluginModelFile(std::shared_ptr<Instance> inst, TesseraModel* model, const std::string& opened_path)
      : inst_(std::move(inst)), model_(model) {
    try {
      load(opened_path);
    } catch (...) {
      close();
      throw;
    }
  }
  ~PluginModelFile() override { close(); }
  PluginModelFile(const PluginModelFile&) = delete;
  PluginModelFile& operator=(const PluginModelFile&) = delete;

  std::string format() const override { return format_; }
  std::string path() const override { return path_; }
  const Metadata& metadata() const override { return meta_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }

  ModelDescription describe() const override {
    std::lock_guard lock(describe_mu_);
    if (!desc_) desc_ = fetch_description();
    return *desc_;
  }

 private:
  void close() {
    if (!model_) return;
    if (auto close_fn = LOADER_FN(*inst_, close)) {
      try {
        close_fn(model_);
      } catch (...) {
      }
    }
    model_ = nullptr;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("loader plugin " + inst_->name + ": " + what + " (" + path_ + ")");
  }

  void load(const std::string& opened_path) {
    auto format_fn = LOADER_FN(*inst_, format);
    auto path_fn = LOADER_FN(*inst_, path);
    auto size_fn = LOADER_FN(*inst_, file_size);
    const char* f = format_fn ? format_fn(model_) : nullptr;
    const char* p = path_fn ? path_fn(model_) : nullptr;
    format_ = f ? f : "";
    path_ = p ? p : opened_path;
    file_size_ = size_fn ? size_fn(model_) : 0;
    meta_ = read_metadata(TESSERA_VIEW_FILE);
    tensors_ = read_tensors(TESSERA_VIEW_FILE);
  }

  // Value of entry `index` (at `path`, for an element of an array) of a view, with
  // every element of an array value.
  MetaValue read_value(uint32_t view, size_t index, std::vector<uint64_t>& path, const TesseraMetaValue& c,
                       const std::string& key) const {
    MetaValue v;
    v.type = MetaType(c.type);
    switch (c.type) {
      case TESSERA_META_U64: v.value = c.u; break;
      case TESSERA_META_F32: case TESSERA_META_F64: v.value = c.f; break;
      case TESSERA_META_STRING: v.value = c.str ? std::string(c.str, c.str_len) : std::string(); break;
      case TESSERA_META_ARRAY: {
        v.elem_type = MetaType(c.elem_type);
        if (path.size() >= kMaxMetaDepth)
          fail("metadata key '" + printable(key, 200) + "' has arrays nested deeper than " +
               std::to_string(kMaxMetaDepth) + " levels");
        auto get = LOADER_FN(*inst_, meta_get);
        std::vector<MetaValue> items;
        items.reserve(static_cast<size_t>(std::min<uint64_t>(c.count, uint64_t{1} << 20)));
        path.push_back(0);
        for (uint64_t i = 0; i < c.count; ++i) {
          path.back() = i;
          const char* k = nullptr;
          TesseraMetaValue e{};
          if (get(model_, view, index, path.data(), path.size(), &k, &e) != 0)
            fail("metadata key '" + printable(key, 200) + "': element " + std::to_string(i) + " of " +
                 std::to_string(c.count) + " cannot be read");
          items.push_back(read_value(view, index, path, e, key));
        }
        path.pop_back();
        v.value = std::move(items);
        break;
      }
      default:
        // Integers and bool as the readers store them: u64 as uint64, the rest as int64.
        if (is_unsigned(c.type))
          v.value = static_cast<int64_t>(c.u);
        else
          v.value = c.i;
        break;
    }
    return v;
  }

  Metadata read_metadata(uint32_t view) const {
    Metadata md;
    auto count = LOADER_FN(*inst_, meta_count);
    auto get = LOADER_FN(*inst_, meta_get);
    if (!count || !get) return md;
    const size_t n = count(model_, view);
    std::vector<uint64_t> path;
    for (size_t i = 0; i < n; ++i) {
      const char* k = nullptr;
      TesseraMetaValue c{};
      if (get(model_, view, i, nullptr, 0, &k, &c) != 0 || !k)
        fail("metadata entry " + std::to_string(i) + " of " + std::to_string(n) + " cannot be read");
      std::string key(k);
      path.clear();
      MetaValue v = read_value(view, i, path, c, key);
      md.set(std::move(key), std::move(v));
    }
    return md;
  }

  std::vector<TensorInfo> read_tensors(uint32_t view) const {
    std::vector<TensorInfo> out;
    auto count = LOADER_FN(*inst_, tensor_count);
    auto get = LOADER_FN(*inst_, tensor_get);
    if (!count || !get) return out;
    const size_t n = count(model_, view);
    out.reserve(std::min<size_t>(n, size_t{1} << 20));
    constexpr uint32_t kMaxDims = sizeof(TesseraTensorInfo::ne) / sizeof(int64_t);
    for (size_t i = 0; i < n; ++i) {
      TesseraTensorInfo c{};
      if (get(model_, view, i, &c) != 0)
        fail("tensor " + std::to_string(i) + " of " + std::to_string(n) +
             " cannot be read (more than 8 dimensions, or out of range)");
      if (c.n_dims > kMaxDims)
        fail("tensor " + std::to_string(i) + " has " + std::to_string(c.n_dims) + " dimensions (at most 8)");
      TensorInfo t;
      t.name = c.name ? c.name : "";
      t.type = DType(c.type);
      t.ne.assign(c.ne, c.ne + c.n_dims);
      t.offset = c.offset;
      t.file_offset = c.file_offset;
      t.nbytes = c.nbytes;
      t.data = c.data;
      out.push_back(std::move(t));
    }
    return out;
  }

  ModelDescription fetch_description() const {
    auto describe_fn = LOADER_FN(*inst_, describe);
    if (!describe_fn)
      fail("its loader function table (struct_size " + std::to_string(inst_->api ? inst_->api->struct_size : 0) +
           ") has no describe function, so the model cannot be described");
    char error[kMessageSize] = {};
    int32_t rc = -1;
    try {  // the ABI forbids exceptions across it; one that escapes anyway is a failure
      rc = describe_fn(model_, error, sizeof error);
    } catch (const std::exception& e) {
      fail(std::string("describe threw an exception: ") + e.what());
    } catch (...) {
      fail("describe threw an exception (not a std::exception)");
    }
    error[kMessageSize - 1] = '\0';
    if (rc != 0) {
      std::string msg = message(error);
      if (msg.empty()) fail("describe failed (no reason given)");
      throw Error(msg);
    }
    ModelDescription d;
    auto arch_fn = LOADER_FN(*inst_, architecture);
    auto name_fn = LOADER_FN(*inst_, display_name);
    const char* arch = arch_fn ? arch_fn(model_) : nullptr;
    if (!arch) fail("describe gave no architecture");
    d.architecture = arch;
    const char* name = name_fn ? name_fn(model_) : nullptr;
    d.name = name ? name : "";
    d.hparams = read_metadata(TESSERA_VIEW_DESCRIPTION);
    d.tensors = read_tensors(TESSERA_VIEW_DESCRIPTION);
    auto ocount = LOADER_FN(*inst_, origin_count);
    auto oget = LOADER_FN(*inst_, origin_get);
    if (ocount && oget) {
      const size_t n = ocount(model_);
      for (size_t i = 0; i < n; ++i) {
        const char* ours = nullptr;
        const char* theirs = nullptr;
        if (oget(model_, i, &ours, &theirs) != 0 || !ours || !theirs)
          fail("origin entry " + std::to_string(i) + " of " + std::to_string(n) + " cannot be read");
        d.origin[ours] = theirs;
      }
    }
    return d;
  }

  std::shared_ptr<Instance> inst_;  // declared first: outlives the close() in the destructor
  TesseraModel* model_ = nullptr;
  std::string format_, path_;
  Metadata meta_;
  std::vector<TensorInfo> tensors_;
  mutable std::mutex describe_mu_;
  mutable std::optional<ModelDescription> desc_;
};

class PluginLoader final : public ModelLoader {
 public:
  explicit PluginLoader(std::shared_ptr<Instance> inst) : inst_(std::move(inst)) {}

  std::string name() const override { return inst_->name; }

  bool recognizes(const std::string& path) const override {
    auto f = LOADER_FN(*inst_, recognizes);
    if (!f) return false;
    try {
      return f(inst_->self, path.c_str()) != 0;
    } catch (...) {  // the ABI forbids it; a loader that throws does not recognize
      return false;
    }
  }

  std::unique_ptr<ModelFile> open(const std::string& path) const override {
    auto open_fn = LOADER_FN(*inst_, open);
    if (!open_fn) throw Error("loader plugin " + inst_->name + " has no open function");
    char error[kMessageSize] = {};
    TesseraModel* model = nullptr;
    try {  // the ABI forbids exceptions across it; one that escapes anyway is a failure
      model = open_fn(inst_->self, path.c_str(), error, sizeof error);
    } catch (const std::exception& e) {
      throw Error("loader plugin " + inst_->name + ": open threw an exception: " + e.what());
    } catch (...) {
      throw Error("loader plugin " + inst_->name + ": open threw an exception (not a std::exception)");
    }
    error[kMessageSize - 1] = '\0';
    if (!model) {
      std::string msg = message(error);
      if (msg.empty()) msg = "loader plugin " + inst_->name + ": cannot open " + path + " (no reason given)";
      throw Error(msg);
    }
    return std::make_unique<PluginModelFile>(inst_, model, path);
  }

 private:
  std::shared_ptr<Instance> inst_;
};

}  // namespace

std::shared_ptr<ModelLoader> adapt_loader(const std::string& plugin_name, const TesseraPluginDescriptor* desc,
                                          void* instance, std::shared_ptr<void> keep) {
  std::shared_ptr<Instance> inst;
  try {
    inst = std::make_shared<Instance>();
  } catch (...) {
    if (desc && desc->destroy) desc->destroy(instance);
    throw;
  }
  // From here on the Instance owns `instance` (and destroys it, should what follows throw).
  inst->desc = desc;
  inst->self = instance;
  inst->keep = std::move(keep);
  inst->name = plugin_name;
  inst->api = desc && TESSERA_HAS_FIELD(desc, TesseraPluginDescriptor, loader) ? desc->loader : nullptr;
  return std::make_shared<PluginLoader>(std::move(inst));
}

}  // namespace tessera::detail
