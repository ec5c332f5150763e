// Python's str methods on UTF-8 text, counted in code points as Python counts them.
// Shared by the string methods ("a".strip()) and the filters (|trim, |title ...).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::chat_template::pystr {

// strip/lstrip/rstrip; chars = nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string swapcase(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
// sep = nullopt splits on runs of whitespace; maxsplit < 0 is unlimited.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// find/rfind/count over s[start:end] (code point indices, Python slice rules); -1 if absent.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end, bool reverse);
int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end);
// s[start:end] by code points, for startswith/endswith ranges.
std::string substr(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end);
std::string pad(std::string_view s, int64_t width, std::string_view fill, char align);  // ljust '<', rjust '>', center '^'
std::string zfill(std::string_view s, int64_t width);

// Character classes over the whole string (false for the empty string, as in Python).
bool isalpha(std::string_view s);
bool isdigit(std::string_view s);
bool isnumeric(std::string_view s);
bool isalnum(std::string_view s);
bool isspace(std::string_view s);
bool islower(std::string_view s);
bool isupper(std::string_view s);
bool istitle(std::string_view s);

}  // namespace tessera::chat_template::pystr
