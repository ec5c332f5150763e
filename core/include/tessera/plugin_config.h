// plugins.toml: where plugins are searched, which are enabled, rank overrides and
// per-backend options. The command line can override everything here.
//
//   [plugins]
//   paths = ["lib/tessera/plugins"]   # relative paths are relative to the toml file
//   disable = ["vulkan"]               # never load these
//
//   [backend.NAME]
//   rank = 50                          # replaces the probe score for ordering
//   options = { key = "value" }        # passed to the plugin's create()
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct PluginSettings {
  bool enabled = true;
  std::optional<int> rank;  // overrides the probe score when ranking (0 disables)
  std::map<std::string, std::string> options;
};

struct PluginConfig {
  std::vector<std::string> paths;  // folders searched for plugin .so files
  std::map<std::string, PluginSettings> plugins;  // by plugin name

  // Parse a plugins.toml; throws tessera::Error naming the file, line and problem.
  static PluginConfig from_file(const std::string& path);
  static PluginConfig from_string(std::string_view toml, const std::string& base_dir);
  // The default: the build/installed plugin folder next to the executable.
  static PluginConfig defaults();
  // Look for plugins.toml: $TESSERA_PLUGINS_TOML, $XDG_CONFIG_HOME/tessera (else
  // ~/.config/tessera), <exe>/../share/tessera; never the current folder. Falls back
  // to defaults() when none exists.
  static PluginConfig discover();

  const PluginSettings* settings(const std::string& name) const;
};

}  // namespace tessera
