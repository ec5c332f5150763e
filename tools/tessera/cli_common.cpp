#include "cli_common.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>

#include <spdlog/spdlog.h>

#include "tessera/error.h"
#include "tessera/scheduler.h"

namespace tessera::cli {

void add_common_options(po::options_description& desc, CommonOptions& o, bool with_model) {
  if (with_model) {
    desc.add_options()
      ("model,m", po::value(&o.model), "model file (GGUF); default: the bundled synthetic model")
      ("backend", po::value(&o.backend), "backend(s) to use, comma-separated in preference order "
                                         "(default: every usable backend by rank; see `tessera backends`)")
      ("threads,t", po::value(&o.threads)->default_value(0), "worker threads including the caller (0 = all cores)")
      ("ctx", po::value(&o.ctx)->default_value(0), "context size in tokens per sequence (0 = model's, at most 4096)")
      ("batch", po::value(&o.batch)->default_value(512), "tokens per forward step: longer prompts are prefilled in "
                                                          "chunks of this size, which bounds the scratch memory");
  }
  desc.add_options()
    ("plugins", po::value(&o.plugins_toml), "plugins.toml to use (default: $TESSERA_PLUGINS_TOML, ./plugins.toml, "
                                            "then the installed one)")
    ("verbose,v", po::bool_switch(&o.verbose), "debug logging on stderr")
    ("help,h", "show this help");
}

void add_sampling_options(po::options_description& desc, SamplerParams& sp) {
  desc.add_options()
    ("temp", po::value(&sp.temperature)->default_value(0.8f, "0.8"), "temperature (0 = greedy)")
    ("top-k", po::value(&sp.top_k)->default_value(40), "keep the K most likely tokens (0 = off)")
    ("top-p", po::value(&sp.top_p)->default_value(0.95f, "0.95"), "nucleus sampling threshold (1 = off)")
    ("min-p", po::value(&sp.min_p)->default_value(0.05f, "0.05"), "drop tokens below P x the top probability (0 = off)")
    ("repeat-penalty", po::value(&sp.repeat_penalty)->default_value(1.0f, "1.0"), "penalty for recent tokens (1 = off)")
    ("repeat-last-n", po::value(&sp.repeat_last_n)->default_value(64), "how many recent tokens the penalty covers");
}

bool parse(int argc, char** argv, const char* usage, po::options_description& desc,
           po::positional_options_description* positional, po::variables_map& vm) {
  try {
    po::command_line_parser p(argc, argv);
    p.options(desc);
    if (positional) p.positional(*positional);
    po::store(p.run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("verbose") && vm["verbose"].as<bool>()) spdlog::set_level(spdlog::level::debug);
  return true;
}

std::unique_ptr<PluginRegistry> make_registry(const CommonOptions& o) {
  PluginConfig cfg = o.plugins_toml.empty() ? PluginConfig::discover() : PluginConfig::from_file(o.plugins_toml);
  return std::make_unique<PluginRegistry>(std::move(cfg));
}

std::string default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TESSERA_DEFAULT_MODEL")) return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  fs::path p = exe.parent_path().parent_path() / "share" / "tessera" / "models" / "default.gguf";
  if (ec || !fs::exists(p))
    throw Error("no model given (-m) and the bundled default model is missing at " + p.string() +
                " (build it with scripts/setup.sh)");
  return p.string();
}

std::unique_ptr<Engine> make_engine(const PluginRegistry& reg, const CommonOptions& o) {
  EngineOptions eo;
  eo.model_path = o.model.empty() ? default_model_path() : o.model;
  if (!std::filesystem::exists(eo.model_path)) throw Error(eo.model_path + ": no such file");
  eo.threads = o.threads;
  eo.n_ctx = o.ctx;
  if (o.ctx < 0) throw Error("--ctx must be >= 0");
  if (o.batch <= 0) throw Error("--batch must be >= 1");
  if (o.parallel <= 0) throw Error("--parallel must be >= 1");
  eo.batch_tokens = o.batch;
  eo.max_sequences = o.parallel;
  if (!o.backend.empty()) eo.backends = split(o.backend, ',');
  return std::make_unique<Engine>(reg, eo);
}

void print_profile(const std::string& title, const OpProfile& profile) {
  std::fprintf(stderr, "[profile: %s]\n%s", title.c_str(), profile.table().c_str());
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": cannot read " + what);
  return ss.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  for (const auto& item : split(s, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) throw Error("invalid token id '" + item + "' in --tokens");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) throw Error("--tokens is empty");
  return ids;
}

}  // namespace tessera::cli
