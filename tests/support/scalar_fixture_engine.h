// A fixture model from ../shared/fixtures on cpu_scalar, for the runtime tests that
// drive an Engine (null when the fixture is absent: the caller skips, saying why).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "tessera/engine.h"
#include "tessera/plugin_registry.h"

namespace tessera::test {

struct ScalarFixtureEngine {
  std::unique_ptr<PluginRegistry> registry;
  std::unique_ptr<Engine> engine;
  std::string path;  // the fixture's file
};

inline ScalarFixtureEngine scalar_fixture_engine(const std::string& model, int64_t n_ctx, int max_sequences) {
  ScalarFixtureEngine f;
  f.path = std::string(TESSERA_FIXTURES_DIR) + "/models/" + model + ".gguf";
  if (!std::filesystem::exists(f.path)) return f;
  PluginConfig cfg;
  cfg.paths = {TESSERA_PLUGIN_DIR};
  f.registry = std::make_unique<PluginRegistry>(cfg);
  EngineOptions eo;
  eo.model_path = f.path;
  eo.backends = {"cpu_scalar"};
  eo.threads = 2;
  eo.n_ctx = n_ctx;
  eo.max_sequences = max_sequences;
  f.engine = std::make_unique<Engine>(*f.registry, eo);
  return f;
}

}  // namespace tessera::test
