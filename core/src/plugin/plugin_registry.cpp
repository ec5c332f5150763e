// Plugin discovery: scans the configured folders for *.so files, loads each with
// Boost.DLL, checks the C descriptor (ABI version, struct size, name, kind), probes it
// and ranks it. Nothing a plugin file does wrong throws: every problem becomes the
// `reason` of its record so `tessera backends` can show it.
#include "tessera/plugin_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <set>

#include "plugin/file_trust.h"
#include "plugin/plugin_backend_adapter.h"
#include "plugin/plugin_loader_adapter.h"
#include "plugin/probe_sandbox.h"
#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/model_file.h"

namespace fs = std::filesystem;

namespace tessera {

namespace {

// The descriptor fields this host reads: everything up to and including destroy.
constexpr size_t kDescriptorFieldsUsed =
    offsetof(TesseraPluginDescriptor, destroy) + sizeof(TesseraPluginDescriptor::destroy);

constexpr size_t kReasonSize = 512;

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case TESSERA_PLUGIN_BACKEND: return "backend";
    case TESSERA_PLUGIN_LOADER: return "loader";
    default: return "?";
  }
}

// Boost.DLL 1.74 puts dlerror() into the exception text: "... (dlerror system message: X)".
std::string dlopen_reason(const std::exception& e) {
  std::string what = e.what();
  const std::string marker = "(dlerror system message: ";
  size_t p = what.find(marker);
  if (p == std::string::npos) return "cannot load: " + what;
  std::string msg = what.substr(p + marker.size());
  if (!msg.empty() && msg.back() == ')') msg.pop_back();
  return msg;
}

std::string c_str_or_empty(const char* s) { return s ? std::string(s) : std::string(); }

void host_register_mapped_file(const void* base, size_t size, const char* path) {
  try {
    register_mapped_file(base, size, path ? std::string(path) : std::string());
  } catch (...) {
  }
}
void host_unregister_mapped_file(const void* base) {
  try {
    unregister_mapped_file(base);
  } catch (...) {
  }
}
// "" when a loader table holds every function a loader must provide (all of them).
std::string check_loader_table(const TesseraLoaderApi* api) {
  if (!api) return "loader plugin without a loader function table";
#define TESSERA_REQUIRE(f) \
  if (!TESSERA_HAS_FIELD(api, TesseraLoaderApi, f) || !api->f) return "loader function table lacks '" #f "'";
  TESSERA_REQUIRE(recognizes) TESSERA_REQUIRE(open) TESSERA_REQUIRE(close) TESSERA_REQUIRE(format)
  TESSERA_REQUIRE(path) TESSERA_REQUIRE(file_size) TESSERA_REQUIRE(meta_count) TESSERA_REQUIRE(meta_get)
  TESSERA_REQUIRE(tensor_count) TESSERA_REQUIRE(tensor_get) TESSERA_REQUIRE(describe)
  TESSERA_REQUIRE(architecture) TESSERA_REQUIRE(display_name) TESSERA_REQUIRE(origin_count)
  TESSERA_REQUIRE(origin_get)
#undef TESSERA_REQUIRE
  return {};
}

const TesseraHostApi kHostApi = {sizeof(TesseraHostApi), &host_register_mapped_file, &host_unregister_mapped_file};

}  // namespace

struct PluginRegistry::Loaded {
  std::string name;
  std::string file;
  uint32_t kind = 0;
  int rank = 0;
  std::shared_ptr<boost::dll::shared_library> lib;
  const TesseraPluginDescriptor* desc = nullptr;
};

PluginRegistry::PluginRegistry(PluginConfig config) : config_(std::move(config)) { scan(); }

PluginRegistry::~PluginRegistry() = default;

