// Pieces shared by the `tessera` subcommands: the common options (model, backend,
// threads, plugin config), building the plugin registry and engine, and helpers.
#pragma once
#include <boost/program_options.hpp>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/drafter.h"
#include "tessera/engine.h"
#include "tessera/model_file.h"
#include "tessera/plugin_registry.h"
#include "tessera/sampler.h"
#include "tessera/scheduler.h"

namespace tessera::cli {

namespace po = boost::program_options;

struct CommonOptions {
  std::string model;
  std::string backend;  // comma-separated names, empty = ranked default
  bool strict_backend = false;  // no fallback to the reference backend
  std::string plugins_toml;
  int threads = 0;
  int64_t ctx = 0;
  int64_t batch = 512;  // tokens per forward step
  int parallel = 1;     // sequences at once (commands that run several)
  bool verbose = false;
  bool check_tensors = false;  // scan every weight for NaN/Inf before running
  std::string expert_cache = "auto";  // MoE experts: auto, off, or a cache size (4G)
  std::string quantize;               // --quantize TYPE: quantize float weights at load; empty = off
  std::string split = "auto";         // under mpirun: auto, experts or layers (docs/distributed.md)
  std::string step_buckets = "auto";  // pad steps to token-count buckets: auto, on or off
};

// Adds --plugins and --verbose; with_model adds -m/--model, --backend, --threads, --ctx,
// --batch, --check-tensors, --expert-cache, --quantize, --split and --step-buckets.
void add_common_options(po::options_description& desc, CommonOptions& o, bool with_model);

// Speculative decoding (drafter.h): --spec and --spec-max.
struct SpecOptions {
  std::string spec;  // empty: not asked for; none, ngram or draft:PATH
  int spec_max = 8;
  bool enabled() const { return !spec.empty() && spec != "none"; }
};
void add_spec_options(po::options_description& desc, SpecOptions& s);
// The drafter --spec names, or null for none (throws tessera::Error naming a bad value
// or an unusable draft model). A draft model runs on the target's backends and pool.
std::unique_ptr<Drafter> make_drafter(const PluginRegistry& reg, const CommonOptions& o, const SpecOptions& s,
                                      const Engine& target);

// Adds --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n with
// llama.cpp's defaults (decision 7).
void add_sampling_options(po::options_description& desc, SamplerParams& sp);

// Parses argv (after the subcommand word). Returns false if --help was printed.
bool parse(int argc, char** argv, const char* usage, po::options_description& desc,
           po::positional_options_description* positional, po::variables_map& vm);

std::unique_ptr<PluginRegistry> make_registry(const CommonOptions& o);
// The bundled default model when -m is not given (see docs/cli.md).
std::string default_model_path();
// The engine for o.model. With o.check_tensors, first refuses a file whose weights hold
// NaN or infinity (naming them). Warns (once) when --threads exceeds the hardware
// threads or --ctx the model's trained context length.
std::unique_ptr<Engine> make_engine(const PluginRegistry& reg, const CommonOptions& o);
// --expert-cache's value as EngineOptions::expert_cache_bytes; throws on a bad one.
int64_t expert_cache_option(const std::string& value);
// The model's trained context length (<arch>.context_length as the architecture reads
// it), without creating backends or a KV cache.
int64_t trained_context_length(const PluginRegistry& reg, const CommonOptions& o);

// --check-tensors: throws tessera::Error naming the tensors of `file` that hold NaN or
// infinite values (one line); returns the number of tensors checked.
size_t check_tensors_finite(const ModelFile& file);

// Prefills `tokens` on the engine's own sequence in steps of its batch size (as
// Engine::eval does) and returns the last token's logits. On a terminal (stderr is a
// tty) and a prompt longer than one step it shows progress on stderr.
std::span<const float> prefill_with_progress(Engine& engine, std::span<const int32_t> tokens);

// "[prefill 1024/100000 tokens, 12.3 s]" on stderr, redrawn in place, only when stderr
// is a terminal; done() clears the line.
class Progress {
 public:
  Progress(std::string what, int64_t total);
  ~Progress() { done(); }
  void update(int64_t n);
  void done();
  bool active() const { return active_; }

 private:
  std::string what_;
  int64_t total_;
  bool active_;
  double t0_;
  double last_ = -1;
};

// Throws tessera::Error ("cannot write to standard output: <reason>") if a write to
// stdout (stdio or std::cout) has failed; flushes first.
void check_stdout();

// A file written under a temporary name in the same folder (created at once, so an
// unwritable folder fails before any work), renamed over `path` by commit(); the
// temporary is removed if the object dies uncommitted or the process gets SIGINT /
// SIGTERM / SIGHUP meanwhile. A `path` that exists and is not a regular file
// (/dev/null, /dev/stdout, a FIFO) is written in place.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Throws tessera::Error naming the file on a failed write.
  void write(const void* data, size_t n);
  // Flushes, syncs, closes and renames; throws naming the file on failure.
  void commit();

 private:
  void discard() noexcept;
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

// Prints a --profile table for one step to stderr under a title.
void print_profile(const std::string& title, const OpProfile& profile);

// The whole file; throws tessera::Error naming `what` if it cannot be read.
std::string read_text_file(const std::string& path, const std::string& what);

std::vector<std::string> split(const std::string& s, char sep);
// "1,2,3" -> ids; throws tessera::Error naming the bad item.
std::vector<int32_t> parse_token_list(const std::string& s);

}  // namespace tessera::cli
