#include "rank_worker.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "tessera/error.h"
#include "tessera/memory_budget.h"
#include "tessera/scheduler.h"

namespace tessera::cli {

namespace {

std::shared_ptr<RankGroup> g_group;
std::vector<uint64_t> g_rank_memory;  // every rank's memory budget, rank by rank
bool g_finished = false;

// Rank 0's engine, as lines of key=value; no "model" line: no more engines.
struct Setup {
  std::string model;
  int64_t n_ctx = 0, max_sequences = 1, page_tokens = 16, batch_tokens = 512, kv_pages = 0;
  std::vector<std::string> backends;
  std::string split = "experts";
  int rc = 0;
};

std::vector<uint8_t> encode(const Setup& s) {
  std::ostringstream o;
  o << "rc=" << s.rc << "\n";
  if (!s.model.empty()) {
    o << "model=" << s.model << "\n"
      << "n_ctx=" << s.n_ctx << "\nmax_sequences=" << s.max_sequences << "\npage_tokens=" << s.page_tokens
      << "\nbatch_tokens=" << s.batch_tokens << "\nkv_pages=" << s.kv_pages << "\nsplit=" << s.split << "\n";
    for (const std::string& b : s.backends) o << "backend=" << b << "\n";
  }
  const std::string t = o.str();
  return {t.begin(), t.end()};
}

Setup decode(const std::vector<uint8_t>& bytes) {
  Setup s;
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw Error("distributed run: a malformed setup line from rank 0");
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "rc") s.rc = std::stoi(v);
    else if (k == "model") s.model = v;
    else if (k == "n_ctx") s.n_ctx = std::stoll(v);
    else if (k == "max_sequences") s.max_sequences = std::stoll(v);
    else if (k == "page_tokens") s.page_tokens = std::stoll(v);
    else if (k == "batch_tokens") s.batch_tokens = std::stoll(v);
    else if (k == "kv_pages") s.kv_pages = std::stoll(v);
    else if (k == "backend") s.backends.push_back(v);
    else if (k == "split") s.split = v;
    else throw Error("distributed run: an unknown setup key '" + printable(k, 40) + "' from rank 0");
  }
  return s;
}

}  // namespace

void set_rank_group(std::shared_ptr<RankGroup> group) {
  g_group = std::move(group);
  g_rank_memory.clear();
  if (!g_group) return;
  // Every rank's memory budget, read once at the start and exchanged (each rank then
  // sizes --split layers' ranges from the same figures).
  const uint64_t mine = read_memory_budget().bytes;
  const size_t n = size_t(g_group->size());
  std::vector<size_t> counts(n, sizeof(uint64_t));
  g_rank_memory.resize(n);
  g_group->all_gather({reinterpret_cast<const uint8_t*>(&mine), sizeof(mine)}, counts,
                      {reinterpret_cast<uint8_t*>(g_rank_memory.data()), n * sizeof(uint64_t)});
}
std::shared_ptr<RankGroup> rank_group() { return g_group; }
const std::vector<uint64_t>& rank_memory() { return g_rank_memory; }

void send_engine_setup(const EngineOptions& eo, const Engine& engine) {
  Setup s;
  s.model = eo.model_path;
  s.n_ctx = engine.n_ctx();
  s.max_sequences = eo.max_sequences;
  s.page_tokens = eo.page_tokens;
  s.batch_tokens = engine.batch_tokens();
  s.kv_pages = engine.kv().total_pages();
  for (const auto& b : engine.scheduler().backends()) s.backends.push_back(b->name());
  s.split = engine.split() == Split::Layers ? "layers" : "experts";
  std::vector<uint8_t> bytes = encode(s);
  g_group->broadcast(bytes);
}

void finish_ranks(int rc) {
  if (!g_group || g_group->rank() != 0 || g_finished) return;
  g_finished = true;
  Setup s;
  s.rc = rc;
  std::vector<uint8_t> bytes = encode(s);
  g_group->broadcast(bytes);
}

int run_rank_worker(int argc, char** argv) {
  CommonOptions o;
  std::vector<std::string> rest;
  po::options_description desc;
  add_common_options(desc, o, true);
  desc.add_options()("tessera-rest", po::value(&rest));
  po::positional_options_description pos;
  pos.add("tessera-rest", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).allow_unregistered().run(), vm);
    po::notify(vm);
  } catch (const po::error&) {
    // Rank 0 reads the same arguments and says what is wrong with them.
  }
  spdlog::set_level(o.verbose ? spdlog::level::debug : spdlog::level::err);
  // mpirun forwards Ctrl-C and SIGTERM to every rank: rank 0 decides what they mean
  // (a server drains its requests, a command stops) and then tells the others to exit.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);
  RankGroup& group = *g_group;
  std::unique_ptr<PluginRegistry> reg;
  int64_t cache = EngineOptions::kExpertCacheAuto;
  try {
    reg = make_registry(o);
    cache = expert_cache_option(o.expert_cache);
  } catch (const std::exception& e) {
    group.abort(std::string("cannot start: ") + e.what());
  }
  for (;;) {
    std::vector<uint8_t> bytes;
    group.broadcast(bytes);
    const Setup s = decode(bytes);
    if (s.model.empty()) return s.rc;
    EngineOptions eo;
    eo.model_path = s.model;
    eo.threads = o.threads;
    eo.n_ctx = s.n_ctx;
    eo.max_sequences = int(s.max_sequences);
    eo.page_tokens = int(s.page_tokens);
    eo.batch_tokens = s.batch_tokens;
    eo.kv_pages = s.kv_pages;
    eo.backends = s.backends;
    eo.strict_backends = true;  // the same backends as rank 0: the same routing
    eo.expert_cache_bytes = cache;  // each rank's own --expert-cache
    eo.ranks = g_group;
    eo.split = s.split == "layers" ? Split::Layers : Split::Experts;
    eo.rank_memory = g_rank_memory;
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(*reg, eo);
    } catch (const std::exception& e) {
      group.abort("cannot load its share of " + s.model + ": " + e.what());
    }
    engine->follow_rank0();
  }
}

}  // namespace tessera::cli
