// Finds plugin .so files, checks their ABI, probes and ranks them, and creates
// backend and loader instances. Every plugin found is kept in records(), including
// the refused and unusable ones with the reason, so `tessera backends` can show them.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/plugin_abi.h"
#include "tessera/plugin_config.h"

namespace tessera {

class Backend;
class ModelLoader;
class FastPool;

struct PluginRecord {
  std::string name;   // from the descriptor ("" if it could not be read)
  std::string file;   // path of the .so
  std::string kind;   // "backend" | "loader" | "?"
  std::string description;
  int score = 0;      // probe score
  int rank = 0;       // effective rank: the config override or the score
  bool usable = false;
  bool reference = false;  // the descriptor's TESSERA_PLUGIN_REFERENCE
  std::string reason; // why not usable (ABI mismatch, probe reason, disabled, ...);
                      // for a usable plugin the probe's note, if it wrote one
};

class PluginRegistry {
 public:
  explicit PluginRegistry(PluginConfig config);
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Every plugin file found, usable first by descending rank, then the unusable ones.
  const std::vector<PluginRecord>& records() const { return records_; }
  const PluginConfig& config() const { return config_; }

  // Usable backend names by descending rank.
  std::vector<std::string> ranked_backends() const;
  // The record of a plugin by name (usable or not); nullptr if none has that name.
  const PluginRecord* find(const std::string& name) const;
  // The usable reference backend (TESSERA_PLUGIN_REFERENCE) of highest rank, or nullptr.
  const PluginRecord* reference_backend() const;

  // Create a backend by name; throws tessera::Error if unknown or unusable.
  // `options` (e.g. from the command line) are added to, and override, the
  // [backend.NAME] options of plugins.toml. The returned object keeps the plugin's
  // shared library loaded for as long as it lives.
  std::shared_ptr<Backend> create_backend(const std::string& name, FastPool* pool,
                                          const std::map<std::string, std::string>& options = {}) const;
  // Create every usable loader, best-ranked first.
  std::vector<std::shared_ptr<ModelLoader>> create_loaders() const;

 private:
  struct Loaded;
  void scan();
  // create() with the host's arguments; the raw instance, or throws with the reason.
  void* create_instance(const Loaded& p, FastPool* pool, const std::map<std::string, std::string>& options) const;

  PluginConfig config_;
  std::vector<PluginRecord> records_;
  std::vector<std::unique_ptr<Loaded>> loaded_;  // parallel to the usable records
};

}  // namespace tessera
