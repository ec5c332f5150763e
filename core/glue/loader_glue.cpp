// The loader half of the plugin glue (tessera/plugin_glue.h): a tessera::ModelLoader
// and the ModelFiles it opens, behind the C function table TesseraLoaderApi. Only C
// structs and pointers into memory the model owns leave these functions; every C++
// exception is caught here and becomes an error return (with its message where the
// function has an error buffer).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/model_description.h"
#include "tessera/model_file.h"
#include "tessera/plugin_glue.h"

namespace {

using tessera::Metadata;
using tessera::MetaType;
using tessera::MetaValue;
using tessera::ModelDescription;
using tessera::ModelFile;
using tessera::ModelLoader;
using tessera::TensorInfo;

void write_error(char* error, size_t error_size, const char* msg) {
  if (!error || error_size == 0) return;
  std::snprintf(error, error_size, "%s", msg ? msg : "");
}

// Runs `f`, turning any exception into its message in the error buffer; returns
// whether f completed.
template <typename F>
bool guarded(char* error, size_t error_size, F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
  } catch (...) {
    write_error(error, error_size, "unknown exception (not a std::exception)");
  }
  return false;
}

struct LoaderInstance {
  std::string plugin_name;
  std::unique_ptr<ModelLoader> loader;
};

// One view's metadata as an array of (key, value) in the Metadata map's order, so
// meta_get is an index (the map's nodes, hence the pointers, are stable).
struct MetaIndex {
  std::vector<std::pair<const std::string*, const MetaValue*>> entries;
  void build(const Metadata& md) {
    entries.clear();
    entries.reserve(md.all().size());
    for (const auto& [k, v] : md.all()) entries.emplace_back(&k, &v);
  }
};

// Fills `out` from `v`. Integers land in both i and u (the same bits; the reader takes
// i for signed types and bool, u for unsigned ones), floats in f; strings and array
// counts as the ABI says. Pointers point into `v`.
void fill_value(const MetaValue& v, TesseraMetaValue* out) {
  *out = TesseraMetaValue{};
  out->type = static_cast<uint32_t>(v.type);
  out->elem_type = static_cast<uint32_t>(v.elem_type);
  if (const auto* i = std::get_if<int64_t>(&v.value)) {
    out->i = *i;
    out->u = static_cast<uint64_t>(*i);
    out->f = static_cast<double>(*i);
  } else if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    out->u = *u;
    out->i = static_cast<int64_t>(*u);
    out->f = static_cast<double>(*u);
  } else if (const auto* d = std::get_if<double>(&v.value)) {
    out->f = *d;
    if (is_integer_type(v.type)) {  // not a shape the readers make; keep the number anyway
      out->i = static_cast<int64_t>(*d);
      out->u = static_cast<uint64_t>(out->i);
    }
  } else if (const auto* s = std::get_if<std::string>(&v.value)) {
    out->str = s->data();
    out->str_len = s->size();
  } else if (const auto* a = std::get_if<std::vector<MetaValue>>(&v.value)) {
    out->count = a->size();
  }
}

}  // namespace

// The plugin's model: the ModelFile, and what the queries answer from (built once).
struct TesseraModel {
  std::unique_ptr<ModelFile> file;
  std::string format, path;
  uint64_t file_size = 0;
  const Metadata* file_meta = nullptr;
  const std::vector<TensorInfo>* file_tensors = nullptr;
  MetaIndex meta[2];  // by TesseraModelView

  std::mutex describe_mu;  // describe() is not reentrant; the views are read-only afterwards
  std::atomic<bool> described{false};
  ModelDescription desc;
  std::vector<std::pair<const std::string*, const std::string*>> origin;

  const std::vector<TensorInfo>* tensors(uint32_t view) const {
    if (view == TESSERA_VIEW_FILE) return file_tensors;
    if (view == TESSERA_VIEW_DESCRIPTION && described) return &desc.tensors;
    return nullptr;
  }
  const MetaIndex* metadata(uint32_t view) const {
    if (view == TESSERA_VIEW_FILE) return &meta[0];
    if (view == TESSERA_VIEW_DESCRIPTION && described) return &meta[1];
    return nullptr;
  }
};

