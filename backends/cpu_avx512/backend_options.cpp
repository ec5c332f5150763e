// cpu_avx512's create() options (cpu_avx512_backend.h). No ISA flags: read by create()
// before the CPU check, and by cpu_amx's.
#include <string>

#include "cpu_avx512_backend.h"
#include "tessera/error.h"
#include "tessera/plugin_glue.h"

namespace tessera::cpu_avx512 {

bool take_option(Options& o, std::string_view key, std::string_view value) {
  const std::string v(value);
  if (key == "repack") {
    o.repack = glue::option_flag(value).value_or(true);  // anything but an explicit "off" keeps it
  } else if (key == "decode_tiles") {
    if (v != "1" && v != "2" && v != "4") throw Error("option decode_tiles must be 1, 2 or 4, not '" + v + "'");
    o.decode_tiles = std::stoi(v);
  } else if (key == "decode_prefetch") {
    const std::optional<bool> on = glue::option_flag(value);
    if (!on) throw Error("option decode_prefetch must be true or false, not '" + v + "'");
    o.decode_prefetch = *on ? 1 : 0;
  } else {
    return false;
  }
  return true;
}

}  // namespace tessera::cpu_avx512
