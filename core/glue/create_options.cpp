// glue::find_option (plugin_glue.h): reading one create() option the way the ABI
// allows, only as far as the host's struct_size reaches.
#include <cstring>

#include "tessera/plugin_glue.h"

namespace tessera::glue {

const char* find_option(const TesseraCreateArgs* args, const char* key) {
  if (!key || !TESSERA_HAS_FIELD(args, TesseraCreateArgs, option_count) || !args->options) return nullptr;
  for (size_t i = 0; i < args->option_count; ++i) {
    const TesseraOption& o = args->options[i];
    if (o.key && std::strcmp(o.key, key) == 0) return o.value;
  }
  return nullptr;
}

}  // namespace tessera::glue