namespace {

LoaderInstance* instance_of(void* self) { return static_cast<LoaderInstance*>(self); }

int32_t glue_recognizes(void* self, const char* path) {
  try {
    if (!self || !path) return 0;
    return instance_of(self)->loader->recognizes(path) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

TesseraModel* glue_open(void* self, const char* path, char* error, size_t error_size) {
  if (!self || !path) {
    write_error(error, error_size, "open: no loader or no path");
    return nullptr;
  }
  TesseraModel* result = nullptr;
  guarded(error, error_size, [&] {
    auto m = std::make_unique<TesseraModel>();
    m->file = instance_of(self)->loader->open(path);
    if (!m->file) throw std::runtime_error(instance_of(self)->plugin_name + ": open returned no model for " + path);
    m->format = m->file->format();
    m->path = m->file->path();
    m->file_size = m->file->file_size();
    m->file_meta = &m->file->metadata();
    m->file_tensors = &m->file->tensors();
    m->meta[0].build(*m->file_meta);
    result = m.release();
  });
  return result;
}

void glue_close(TesseraModel* model) {
  try {
    delete model;
  } catch (...) {
  }
}

const char* glue_format(const TesseraModel* model) { return model ? model->format.c_str() : nullptr; }
const char* glue_path(const TesseraModel* model) { return model ? model->path.c_str() : nullptr; }
uint64_t glue_file_size(const TesseraModel* model) { return model ? model->file_size : 0; }

size_t glue_meta_count(const TesseraModel* model, uint32_t view) {
  if (!model) return 0;
  const MetaIndex* mi = model->metadata(view);
  return mi ? mi->entries.size() : 0;
}

int32_t glue_meta_get(const TesseraModel* model, uint32_t view, size_t index, const uint64_t* path, size_t depth,
                      const char** key, TesseraMetaValue* value) {
  if (!model) return -1;
  const MetaIndex* mi = model->metadata(view);
  if (!mi || index >= mi->entries.size() || (depth > 0 && !path)) return -1;
  const auto& [k, v0] = mi->entries[index];
  const MetaValue* v = v0;
  for (size_t d = 0; d < depth; ++d) {
    const auto* arr = std::get_if<std::vector<MetaValue>>(&v->value);
    if (!arr || path[d] >= arr->size()) return -1;
    v = &(*arr)[static_cast<size_t>(path[d])];
  }
  if (key) *key = k->c_str();
  if (value) fill_value(*v, value);
  return 0;
}

size_t glue_tensor_count(const TesseraModel* model, uint32_t view) {
  if (!model) return 0;
  const auto* ts = model->tensors(view);
  return ts ? ts->size() : 0;
}

int32_t glue_tensor_get(const TesseraModel* model, uint32_t view, size_t index, TesseraTensorInfo* info) {
  if (!model || !info) return -1;
  const auto* ts = model->tensors(view);
  if (!ts || index >= ts->size()) return -1;
  const TensorInfo& t = (*ts)[index];
  constexpr size_t kMaxDims = sizeof(info->ne) / sizeof(info->ne[0]);
  if (t.ne.size() > kMaxDims) return -1;
  *info = TesseraTensorInfo{};
  info->name = t.name.c_str();
  info->type = static_cast<uint32_t>(t.type);
  info->n_dims = static_cast<uint32_t>(t.ne.size());
  for (size_t d = 0; d < t.ne.size(); ++d) info->ne[d] = t.ne[d];
  info->offset = t.offset;
  info->file_offset = t.file_offset;
  info->nbytes = t.nbytes;
  info->data = t.data;
  return 0;
}

int32_t glue_describe(TesseraModel* model, char* error, size_t error_size) {
  if (!model) {
    write_error(error, error_size, "describe: no model");
    return -1;
  }
  bool ok = guarded(error, error_size, [&] {
    std::lock_guard lock(model->describe_mu);
    // Described once: the views' pointers stay valid while the model is open.
    if (model->described) return;
    model->desc = model->file->describe();
    model->meta[1].build(model->desc.hparams);
    model->origin.clear();
    model->origin.reserve(model->desc.origin.size());
    for (const auto& [ours, theirs] : model->desc.origin) model->origin.emplace_back(&ours, &theirs);
    model->described.store(true, std::memory_order_release);
  });
  if (!ok) {
    // A half-built description is dropped; a later call tries again.
    std::lock_guard lock(model->describe_mu);
    if (!model->described) {
      model->desc = ModelDescription{};
      model->meta[1].entries.clear();
      model->origin.clear();
    }
  }
  return ok ? 0 : -1;
}

const char* glue_architecture(const TesseraModel* model) {
  return model && model->described ? model->desc.architecture.c_str() : nullptr;
}
const char* glue_display_name(const TesseraModel* model) {
  return model && model->described ? model->desc.name.c_str() : nullptr;
}
size_t glue_origin_count(const TesseraModel* model) {
  return model && model->described ? model->origin.size() : 0;
}
int32_t glue_origin_get(const TesseraModel* model, size_t index, const char** tessera_name, const char** file_name) {
  if (!model || !model->described || index >= model->origin.size()) return -1;
  if (tessera_name) *tessera_name = model->origin[index].first->c_str();
  if (file_name) *file_name = model->origin[index].second->c_str();
  return 0;
}

}  // namespace

namespace tessera::glue {

const TesseraLoaderApi kLoaderApi = {
    sizeof(TesseraLoaderApi),
    &glue_recognizes,
    &glue_open,
    &glue_close,
    &glue_format,
    &glue_path,
    &glue_file_size,
    &glue_meta_count,
    &glue_meta_get,
    &glue_tensor_count,
    &glue_tensor_get,
    &glue_describe,
    &glue_architecture,
    &glue_display_name,
    &glue_origin_count,
    &glue_origin_get,
};

void* create_loader(const char* plugin_name, const TesseraCreateArgs* args, char* error, size_t error_size,
                    const MakeLoader& make) {
  const char* name = plugin_name ? plugin_name : "loader";
  auto fail = [&](const char* msg) {
    if (error && error_size > 0) std::snprintf(error, error_size, "%s: %s", name, msg);
  };
  try {
    auto inst = std::make_unique<LoaderInstance>();
    inst->plugin_name = name;
    inst->loader = make(args);
    if (!inst->loader) {
      fail("create returned no loader");
      return nullptr;
    }
    return inst.release();
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("unknown exception (not a std::exception)");
  }
  return nullptr;
}

void destroy_loader(void* instance) {
  try {
    delete static_cast<LoaderInstance*>(instance);
  } catch (...) {
  }
}

}  // namespace tessera::glue
