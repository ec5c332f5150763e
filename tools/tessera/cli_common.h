// Pieces shared by the `tessera` subcommands: the common options (model, backend,
// threads, plugin config), building the plugin registry and engine, and helpers.
#pragma once
#include <boost/program_options.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tessera/engine.h"
#include "tessera/plugin_registry.h"
#include "tessera/sampler.h"
#include "tessera/scheduler.h"

namespace tessera::cli {

namespace po = boost::program_options;

struct CommonOptions {
  std::string model;
  std::string backend;  // comma-separated names, empty = ranked default
  std::string plugins_toml;
  int threads = 0;
  int64_t ctx = 0;
  int64_t batch = 512;  // tokens per forward step
  int parallel = 1;     // sequences at once (commands that run several)
  bool verbose = false;
};

// Adds --plugins and --verbose; with_model adds -m/--model, --backend, --threads, --ctx, --batch.
void add_common_options(po::options_description& desc, CommonOptions& o, bool with_model);

// Adds --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n with
// llama.cpp's defaults (decision 7).
void add_sampling_options(po::options_description& desc, SamplerParams& sp);

// Parses argv (after the subcommand word). Returns false if --help was printed.
bool parse(int argc, char** argv, const char* usage, po::options_description& desc,
           po::positional_options_description* positional, po::variables_map& vm);

std::unique_ptr<PluginRegistry> make_registry(const CommonOptions& o);
// The bundled default model when -m is not given (see docs/cli.md).
std::string default_model_path();
std::unique_ptr<Engine> make_engine(const PluginRegistry& reg, const CommonOptions& o);

// Prints a --profile table for one step to stderr under a title.
void print_profile(const std::string& title, const OpProfile& profile);

// The whole file; throws tessera::Error naming `what` if it cannot be read.
std::string read_text_file(const std::string& path, const std::string& what);

std::vector<std::string> split(const std::string& s, char sep);
// "1,2,3" -> ids; throws tessera::Error naming the bad item.
std::vector<int32_t> parse_token_list(const std::string& s);

}  // namespace tessera::cli
