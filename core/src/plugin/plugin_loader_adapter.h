// The host side of a loader plugin: a tessera::ModelLoader that calls the plugin's C
// function table (TesseraLoaderApi in plugin_abi.h). The ModelFiles it opens copy the
// plugin's metadata and tensor descriptors into tessera's C++ types once (tensor data
// stays the plugin's mapping, open until the ModelFile is destroyed), and turn the
// plugin's error returns into tessera::Error with the plugin's message.
#pragma once
#include <memory>
#include <string>

#include "tessera/model_file.h"
#include "tessera/plugin_abi.h"

namespace tessera::detail {

// Wraps a loader plugin instance created from `desc` (desc->loader is a valid table whose
// required functions the registry has checked). The instance is destroyed with desc->destroy
// once the returned loader and every ModelFile it opened are gone; `keep` keeps the plugin's
// shared library loaded at least that long.
std::shared_ptr<ModelLoader> adapt_loader(const std::string& plugin_name, const TesseraPluginDescriptor* desc,
                                          void* instance, std::shared_ptr<void> keep);

}  // namespace tessera::detail
