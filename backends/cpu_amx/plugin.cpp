// Plugin entry of the cpu_amx backend. Compiled WITHOUT ISA flags: probe() and
// create() run on any x86-64 CPU; the tile kernels are only reached through a backend
// that create() made after the hardware check (or for the emulator).
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "cpu_amx_backend.h"
#include "cpu_avx512_backend.h"
#include "tessera/error.h"
#include "tessera/plugin_abi.h"
#include "tessera/plugin_glue.h"
#include "tessera/plugin_config.h"

namespace {


// probe() receives no options, so it reads `emulate` from the plugins.toml the host
// discovers ([backend.cpu_amx] options = { emulate = true }); an unreadable file
// counts as not asking.
bool emulation_requested_by_config() {
  try {
    const tessera::PluginConfig cfg = tessera::PluginConfig::discover();
    if (const tessera::PluginSettings* s = cfg.settings("cpu_amx")) {
      auto it = s->options.find("emulate");
      return it != s->options.end() && tessera::glue::option_flag(it->second).value_or(false);
    }
  } catch (...) {
  }
  return false;
}

int32_t probe(char* reason, size_t reason_size) {
  try {
    std::string why;
    const bool hw = tessera::cpu_amx::hardware_usable(&why);
    const bool env = tessera::cpu_amx::emulation_requested_by_env();
    const bool emulate = env || emulation_requested_by_config();
    std::string note;
    int32_t score = 0;
    if (emulate) {
      // Usable for testing, ranked below cpu_avx512 (50): never chosen over it by default.
      note = std::string("emulated (") + (env ? "TESSERA_AMX_EMULATE" : "plugins.toml emulate = true") +
             "): tile instructions in software, for testing" + (hw ? "; real AMX is present" : "");
      score = 2 * TESSERA_SCORE_PORTABLE;  // emulated: below cpu_avx512, above cpu_scalar
    } else if (hw) {
      note = "AMX tile/int8/bf16 usable (CPUID, XCR0, arch_prctl)";
      score = TESSERA_SCORE_CPU_MATRIX;
    } else {
      note = "needs AMX: " + why + " (TESSERA_AMX_EMULATE=1 emulates it, for testing)";
    }
    if (reason && reason_size) std::snprintf(reason, reason_size, "%s", note.c_str());
    return score;
  } catch (...) {
    if (reason && reason_size) std::snprintf(reason, reason_size, "cpu_amx: probe failed");
    return 0;
  }
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  return tessera::glue::create_backend("cpu_amx", args, error, error_size,
                                        [&](tessera::PoolRef pool, const TesseraCreateArgs* args)
                                            -> std::unique_ptr<tessera::Backend> {
      // Options: `emulate` (true/false), `min_columns` (integer >= 1: fewest activation
      // rows a tile product takes), and cpu_avx512's `repack`, `decode_tiles`,
      // `decode_prefetch` for the wrapped backend.
      tessera::cpu_amx::Options o;
      o.emulate = tessera::cpu_amx::emulation_requested_by_env();
      tessera::glue::for_each_option(args, [&](std::string_view k, std::string_view value) {
        const std::string v(value);
        if (k == "emulate") {
          const std::optional<bool> on = tessera::glue::option_flag(v);
          if (!on) throw tessera::Error("option emulate must be true or false, not '" + v + "'");
          o.emulate = o.emulate || *on;  // the environment's request stands
        } else if (k == "min_columns") {
          size_t used = 0;
          long long n = 0;
          try {
            n = std::stoll(v, &used);
          } catch (...) {
            used = 0;
          }
          if (used != v.size() || n < 1) throw tessera::Error("option min_columns must be an integer >= 1, not '" + v + "'");
          o.min_columns = n;
        } else {
          tessera::cpu_avx512::take_option(o.avx512, k, value);
        }
      });
      return tessera::cpu_amx::make_backend(pool, o);
  });
}

const TesseraPluginDescriptor kDescriptor = tessera::glue::backend_descriptor(
    "cpu_amx", "AMX tile products (Q8_0/Q4_0) for prefill and expert batches; everything else as cpu_avx512", &probe,
    &create);

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
