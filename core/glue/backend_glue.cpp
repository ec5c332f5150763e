// The plugin side of a backend plugin written on core's C++ classes
// (plugin_glue.h): the C table forwards to the wrapped tessera::Backend. The host's
// C graph is mirrored into a tessera::Graph of the plugin's own, rebuilt when the
// host graph's (id, generation) changes and otherwise refreshed field by field, so a
// step costs one pass over its tensors; a few recent graphs keep their mirrors (an
// engine alternates a prefill and a decode graph). No exception leaves a function.
#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/kv_access.h"
#include "tessera/plugin_glue.h"

namespace tessera::glue {

namespace {

struct Mirror {
  uint64_t id = 0, generation = 0, last_use = 0;
  std::unique_ptr<Graph> graph;
};

struct BackendInstance {
  std::string name;
  std::unique_ptr<Backend> impl;
  std::array<Mirror, 4> mirrors;
  uint64_t clock = 0;
};

BackendInstance& instance(void* self) { return *static_cast<BackendInstance*>(self); }

void write(char* buf, size_t size, const char* text) {
  if (buf && size) std::snprintf(buf, size, "%s", text);
}

// Everything of a C tensor but its name.
void assign(Tensor& t, const TesseraTensor& c) {
  t.type = DType(c.type);
  for (int d = 0; d < 4; ++d) {
    t.ne[d] = c.ne[d];
    t.nb[d] = c.nb[d];
  }
  t.data = c.data;
  t.buffer = static_cast<Buffer*>(c.buffer);
}

Tensor from_c(const TesseraTensor& c) {
  Tensor t;
  assign(t, c);
  return t;
}

Graph& mirror(BackendInstance& b, const TesseraGraph* g, bool refresh) {
  Mirror* m = nullptr;
  for (Mirror& x : b.mirrors)
    if (x.graph && x.id == g->id) m = &x;
  if (!m) {
    m = &b.mirrors[0];
    for (Mirror& x : b.mirrors)
      if (x.last_use < m->last_use) m = &x;
    m->id = 0;
  }
  m->last_use = ++b.clock;
  if (!m->graph) m->graph = std::make_unique<Graph>();
  Graph& graph = *m->graph;
  if (m->id != g->id || m->generation != g->generation || graph.tensor_count() != g->tensor_count ||
      graph.nodes().size() != g->node_count) {
    graph.reset();
    for (size_t i = 0; i < g->tensor_count; ++i) {
      Tensor t = from_c(g->tensors[i]);
      t.name = g->tensors[i].name ? g->tensors[i].name : "";
      graph.add_tensor(t);
    }
    for (size_t i = 0; i < g->node_count; ++i) {
      const TesseraNode& c = g->nodes[i];
      Node n;
      n.op = Op(c.op);
      n.dst = c.dst;
      for (int k = 0; k < 4; ++k) n.src[k] = c.src[k];
      n.src[4] = c.src4;
      for (int k = 0; k < 8; ++k) n.i[k] = c.i[k];
      for (int k = 0; k < 4; ++k) n.f[k] = c.f[k];
      n.kv = static_cast<KvAccess*>(c.kv);
      graph.add_node(n);
    }
    m->id = g->id;
    m->generation = g->generation;
  } else if (refresh) {
    for (size_t i = 0; i < g->tensor_count; ++i) assign(graph.tensor(int32_t(i)), g->tensors[i]);
  }
  return graph;
}

int32_t c_uses_host_memory(void* self) {
  try {
    return instance(self).impl->uses_host_memory() ? 1 : 0;
  } catch (...) {
    return 1;
  }
}

int32_t c_fusion_window(void* self) {
  try {
    return instance(self).impl->fusion_window();
  } catch (...) {
    return 1;
  }
}

int32_t c_supports(void* self, const TesseraGraph* g, size_t node, char* reason, size_t reason_size) {
  try {
    BackendInstance& b = instance(self);
    if (node >= g->node_count) throw Error("supports(): node " + std::to_string(node) + " is not in the graph");
    Graph& graph = mirror(b, g, false);
    const OpSupport s = b.impl->supports(graph, graph.nodes()[node]);
    if (!s.supported) write(reason, reason_size, s.reason.c_str());
    return s.supported ? 1 : 0;
  } catch (const std::exception& e) {
    write(reason, reason_size, e.what());
  } catch (...) {
    write(reason, reason_size, "supports() failed");
  }
  return 0;
}

int32_t c_execute(void* self, TesseraGraph* g, size_t first, size_t count, uint32_t /*flags*/, char* error,
                  size_t error_size) {
  try {
    BackendInstance& b = instance(self);
    Graph& graph = mirror(b, g, true);
    b.impl->execute_validated(graph, first, count);
    return 0;
  } catch (const std::exception& e) {
    write(error, error_size, e.what());
  } catch (...) {
    write(error, error_size, (instance(self).name + ": execute failed").c_str());
  }
  return -1;
}

int32_t c_prepare_weight(void* self, TesseraTensor* w, char* error, size_t error_size) {
  try {
    Tensor t = from_c(*w);
    t.name = w->name ? w->name : "";
    instance(self).impl->prepare_weight(t);
    w->type = uint32_t(t.type);
    for (int d = 0; d < 4; ++d) {
      w->ne[d] = t.ne[d];
      w->nb[d] = t.nb[d];
    }
    w->data = t.data;
    w->buffer = t.buffer;
    return 0;
  } catch (const std::exception& e) {
    write(error, error_size, e.what());
  } catch (...) {
    write(error, error_size, (instance(self).name + ": prepare_weight failed").c_str());
  }
  return -1;
}

int32_t c_weight_bytes(void* self, const TesseraTensor* w, const void** data, size_t* bytes) {
  try {
    Tensor t = from_c(*w);
    const std::span<const std::byte> s = instance(self).impl->weight_bytes(t);
    *data = s.data();
    *bytes = s.size();
    return 0;
  } catch (...) {
    *data = nullptr;
    *bytes = 0;
    return -1;
  }
}

int32_t c_transfers(void* self, uint64_t* upload_bytes, uint64_t* download_bytes) {
  try {
    const TransferStats t = instance(self).impl->transfers();
    *upload_bytes = t.upload_bytes;
    *download_bytes = t.download_bytes;
    return 0;
  } catch (...) {
    return -1;
  }
}

// The plugin's buffers cross as the Buffer* of the backend's alloc_buffer (the host
// keeps it as a handle and passes it back in TesseraTensor::buffer).
void* c_buffer_alloc(void* self, uint32_t usage, size_t bytes, void** host_ptr, char* error, size_t error_size) {
  try {
    if (usage > uint32_t(BufferUsage::Scratch)) throw Error("unknown buffer usage " + std::to_string(usage));
    std::unique_ptr<Buffer> b = instance(self).impl->alloc_buffer(bytes, BufferUsage(usage));
    *host_ptr = b->data();
    return b.release();
  } catch (const std::exception& e) {
    write(error, error_size, e.what());
  } catch (...) {
    write(error, error_size, "buffer_alloc failed");
  }
  return nullptr;
}

void c_buffer_free(void*, void* buffer) {
  try {
    delete static_cast<Buffer*>(buffer);
  } catch (...) {
  }
}

template <typename F>
int32_t buffer_call(F&& f, char* error, size_t error_size) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    write(error, error_size, e.what());
  } catch (...) {
    write(error, error_size, "buffer operation failed");
  }
  return -1;
}

