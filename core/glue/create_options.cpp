// Reading create() options (plugin_glue.h) the way the ABI allows, only as far as
// the host's struct_size reaches.
#include <cctype>
#include <cstring>
#include <string>

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

void for_each_option(const TesseraCreateArgs* args,
                     const std::function<void(std::string_view key, std::string_view value)>& visit) {
  if (!TESSERA_HAS_FIELD(args, TesseraCreateArgs, option_count) || !args->options) return;
  for (size_t i = 0; i < args->option_count; ++i) {
    const TesseraOption& o = args->options[i];
    if (o.key && o.value) visit(o.key, o.value);
  }
}

std::optional<bool> option_flag(std::string_view value) {
  std::string v;
  for (char c : value) v += char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return std::nullopt;
}

}  // namespace tessera::glue
