// plugins.toml parsing (toml++), the default plugin search folders and discovery of
// the config file. Every error names the file, line and column and the problem; an
// unknown key is an error, never silently ignored (a typo must not disable a setting).
#include "tessera/plugin_config.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "tessera/error.h"

#ifndef TESSERA_PLUGIN_BUILD_DIR
#define TESSERA_PLUGIN_BUILD_DIR ""
#endif

namespace fs = std::filesystem;

namespace tessera {

namespace {

std::string where(const std::string& source, const toml::source_region& r) {
  std::ostringstream os;
  os << source;
  if (r.begin.line) os << ':' << r.begin.line << ':' << r.begin.column;
  return os.str();
}

[[noreturn]] void fail(const std::string& source, const toml::node& n, const std::string& what) {
  throw Error(where(source, n.source()) + ": " + what);
}
[[noreturn]] void fail(const std::string& source, const toml::key& k, const std::string& what) {
  throw Error(where(source, k.source()) + ": " + what);
}

// Close-match hint for a misspelt key.
std::string hint(std::initializer_list<std::string_view> known) {
  std::string list;
  for (auto k : known) {
    if (!list.empty()) list += ", ";
    list += k;
  }
  return " (known keys: " + list + ")";
}

fs::path exe_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return exe.parent_path();
}

// The folders searched when plugins.toml does not restrict the search: the build
// tree's plugin folder (when it exists) and <exe>/../lib/tessera/plugins.
std::vector<std::string> builtin_dirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  const std::string build = TESSERA_PLUGIN_BUILD_DIR;
  if (!build.empty() && fs::is_directory(build, ec)) dirs.push_back(build);
  fs::path exe = exe_dir();
  if (!exe.empty()) dirs.push_back((exe / ".." / "lib" / "tessera" / "plugins").lexically_normal().string());
  return dirs;
}

// The user's own plugins.toml: $XDG_CONFIG_HOME/tessera/plugins.toml, else
// ~/.config/tessera/plugins.toml (empty when neither variable is set).
fs::path user_config_file() {
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return fs::path(x) / "tessera" / "plugins.toml";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".config" / "tessera" / "plugins.toml";
  return {};
}

std::vector<std::string> env_dirs() {
  std::vector<std::string> dirs;
  const char* env = std::getenv("TESSERA_PLUGIN_PATH");
  if (!env) return dirs;
  std::string s = env;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) dirs.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return dirs;
}

// Appends dirs not already present (same lexical form) to out.
void append_unique(std::vector<std::string>& out, const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    bool seen = false;
    for (const auto& o : out)
      if (fs::path(o).lexically_normal() == fs::path(d).lexically_normal()) seen = true;
    if (!seen) out.push_back(d);
  }
}

std::vector<std::string> string_array(const std::string& src, const toml::node& n, const std::string& key) {
  const toml::array* arr = n.as_array();
  if (!arr) fail(src, n, "'" + key + "' must be an array of strings");
  std::vector<std::string> out;
  for (const toml::node& e : *arr) {
    const auto* s = e.as_string();
    if (!s) fail(src, e, "'" + key + "' must contain only strings");
    out.push_back(s->get());
  }
  return out;
}

void parse_plugin_table(const std::string& src, const std::string& section, const std::string& name,
                        const toml::table& t, PluginSettings& st) {
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (key == "rank") {
      const auto* i = v.as_integer();
      if (!i) fail(src, v, "[" + section + "." + name + "] rank must be an integer between 0 and 1000000000");
      int64_t r = i->get();
      if (r < 0 || r > 1000000000)
        fail(src, v, "[" + section + "." + name + "] rank must be an integer between 0 and 1000000000, got " +
                         std::to_string(r));
      st.rank = int(r);
    } else if (key == "enabled") {
      const auto* b = v.as_boolean();
      if (!b) fail(src, v, "[" + section + "." + name + "] enabled must be true or false");
      st.enabled = st.enabled && b->get();
    } else if (key == "options") {
      const auto* opts = v.as_table();
      if (!opts) fail(src, v, "[" + section + "." + name + "] options must be a table of key = value");
      for (const auto& [ok, ov] : *opts) {
        std::string value;
        if (const auto* s = ov.as_string()) value = s->get();
        else if (const auto* i = ov.as_integer()) value = std::to_string(i->get());
        else if (const auto* b = ov.as_boolean()) value = b->get() ? "true" : "false";
        else if (const auto* f = ov.as_floating_point()) {
          std::ostringstream os;
          os << f->get();
          value = os.str();
        } else {
          fail(src, ov, "option '" + std::string(ok.str()) + "' of [" + section + "." + name +
                            "] must be a string, integer or boolean");
        }
        st.options[std::string(ok.str())] = value;
      }
    } else {
      fail(src, k, "unknown key '" + key + "' in [" + section + "." + name + "]" +
                       hint({"rank", "enabled", "options"}));
    }
  }
}

