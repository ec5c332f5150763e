#include "cli_common.h"
#include "rank_worker.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <iostream>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "tessera/error.h"
#include "tessera/expert_stream.h"
#include "tessera/model.h"
#include "tessera/open_model.h"
#include "tessera/tensor_scan.h"
#include "tessera/scheduler.h"

namespace tessera::cli {

void add_common_options(po::options_description& desc, CommonOptions& o, bool with_model) {
  if (with_model) {
    desc.add_options()
      ("model,m", po::value(&o.model), "model file (GGUF) or Hugging Face checkpoint folder; default: the bundled "
                                       "synthetic model")
      ("backend", po::value(&o.backend), "backend(s) to use, comma-separated in preference order (default: every "
                                         "usable backend by rank; see `tessera backends`); what they do not run goes "
                                         "to cpu_scalar, the reference, unless --strict-backend")
      ("strict-backend", po::bool_switch(&o.strict_backend), "with --backend: run only on the backends named; a node "
                                                             "none of them runs is an error")
      ("threads,t", po::value(&o.threads)->default_value(0), "worker threads including the caller (0 = all cores)")
      ("ctx", po::value(&o.ctx)->default_value(0), "context size in tokens per sequence (0 = model's, at most 4096)")
      ("batch", po::value(&o.batch)->default_value(512), "tokens per forward step: longer prompts are prefilled in "
                                                          "chunks of this size, which bounds the scratch memory")
      ("check-tensors", po::bool_switch(&o.check_tensors), "read every weight first and refuse the model if any holds "
                                                           "NaN or infinity (reads the whole file)")
      ("expert-cache", po::value(&o.expert_cache)->default_value("auto"),
       "MoE models: stream the routed experts from the file through a cache of this size (e.g. 4G, 512M); "
       "`off` keeps them all in memory; `auto` streams only when the model does not fit in the memory budget "
       "(the lowest of the cgroup's limit, RLIMIT_AS and MemAvailable; `tessera info MODEL` shows it)")
      ("quantize", po::value(&o.quantize)->value_name("TYPE"),
       ("quantize the model's F32/F16/BF16 matrix weights (projections, experts, embedding, output) to TYPE at "
        "load, for speed: " + quantize_target_names() + ". Norms, biases and MoE routers stay as stored; weights "
        "already quantized are left alone").c_str())
      ("split", po::value(&o.split)->default_value("auto"),
       "under `mpirun -np N` (docs/distributed.md): how the model is shared out over the ranks: `experts` (each "
       "rank holds 1/N of every MoE layer's routed experts; the default for MoE models) or `layers` (each rank "
       "runs a contiguous range of layers; the default for dense models); `auto` picks by the model")
      ("step-buckets", po::value(&o.step_buckets)->default_value("auto"),
       "pad each forward step's tokens to one of a few sizes (4, 8, 10, 12, 14, 16, 20, ...: past 8 tokens, under a "
       "quarter more), "
       "so a backend meets few graph shapes and reuses their plans: `on`, `off`, or `auto` (on when the first "
       "backend is a GPU's; a CPU plans a step in microseconds and would pay for the padding rows). Not with "
       "recurrent models, distributed runs or streamed experts");
  }
  desc.add_options()
    ("plugins", po::value(&o.plugins_toml), "plugins.toml to use (default: $TESSERA_PLUGINS_TOML, ~/.config/tessera/plugins.toml, "
                                            "then the installed one; never the current folder's)")
    ("verbose,v", po::bool_switch(&o.verbose), "debug logging on stderr")
    ("help,h", "show this help");
}

void add_spec_options(po::options_description& desc, SpecOptions& s) {
  desc.add_options()
    ("spec", po::value(&s.spec)->value_name("KIND"),
     "speculative decoding: `ngram` drafts from earlier occurrences of the last tokens (prompt lookup), "
     "`draft:PATH` from a smaller model with the same vocabulary, `none` decodes one token per step; greedy "
     "output is unchanged and sampled output keeps its distribution (docs/speculative.md)")
    ("spec-max", po::value(&s.spec_max)->default_value(8),
     "with --spec: drafted tokens verified per step at most (the number adapts to the acceptance and to "
     "what a drafted token is measured to cost)");
}

std::unique_ptr<Drafter> make_drafter(const PluginRegistry& reg, const CommonOptions& o, const SpecOptions& s,
                                      const Engine& target) {
  if (s.spec_max < 1 || s.spec_max > 64) throw Error("--spec-max must be between 1 and 64");
  if (!s.enabled()) return nullptr;
  if (s.spec == "ngram") return make_ngram_drafter();
  if (s.spec.rfind("draft:", 0) == 0) {
    EngineOptions eo;
    eo.model_path = s.spec.substr(6);
    if (eo.model_path.empty()) throw Error("--spec draft:PATH needs the draft model's path");
    if (!std::filesystem::exists(eo.model_path)) throw Error("--spec: " + eo.model_path + ": no such file");
    if (!o.backend.empty()) eo.backends = split(o.backend, ',');
    eo.strict_backends = o.strict_backend;
    return make_draft_model_drafter(reg, eo, target);
  }
  if (s.spec == "mtp")
    throw Error("--spec mtp is not available yet: tessera does not run a file's multi-token-prediction layers; "
                "use --spec ngram or --spec draft:PATH");
  throw Error("--spec: '" + printable(s.spec, 40) + "' is not a drafter; use none, ngram or draft:PATH");
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
      // Longer than stdio's buffer: written and checked here, while errno still says
      // why a write failed.
      std::ostringstream help;
      help << usage << "\n\n" << desc << "\n";
      const std::string text = help.str();
      errno = 0;
      if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
        const int e = errno;
        throw Error(std::string("cannot write to standard output: ") + (e ? std::strerror(e) : "write error"));
      }
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

int64_t expert_cache_option(const std::string& value) {
  if (value == "off") return EngineOptions::kExpertCacheOff;
  if (value == "auto") return EngineOptions::kExpertCacheAuto;
  const uint64_t b = parse_byte_size(value);
  if (b == 0 || b > uint64_t(INT64_MAX)) throw Error("--expert-cache must be auto, off or a size above 0 (e.g. 4G)");
  return int64_t(b);
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
  eo.expert_cache_bytes = expert_cache_option(o.expert_cache);
  if (!o.backend.empty()) eo.backends = split(o.backend, ',');
  if (o.strict_backend && o.backend.empty()) throw Error("--strict-backend needs --backend NAME[,NAME...]");
  eo.strict_backends = o.strict_backend;
  if (!o.quantize.empty()) {
    const std::optional<DType> t = dtype_from_name(o.quantize);
    const auto targets = quantize_targets();
    if (!t || std::find(targets.begin(), targets.end(), *t) == targets.end())
      throw Error("--quantize: '" + printable(o.quantize, 40) + "' is not a type weights can be quantized to; use one of " +
                  quantize_target_names());
    eo.quantize = t;
  }
  if (o.check_tensors) {
    OpenedModel opened = open_model_file(reg, eo.model_path);
    const size_t n = check_tensors_finite(*opened.file);
    spdlog::info("--check-tensors: {} tensors, every value finite", n);
  }
  // Quantizing a large model takes a while: its progress and summary (info messages)
  // are shown when asked for, whatever the log level.
  const spdlog::level::level_enum level = spdlog::get_level();
  if (eo.quantize && level > spdlog::level::info) spdlog::set_level(spdlog::level::info);
  if (o.split != "auto" && o.split != "experts" && o.split != "layers")
    throw Error("--split: '" + printable(o.split, 40) + "' is not a way to split a model; use auto, experts or layers");
  eo.ranks = rank_group();  // a distributed run (rank 0): the engine holds its share of the experts
  eo.rank_memory = rank_memory();
  if (o.step_buckets == "on") eo.step_buckets = StepBuckets::On;
  else if (o.step_buckets == "off") eo.step_buckets = StepBuckets::Off;
  else if (o.step_buckets != "auto")
    throw Error("--step-buckets: '" + printable(o.step_buckets, 40) + "' is not a choice; use auto, on or off");
  if (o.split == "experts") eo.split = Split::Experts;
  if (o.split == "layers") eo.split = Split::Layers;
  if (!eo.ranks && o.split != "auto")
    spdlog::warn("--split {} applies only to a run started by mpirun with several processes", o.split);
  std::unique_ptr<Engine> engine;
  try {
    engine = std::make_unique<Engine>(reg, eo);
  } catch (...) {
    spdlog::set_level(level);
    throw;
  }
  spdlog::set_level(level);
  if (eo.ranks) send_engine_setup(eo, *engine);
  // Limits with words: what a flag asks for beyond the machine or the model
  // is done, but not silently.
  const unsigned hw = std::thread::hardware_concurrency();
  if (o.threads > 0 && hw > 0 && unsigned(o.threads) > hw)
    spdlog::warn("--threads {} exceeds the {} hardware threads of this machine: {} executors share them and "
                 "spinning workers wait on each other (expect it to be slower)",
                 o.threads, hw, engine->threads());
  const int64_t trained = engine->model().info().context_length;
  if (o.ctx > trained)
    spdlog::warn("--ctx {} exceeds the model's trained context length {}: positions beyond it are outside what "
                 "the model was trained on (output quality may degrade)",
                 o.ctx, trained);
  return engine;
}

int64_t trained_context_length(const PluginRegistry& reg, const CommonOptions& o) {
  OpenedModel opened = open_model_file(reg, o.model.empty() ? default_model_path() : o.model);
  return Model::load(*opened.file)->info().context_length;
}

size_t check_tensors_finite(const ModelFile& file) {
  const std::vector<NonFiniteTensor> bad = find_non_finite_tensors(file);
  if (bad.empty()) return file.tensors().size();
  std::string msg = printable(file.path(), 200) + ": --check-tensors: " + std::to_string(bad.size()) + " of " +
                    std::to_string(file.tensors().size()) + " tensors hold NaN or infinite values: ";
  for (size_t i = 0; i < bad.size() && i < 3; ++i) msg += (i ? "; " : "") + describe(bad[i]);
  if (bad.size() > 3) msg += "; and " + std::to_string(bad.size() - 3) + " more (tessera info --check-tensors lists all)";
  throw Error(msg);
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Progress::Progress(std::string what, int64_t total)
    : what_(std::move(what)), total_(total), active_(isatty(STDERR_FILENO) == 1), t0_(now_s()) {}

void Progress::update(int64_t n) {
  if (!active_) return;
  const double t = now_s();
  if (n < total_ && last_ >= 0 && t - last_ < 0.1) return;  // at most 10 redraws a second
  last_ = t;
  std::fprintf(stderr, "\r[%s %lld/%lld tokens, %.1f s]\033[K", what_.c_str(), (long long)n, (long long)total_,
               t - t0_);
  std::fflush(stderr);
}

void Progress::done() {
  if (!active_) return;
  if (last_ >= 0) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  active_ = false;
}

std::span<const float> prefill_with_progress(Engine& engine, std::span<const int32_t> tokens) {
  const int64_t n = int64_t(tokens.size()), step = engine.batch_tokens();
  if (n <= step) return engine.eval(tokens, false);
  if (engine.position() + n > engine.n_ctx())
    throw Error("context is full: " + std::to_string(engine.position() + n) + " positions needed, context size is " +
                std::to_string(engine.n_ctx()));
  Progress progress("prefill", n);
  std::span<const float> logits;
  for (int64_t first = 0; first < n; first += step) {
    const int64_t count = std::min(step, n - first);
    const Engine::Chunk chunk{engine.sequence(), tokens.subspan(size_t(first), size_t(count)),
                              first + count == n ? Engine::Logits::Last : Engine::Logits::None};
    logits = engine.forward(std::span<const Engine::Chunk>(&chunk, 1));
    progress.update(first + count);
  }
  return logits;
}

void check_stdout() {
  errno = 0;
  std::cout.flush();  // through stdio (synced), so errno says why
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout;
  if (failed) {
    const int e = errno;
    throw Error(std::string("cannot write to standard output: ") + (e ? std::strerror(e) : "write error"));
  }
}

// AtomicFile: the temporary's name for the signal handler (async-signal-safe: a fixed
// buffer, unlink and raise only).
namespace {
char g_tmp_path[4096];
volatile std::sig_atomic_t g_tmp_active = 0;
struct sigaction g_old_actions[3];
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

void remove_tmp_and_reraise(int sig) {
  if (g_tmp_active) unlink(g_tmp_path);
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  struct stat st;
  const bool special = ::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  if (special) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error(path_ + ": cannot open for writing: " + std::strerror(errno));
    return;
  }
  if (g_tmp_active) throw Error("internal: one AtomicFile at a time");
  namespace fs = std::filesystem;
  const fs::path p(path_);
  std::string tmp_name = ".";
  tmp_name += p.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(getpid());
  tmp_ = (p.parent_path() / tmp_name).string();
  if (tmp_.size() >= sizeof(g_tmp_path)) throw Error(path_ + ": path too long");
  const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int e = errno;
    throw Error(path_ + ": cannot create a file in " +
                (p.parent_path().empty() ? std::string(".") : p.parent_path().string()) + ": " + std::strerror(e));
  }
  f_ = fdopen(fd, "wb");
  if (!f_) {
    ::close(fd);
    ::unlink(tmp_.c_str());
    throw Error(path_ + ": cannot open for writing");
  }
  std::memcpy(g_tmp_path, tmp_.c_str(), tmp_.size() + 1);
  g_tmp_active = 1;
  struct sigaction sa {};
  sa.sa_handler = remove_tmp_and_reraise;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &g_old_actions[i]);
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  if (!tmp_.empty()) {
    g_tmp_active = 0;
    ::unlink(tmp_.c_str());
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_old_actions[i], nullptr);
    tmp_.clear();
  }
}

void AtomicFile::write(const void* data, size_t n) {
  if (!f_ || std::fwrite(data, 1, n, f_) != n) {
    const int e = errno;
    discard();
    throw Error(path_ + ": write failed: " + std::strerror(e));
  }
}

void AtomicFile::commit() {
  errno = 0;
  bool ok = f_ && std::fflush(f_) == 0;
  if (ok && !tmp_.empty()) ok = ::fsync(fileno(f_)) == 0;
  int e = errno;
  if (f_) {
    if (std::fclose(f_) != 0 && ok) ok = false, e = errno;
    f_ = nullptr;
  }
  if (ok && !tmp_.empty() && std::rename(tmp_.c_str(), path_.c_str()) != 0) ok = false, e = errno;
  if (!ok) {
    discard();
    throw Error(path_ + ": write failed: " + (e ? std::strerror(e) : "I/O error"));
  }
  committed_ = true;
  if (!tmp_.empty()) {
    g_tmp_active = 0;
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_old_actions[i], nullptr);
  }
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
