// The plugin side of the C plugin ABI for plugins written against libtessera_core's
// C++ classes (every bundled plugin): it turns a tessera::Backend or
// tessera::ModelLoader into the C function tables of plugin_abi.h, so that only C
// structs cross between tessera and the plugin, and no exception leaves the plugin.
// It is a static library (tessera_plugin_glue) compiled into each plugin. A plugin
// that does not use the C++ classes needs none of it: plugin_abi.h is the whole
// contract (examples/backend_plugin is such a plugin).
#pragma once
#include <functional>
#include <memory>

#include "tessera/plugin_abi.h"
#include "tessera/pool_ref.h"

namespace tessera {
class Backend;
class ModelLoader;
}  // namespace tessera

namespace tessera::glue {

// ---- Backends ----
// The table every glued backend plugin puts into its descriptor's `backend` field.
extern const TesseraBackendApi kBackendApi;
// create(): runs `make` (which may throw) with the host's pool and arguments and wraps
// the backend it returns; NULL with "NAME: message" in error when it throws.
using MakeBackend = std::function<std::unique_ptr<Backend>(PoolRef pool, const TesseraCreateArgs* args)>;
void* create_backend(const char* plugin_name, const TesseraCreateArgs* args, char* error, size_t error_size,
                     const MakeBackend& make);
void destroy_backend(void* instance);

// ---- Loaders ----
extern const TesseraLoaderApi kLoaderApi;
using MakeLoader = std::function<std::unique_ptr<ModelLoader>(const TesseraCreateArgs* args)>;
void* create_loader(const char* plugin_name, const TesseraCreateArgs* args, char* error, size_t error_size,
                    const MakeLoader& make);
void destroy_loader(void* instance);

// The option `key` from the create arguments, or nullptr (reads only what the host's
// struct_size covers).
const char* find_option(const TesseraCreateArgs* args, const char* key);

}  // namespace tessera::glue
