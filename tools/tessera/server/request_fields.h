// Reading a request body's fields: each wrong one is a 400 that names it.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "server/openai_api.h"

namespace tessera::server {

// Throws ApiError(400) naming the field `param`.
[[noreturn]] inline void bad(const std::string& param, const std::string& message,
                             const std::string& code = "invalid_value") {
  throw ApiError(400, message, param, code);
}

// A field that may be absent or null (false, `out` untouched); if present it must have
// the right type (bool, an integer in T's range, a finite number).
template <typename T>
bool get(const RequestJson& body, const char* key, T& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean", "invalid_type");
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
    const int64_t v = it->get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      bad(key, std::string("'") + key + "' is out of range");
    out = T(v);
  } else {
    if (!it->is_number()) bad(key, std::string("'") + key + "' must be a number", "invalid_type");
    out = it->get<T>();
    if (!std::isfinite(double(out))) bad(key, std::string("'") + key + "' must be finite");
  }
  return true;
}

}  // namespace tessera::server
