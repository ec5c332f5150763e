// Text from a file (metadata strings, tensor names) or a plugin, made safe to show a
// person on a terminal, on one line: C0 controls (newline and ESC included), DEL, C1
// controls and bytes that are not valid UTF-8 become \xNN, Unicode bidirectional
// overrides and isolates (U+202A-202E, U+2066-2069) become \u{NNNN}; everything else
// (printable ASCII, valid UTF-8) stays. If max_len > 0, output longer than max_len
// bytes is cut at a character boundary and ends in "...".
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

std::string printable(std::string_view s, size_t max_len = 0);

}  // namespace tessera