int32_t c_buffer_set(void*, void* buffer, size_t offset, const void* src, size_t bytes, char* error, size_t error_size) {
  return buffer_call([&] { static_cast<Buffer*>(buffer)->set(offset, src, bytes); }, error, error_size);
}
int32_t c_buffer_get(void*, void* buffer, size_t offset, void* dst, size_t bytes, char* error, size_t error_size) {
  return buffer_call([&] { static_cast<Buffer*>(buffer)->get(offset, dst, bytes); }, error, error_size);
}
int32_t c_buffer_copy(void*, void* buffer, size_t dst_offset, size_t src_offset, size_t bytes, char* error,
                      size_t error_size) {
  return buffer_call([&] { static_cast<Buffer*>(buffer)->copy(dst_offset, src_offset, bytes); }, error, error_size);
}

}  // namespace

const TesseraBackendApi kBackendApi = {
    sizeof(TesseraBackendApi), &c_uses_host_memory, &c_supports, &c_execute, &c_prepare_weight, &c_weight_bytes,
    &c_transfers, &c_buffer_alloc, &c_buffer_free, &c_buffer_set, &c_buffer_get, &c_buffer_copy, &c_fusion_window,
};

void* create_backend(const char* plugin_name, const TesseraCreateArgs* args, char* error, size_t error_size,
                     const MakeBackend& make) {
  try {
    TesseraPool* pool = TESSERA_HAS_FIELD(args, TesseraCreateArgs, pool) ? args->pool : nullptr;
    auto b = std::make_unique<BackendInstance>();
    b->name = plugin_name;
    b->impl = make(PoolRef(pool), args);
    if (!b->impl) throw Error("no backend created");
    return b.release();
  } catch (const std::exception& e) {
    write(error, error_size, (std::string(plugin_name) + ": " + e.what()).c_str());
  } catch (...) {
    write(error, error_size, (std::string(plugin_name) + ": unknown error").c_str());
  }
  return nullptr;
}

void destroy_backend(void* self) {
  try {
    delete static_cast<BackendInstance*>(self);
  } catch (...) {
  }
}

}  // namespace tessera::glue