PluginConfig parse(std::string_view text, const std::string& base_dir, const std::string& src) {
  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, src);
  } catch (const toml::parse_error& e) {
    throw Error(where(src, e.source()) + ": " + std::string(e.description()));
  }
#else
  toml::parse_result res = toml::parse(text, src);
  if (!res) throw Error(where(src, res.error().source()) + ": " + std::string(res.error().description()));
  root = std::move(res).table();
#endif

  PluginConfig cfg;
  bool use_builtin = true;
  std::vector<std::string> disable;

  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "plugins") {
      const auto* t = v.as_table();
      if (!t) fail(src, v, "'plugins' must be a table ([plugins])");
      for (const auto& [pk, pv] : *t) {
        const std::string pkey(pk.str());
        if (pkey == "paths") {
          for (std::string p : string_array(src, pv, "paths")) {
            fs::path path(p);
            if (path.is_relative() && !base_dir.empty()) path = fs::path(base_dir) / path;
            std::error_code ec;
            if (!fs::is_directory(path, ec))  // searched anyway (it may appear later), but said
              spdlog::warn("{}: [plugins] paths: folder {} does not exist", src, path.lexically_normal().string());
            cfg.paths.push_back(path.lexically_normal().string());
          }
        } else if (pkey == "disable") {
          disable = string_array(src, pv, "disable");
        } else if (pkey == "default_paths") {
          const auto* b = pv.as_boolean();
          if (!b) fail(src, pv, "[plugins] default_paths must be true or false");
          use_builtin = b->get();
        } else {
          fail(src, pk, "unknown key '" + pkey + "' in [plugins]" + hint({"paths", "disable", "default_paths"}));
        }
      }
    } else if (key == "backend" || key == "loader") {
      const auto* t = v.as_table();
      if (!t) fail(src, v, "'" + key + "' must be a table of [" + key + ".NAME] sections");
      for (const auto& [nk, nv] : *t) {
        const std::string name(nk.str());
        const auto* pt = nv.as_table();
        if (!pt) fail(src, nv, "[" + key + "." + name + "] must be a table (rank, enabled, options)");
        parse_plugin_table(src, key, name, *pt, cfg.plugins[name]);
      }
    } else {
      fail(src, k, "unknown key '" + key + "' (known top-level keys: plugins, backend, loader)");
    }
  }
  for (const auto& name : disable) cfg.plugins[name].enabled = false;
  if (use_builtin) append_unique(cfg.paths, builtin_dirs());
  return cfg;
}

}  // namespace

PluginConfig PluginConfig::from_string(std::string_view toml, const std::string& base_dir) {
  return parse(toml, base_dir, "plugins.toml (string)");
}

PluginConfig PluginConfig::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open plugin config");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": cannot read plugin config");
  fs::path base = fs::absolute(fs::path(path)).parent_path();
  PluginConfig cfg = parse(ss.str(), base.string(), path);
  spdlog::debug("plugins: config {} ({} search folders)", path, cfg.paths.size());
  return cfg;
}

PluginConfig PluginConfig::defaults() {
  PluginConfig cfg;
  append_unique(cfg.paths, env_dirs());
  append_unique(cfg.paths, builtin_dirs());
  return cfg;
}

PluginConfig PluginConfig::discover() {
  std::error_code ec;
  std::string file;
  if (const char* env = std::getenv("TESSERA_PLUGINS_TOML"); env && *env) {
    if (!fs::exists(env, ec)) throw Error(std::string(env) + ": TESSERA_PLUGINS_TOML names a file that does not exist");
    file = env;
  } else if (const fs::path user = user_config_file(); !user.empty() && fs::is_regular_file(user, ec)) {
    file = user.string();
  } else if (fs::path exe = exe_dir(); !exe.empty()) {
    fs::path installed = exe / ".." / "share" / "tessera" / "plugins.toml";
    if (fs::is_regular_file(installed, ec)) file = installed.lexically_normal().string();
  }
  // Never ./plugins.toml: a folder one merely runs tessera in must not choose the code
  // tessera loads (pass --plugins ./plugins.toml to use one deliberately).
  if (fs::is_regular_file("plugins.toml", ec) && file != "plugins.toml")
    spdlog::debug("plugins: ./plugins.toml in the current folder is not read (use --plugins to choose it)");
  if (file.empty()) {
    spdlog::debug("plugins: no plugins.toml found, using the default search folders");
    return defaults();
  }
  PluginConfig cfg = from_file(file);
  // $TESSERA_PLUGIN_PATH always comes first, config file or not.
  std::vector<std::string> paths = env_dirs();
  append_unique(paths, cfg.paths);
  cfg.paths = std::move(paths);
  return cfg;
}

const PluginSettings* PluginConfig::settings(const std::string& name) const {
  auto it = plugins.find(name);
  return it == plugins.end() ? nullptr : &it->second;
}

}  // namespace tessera
