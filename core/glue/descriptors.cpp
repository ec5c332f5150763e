// The descriptors of plugins on the glue (plugin_glue.h): every field but the name,
// description, probe, create and flags is the glue's.
#include "tessera/plugin_glue.h"

namespace tessera::glue {

namespace {
TesseraPluginDescriptor descriptor(const char* name, uint32_t kind, const char* description, ProbeFn probe,
                                   CreateFn create) {
  TesseraPluginDescriptor d{};
  d.abi_version = TESSERA_PLUGIN_ABI_VERSION;
  d.struct_size = sizeof(TesseraPluginDescriptor);
  d.name = name;
  d.kind = kind;
  d.description = description;
  d.probe = probe;
  d.create = create;
  return d;
}
}  // namespace

TesseraPluginDescriptor backend_descriptor(const char* name, const char* description, ProbeFn probe, CreateFn create,
                                           uint32_t flags) {
  TesseraPluginDescriptor d = descriptor(name, TESSERA_PLUGIN_BACKEND, description, probe, create);
  d.destroy = &destroy_backend;
  d.backend = &kBackendApi;
  d.flags = flags;
  return d;
}

TesseraPluginDescriptor loader_descriptor(const char* name, const char* description, ProbeFn probe, CreateFn create) {
  TesseraPluginDescriptor d = descriptor(name, TESSERA_PLUGIN_LOADER, description, probe, create);
  d.destroy = &destroy_loader;
  d.loader = &kLoaderApi;
  return d;
}

}  // namespace tessera::glue
