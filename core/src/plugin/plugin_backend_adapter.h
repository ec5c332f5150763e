// The host side of a backend plugin: a tessera::Backend that calls the plugin's C
// function table (plugin_abi.h), passing the graph as C arrays and turning the
// plugin's error codes into tessera::Error.
#pragma once
#include <memory>
#include <string>

#include "tessera/backend.h"
#include "tessera/plugin_abi.h"

namespace tessera::detail {

// Wraps instance `self`, created from `desc` (whose backend table the registry has
// checked); destroys it with desc->destroy when the backend is destroyed. `keep` keeps
// the plugin's shared library loaded at least that long.
std::shared_ptr<Backend> adapt_backend(const std::string& plugin_name, const TesseraPluginDescriptor* desc,
                                       void* self, std::shared_ptr<void> keep);

// "" when `api` holds every function a backend must provide, else what is missing
// ("backend function table lacks 'execute'").
std::string check_backend_table(const TesseraBackendApi* api);

}  // namespace tessera::detail