void PluginRegistry::scan() {
  // Files in folder order; inside a folder sorted by name. A file reachable through
  // two folders (or a symlink) is loaded once.
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  std::vector<PluginRecord> usable, unusable;
  std::map<fs::path, std::string> distrusted;  // file -> why it is refused unopened
  for (const std::string& dir : config_.paths) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      spdlog::debug("plugins: folder {} does not exist, skipped", dir);
      continue;
    }
    const std::string dir_why = detail::untrusted_reason(dir, true);
    std::vector<fs::path> here;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (p.extension() != ".so") continue;
      std::error_code fec;
      if (!fs::is_regular_file(p, fec)) continue;
      here.push_back(p);
    }
    if (ec) spdlog::debug("plugins: cannot list {}: {}", dir, ec.message());
    std::sort(here.begin(), here.end());
    spdlog::debug("plugins: folder {}: {} .so file(s)", dir, here.size());
    for (auto& p : here) {
      std::error_code cec;
      fs::path canon = fs::weakly_canonical(p, cec);
      if (cec) canon = p;
      if (!seen.insert(canon).second) continue;
      files.push_back(p);
      std::string why = dir_why.empty() ? detail::untrusted_reason(p.string(), false) : dir_why;
      if (!why.empty()) distrusted[p] = std::move(why);
    }
  }

  std::map<std::string, std::string> owner;  // plugin name -> file that claimed it

  for (const fs::path& path : files) {
    PluginRecord rec;
    rec.file = path.string();
    rec.kind = "?";
    const std::string stem = path.stem().string();

    // A disabled plugin is not even loaded when its file carries its name
    // (NAME.so, backend_NAME.so or loader_NAME.so): a disabled probe never runs.
    std::string disabled_name;
    for (const auto& [pname, ps] : config_.plugins)
      if (!ps.enabled && (stem == pname || stem == "backend_" + pname || stem == "loader_" + pname))
        disabled_name = pname;
    if (!disabled_name.empty()) {
      rec.name = disabled_name;
      rec.reason = "disabled in plugins.toml";
      spdlog::debug("plugins: {}: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }

    // Code that other users could have put there is never opened.
    if (auto it = distrusted.find(path); it != distrusted.end()) {
      rec.reason = it->second;
      spdlog::debug("plugins: {}: refused: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }

    // Tried in a child process first: a plugin that crashes or hangs while loading or
    // probing is refused with the reason, and tessera goes on without it.
    if (const detail::SandboxVerdict v = detail::vet_plugin(rec.file); !v.safe) {
      rec.reason = v.reason;
      spdlog::debug("plugins: {}: refused: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }

    auto lib = std::make_shared<boost::dll::shared_library>();
    try {
      lib->load(boost::dll::fs::path(rec.file),
                boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception& e) {
      rec.reason = dlopen_reason(e);
      spdlog::debug("plugins: {}: cannot load: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }

    if (!lib->has(TESSERA_PLUGIN_ENTRY_SYMBOL)) {
      rec.reason = "no " TESSERA_PLUGIN_ENTRY_SYMBOL " symbol";
      spdlog::debug("plugins: {}: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }
    auto& entry = lib->get<const TesseraPluginDescriptor*()>(TESSERA_PLUGIN_ENTRY_SYMBOL);
    const TesseraPluginDescriptor* d = entry();

    auto refuse = [&](std::string why) {
      rec.reason = std::move(why);
      spdlog::debug("plugins: {}: refused: {}", rec.file, rec.reason);
      unusable.push_back(std::move(rec));
    };
    if (!d) { refuse(TESSERA_PLUGIN_ENTRY_SYMBOL " returned no descriptor"); continue; }
    if (d->abi_version < TESSERA_PLUGIN_ABI_MIN_VERSION || d->abi_version > TESSERA_PLUGIN_ABI_VERSION) {
      refuse("ABI version " + std::to_string(d->abi_version) + ", this tessera expects " +
             std::to_string(TESSERA_PLUGIN_ABI_MIN_VERSION) + " to " + std::to_string(TESSERA_PLUGIN_ABI_VERSION) +
             ": rebuild the plugin" +
             (d->abi_version == 1 || d->abi_version == 2
                  ? " against the current SDK (ABI 1 and 2 passed C++ objects)"
                  : ""));
      continue;
    }
    if (d->struct_size < kDescriptorFieldsUsed) {
      refuse("descriptor struct_size " + std::to_string(d->struct_size) + " is smaller than the " +
             std::to_string(kDescriptorFieldsUsed) + " bytes this tessera reads: rebuild the plugin");
      continue;
    }
    rec.name = c_str_or_empty(d->name);
    rec.reference = d->kind == TESSERA_PLUGIN_BACKEND && TESSERA_HAS_FIELD(d, TesseraPluginDescriptor, flags) &&
                    (d->flags & TESSERA_PLUGIN_REFERENCE) != 0;
    rec.description = c_str_or_empty(d->description);
    rec.kind = kind_name(d->kind);
    if (rec.name.empty()) { refuse("descriptor has an empty name"); continue; }
    if (rec.kind == "?") { refuse("unknown plugin kind " + std::to_string(d->kind)); continue; }
    if (!d->probe || !d->create || !d->destroy) {
      refuse("descriptor lacks probe, create or destroy");
      continue;
    }
    if (d->kind == TESSERA_PLUGIN_BACKEND) {
      const TesseraBackendApi* api =
          TESSERA_HAS_FIELD(d, TesseraPluginDescriptor, backend) ? d->backend : nullptr;
      if (std::string why = detail::check_backend_table(api); !why.empty()) { refuse(why); continue; }
    } else {
      const TesseraLoaderApi* api = TESSERA_HAS_FIELD(d, TesseraPluginDescriptor, loader) ? d->loader : nullptr;
      if (std::string why = check_loader_table(api); !why.empty()) { refuse(why); continue; }
    }
    if (auto it = owner.find(rec.name); it != owner.end()) {
      refuse("duplicate of " + it->second);
      continue;
    }
    owner[rec.name] = rec.file;

    const PluginSettings* s = config_.settings(rec.name);
    if (s && !s->enabled) { refuse("disabled in plugins.toml"); continue; }

    char reason[kReasonSize] = {};
    try {  // the ABI forbids exceptions across it; one that escapes anyway is a refusal
      rec.score = d->probe(reason, sizeof reason);
    } catch (const std::exception& e) {
      refuse(std::string("probe threw an exception: ") + e.what());
      continue;
    } catch (...) {
      refuse("probe threw an exception (not a std::exception)");
      continue;
    }
    reason[kReasonSize - 1] = '\0';
    if (rec.score <= 0) {
      rec.reason = reason[0] ? std::string(reason) : std::string("probe returned ") + std::to_string(rec.score);
      rec.score = std::max(rec.score, 0);
      spdlog::debug("plugins: {} ({}): unusable here: {}", rec.name, rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }
    rec.rank = (s && s->rank) ? *s->rank : rec.score;
    if (rec.rank <= 0) {
      rec.rank = 0;
      rec.reason = "rank 0 in plugins.toml";
      spdlog::debug("plugins: {} ({}): {}", rec.name, rec.file, rec.reason);
      unusable.push_back(std::move(rec));
      continue;
    }
    rec.usable = true;
    rec.reason = reason;  // a usable plugin's probe note (e.g. which device, why this score)
    spdlog::debug("plugins: {} {} ({}): score {}, rank {}{}", rec.kind, rec.name, rec.file, rec.score,
                  rec.rank, reason[0] ? std::string(" (") + reason + ")" : std::string());

    auto ld = std::make_unique<Loaded>();
    ld->name = rec.name;
    ld->file = rec.file;
    ld->kind = d->kind;
    ld->rank = rec.rank;
    ld->lib = std::move(lib);
    ld->desc = d;
    loaded_.push_back(std::move(ld));
    usable.push_back(std::move(rec));
  }

  std::stable_sort(usable.begin(), usable.end(), [](const PluginRecord& a, const PluginRecord& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.name < b.name;
  });
  std::stable_sort(unusable.begin(), unusable.end(), [](const PluginRecord& a, const PluginRecord& b) {
    if (a.name != b.name) return a.name < b.name;
    return a.file < b.file;
  });
  // loaded_ parallel to the usable records.
  std::vector<std::unique_ptr<Loaded>> ordered;
  for (const auto& r : usable)
    for (auto& l : loaded_)
      if (l && l->name == r.name) ordered.push_back(std::move(l));
  loaded_ = std::move(ordered);

  records_ = std::move(usable);
  for (auto& r : unusable) records_.push_back(std::move(r));
  spdlog::debug("plugins: {} usable of {} found", loaded_.size(), records_.size());
}

std::vector<std::string> PluginRegistry::ranked_backends() const {
  std::vector<std::string> out;
  for (const auto& l : loaded_)
    if (l->kind == TESSERA_PLUGIN_BACKEND) out.push_back(l->name);
  return out;
}

const PluginRecord* PluginRegistry::find(const std::string& name) const {
  for (const auto& r : records_)
    if (r.name == name) return &r;
  return nullptr;
}

const PluginRecord* PluginRegistry::reference_backend() const {
  for (const auto& r : records_)  // usable first, by descending rank
    if (r.usable && r.reference) return &r;
  return nullptr;
}

void* PluginRegistry::create_instance(const Loaded& p, FastPool* pool,
                                      const std::map<std::string, std::string>& extra) const {
  std::map<std::string, std::string> opts;
  if (const PluginSettings* s = config_.settings(p.name)) opts = s->options;
  for (const auto& [k, v] : extra) opts[k] = v;
  std::vector<TesseraOption> copts;
  copts.reserve(opts.size());
  for (const auto& [k, v] : opts) copts.push_back({k.c_str(), v.c_str()});

  TesseraCreateArgs args{};
  args.struct_size = sizeof(TesseraCreateArgs);
  args.pool = pool ? pool->c_handle() : nullptr;
  args.options = copts.empty() ? nullptr : copts.data();
  args.option_count = copts.size();
  args.host = &kHostApi;

  char error[kReasonSize] = {};
  void* inst = nullptr;
  try {  // the ABI forbids exceptions across it; one that escapes anyway is a failure
    inst = p.desc->create(&args, error, sizeof error);
  } catch (const std::exception& e) {
    std::snprintf(error, sizeof error, "threw an exception: %s", e.what());
  } catch (...) {
    std::snprintf(error, sizeof error, "threw an exception (not a std::exception)");
  }
  error[kReasonSize - 1] = '\0';
  if (!inst)
    throw Error("plugin " + p.name + " (" + p.file + "): create failed: " +
                (error[0] ? std::string(error) : std::string("no reason given")));
  return inst;
}

std::shared_ptr<Backend> PluginRegistry::create_backend(const std::string& name, FastPool* pool,
                                                        const std::map<std::string, std::string>& options) const {
  for (const auto& l : loaded_) {
    if (l->name != name) continue;
    if (l->kind != TESSERA_PLUGIN_BACKEND) throw Error("plugin " + name + " is a " + kind_name(l->kind) + ", not a backend");
    void* inst = create_instance(*l, pool, options);
    return detail::adapt_backend(l->name, l->desc, inst, l->lib);
  }
  if (const PluginRecord* r = find(name))
    throw Error("backend " + name + " is not usable here: " + r->reason);
  std::string known;
  for (const auto& n : ranked_backends()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown backend '" + name + "' (usable backends: " + (known.empty() ? "none" : known) + ")");
}

std::vector<std::shared_ptr<ModelLoader>> PluginRegistry::create_loaders() const {
  std::vector<std::shared_ptr<ModelLoader>> out;
  for (const auto& l : loaded_) {
    if (l->kind != TESSERA_PLUGIN_LOADER) continue;
    void* inst = create_instance(*l, nullptr, {});
    out.push_back(detail::adapt_loader(l->name, l->desc, inst, l->lib));
  }
  return out;
}

}  // namespace tessera
