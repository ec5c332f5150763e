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
#include <optional>
#include <string_view>

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

// The descriptor of a plugin on the glue: its name, one line for `tessera backends`,
// its probe and create functions (create calls create_backend / create_loader), and
// for a backend its TesseraPluginFlags.
using ProbeFn = int32_t (*)(char* reason, size_t reason_size);
using CreateFn = void* (*)(const TesseraCreateArgs* args, char* error, size_t error_size);
TesseraPluginDescriptor backend_descriptor(const char* name, const char* description, ProbeFn probe, CreateFn create,
                                           uint32_t flags = 0);
TesseraPluginDescriptor loader_descriptor(const char* name, const char* description, ProbeFn probe, CreateFn create);

// The option `key` from the create arguments, or nullptr (reads only what the host's
// struct_size covers).
const char* find_option(const TesseraCreateArgs* args, const char* key);
// Every option of the create arguments, in order (as far as struct_size reaches;
// options without a key or value are passed over).
void for_each_option(const TesseraCreateArgs* args,
                     const std::function<void(std::string_view key, std::string_view value)>& visit);
// An option's value as a switch: "true", "1", "yes", "on" (any case) are true,
// "false", "0", "no", "off" false, anything else neither.
std::optional<bool> option_flag(std::string_view value);

}  // namespace tessera::glue
