// tessera info: architecture, hyperparameters, the memory budget and its split, tensor
// count by dtype and sizes.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "cli_common.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/memory_budget.h"
#include "tessera/memory_plan.h"
#include "tessera/model.h"
#include "tessera/open_model.h"
#include "tessera/tensor_scan.h"

namespace tessera::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream s;
  s << std::fixed << std::setprecision(u ? 2 : 0) << b << " " << units[u];
  return s.str();
}

// Metadata strings are escaped (control characters, invalid UTF-8, bidi overrides:
// a file must not drive the terminal) and cut at 80 bytes.
std::string value_str(const MetaValue& v) {
  if (auto* s = v.as_string()) {
    std::string q = "\"";
    q += printable(*s, 80);
    q += '"';
    return q;
  }
  if (auto* a = v.as_array())
    return std::string("[").append(std::to_string(a->size())).append(" x ").append(meta_type_name(v.elem_type)).append("]");
  if (v.type == MetaType::F32 || v.type == MetaType::F64) {
    std::ostringstream s;
    s << *v.as_float();
    return s.str();
  }
  if (v.type == MetaType::Bool) return *v.as_int() ? "true" : "false";
  if (auto i = v.as_int()) return std::to_string(*i);
  return "?";
}

}  // namespace

int cmd_info(int argc, char** argv) {
  CommonOptions o;
  bool show_metadata = false, show_tensors = false, check_tensors = false;
  po::options_description desc("options");
  desc.add_options()
    ("model,m", po::value(&o.model), "model file (also the first positional argument)")
    ("metadata", po::bool_switch(&show_metadata), "also list every metadata key")
    ("tensors", po::bool_switch(&show_tensors), "also list every tensor")
    ("check-tensors", po::bool_switch(&check_tensors), "read every tensor and list those holding NaN or infinity "
                                                       "(exit status 1 if any)");
  add_common_options(desc, o, false);
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera info MODEL [--metadata] [--tensors]", desc, &pos, vm)) return 0;

  auto reg = make_registry(o);
  auto opened = open_model_file(*reg, o.model.empty() ? default_model_path() : o.model);
  const ModelFile& f = *opened.file;
  std::cout << "file:          " << printable(f.path()) << " (" << f.format() << ", " << human_bytes(double(f.file_size())) << ")\n";

  std::unique_ptr<Model> model;
  std::string model_error;
  try {
    model = Model::load(f);
  } catch (const Error& e) {
    model_error = e.what();
  }
  if (model) {
    const ModelInfo& i = model->info();
    std::cout << "architecture:  " << i.architecture << (i.name.empty() ? std::string() : std::string("  (").append(printable(i.name, 80)).append(")")) << "\n"
              << "vocabulary:    " << i.n_vocab << "\n"
              << "layers:        " << i.n_layer << "\n"
              << "embedding:     " << i.n_embd << "\n"
              << "heads:         " << i.n_head << " query / " << i.n_head_kv << " key-value, head size " << i.head_dim << "\n"
              << "feed-forward:  " << i.n_ff << "\n"
              << "rope:          " << i.rope_dims << " dims, base " << i.rope_freq_base << ", scale " << i.rope_freq_scale << "\n"
              << "rms eps:       " << i.rms_eps << "\n"
              << "context:       " << i.context_length << "\n";
    if (i.n_expert) std::cout << "experts:       " << i.n_expert << " (" << i.n_expert_used << " used per token)\n";
    const KvCacheConfig kvc = model->kv_config(1, 16);
    if (kvc.recurrent.n_layers > 0)
      std::cout << "recurrent:     " << kvc.recurrent.n_layers << " of " << i.n_layer << " layers (attention in "
                << kvc.n_layers << "); state " << human_bytes(double(kvc.recurrent.n_layers) *
                                                                double(kvc.recurrent.conv_elems + kvc.recurrent.state_elems) * 4.0)
                << " per sequence\n";
    // What `tessera run` would choose here (one sequence, the default context and
    // expert cache): the budget and its split, or why the model does not fit.
    const MemoryBudget budget = read_memory_budget();
    std::cout << "memory:        " << budget.describe() << "\n";
    EngineOptions eo;
    const int64_t n_ctx = std::min<int64_t>(i.context_length > 0 ? i.context_length : 4096, 4096);
    try {
      const MemoryPlan plan = plan_memory(memory_needs(*model, eo, n_ctx, false), budget);
      std::cout << "               " << plan.describe() << "\n";
      for (const std::string& w : plan.warnings) std::cout << "               note: " << printable(w, 600) << "\n";
    } catch (const Error& e) {
      std::cout << "               cannot run: " << printable(e.what(), 600) << "\n";
    }
  } else {
    const MetaValue* arch = f.metadata().find("general.architecture");
    std::cout << "architecture:  " << (arch && arch->as_string() ? printable(*arch->as_string(), 80) : "?")
              << "  (cannot run: " << printable(model_error) << ")\n";
  }

  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0, params = 0;
  for (const auto& t : f.tensors()) {
    auto& e = by_type[std::string(dtype_name(t.type))];
    e.first++;
    e.second += t.nbytes;
    total += t.nbytes;
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    params += uint64_t(n);
  }
  std::cout << "tensors:       " << f.tensors().size() << " (" << params << " parameters, "
            << human_bytes(double(total)) << ")\n";
  for (const auto& [name, e] : by_type)
    std::cout << "  " << std::left << std::setw(6) << name << std::right << std::setw(5) << e.first << " tensors  "
              << human_bytes(double(e.second)) << "\n";

  if (model && !model->unused_tensors().empty()) {
    const auto& unused = model->unused_tensors();
    std::cout << "unused:        " << unused.size() << " tensor" << (unused.size() == 1 ? "" : "s") << " that "
              << model->info().architecture << " does not read:";
    for (size_t k = 0; k < unused.size() && k < 16; ++k) std::cout << (k ? ", " : " ") << printable(unused[k], 80);
    if (unused.size() > 16) std::cout << ", ... (" << unused.size() - 16 << " more)";
    std::cout << "\n";
  }

  if (show_metadata) {
    std::cout << "metadata:\n";
    for (const auto& [k, v] : f.metadata().all()) std::cout << "  " << printable(k, 120) << " = " << value_str(v) << "\n";
  }
  if (show_tensors) {
    std::cout << "tensor list:\n";
    for (const auto& t : f.tensors()) {
      std::cout << "  " << std::left << std::setw(36) << printable(t.name, 120) << std::setw(6) << dtype_name(t.type) << " [";
      for (size_t d = 0; d < t.ne.size(); ++d) std::cout << (d ? ", " : "") << t.ne[d];
      std::cout << "]\n";
    }
  }
  if (check_tensors) {
    const std::vector<NonFiniteTensor> bad = find_non_finite_tensors(f);
    if (bad.empty()) {
      std::cout << "check:         every value of the " << f.tensors().size() << " tensors is finite\n";
    } else {
      std::cout << "check:         " << bad.size() << " of " << f.tensors().size()
                << " tensors hold NaN or infinite values:\n";
      for (const auto& b : bad) std::cout << "  " << describe(b) << "\n";
      check_stdout();
      throw Error(printable(f.path(), 200) + ": --check-tensors: " + std::to_string(bad.size()) +
                  " tensors hold NaN or infinite values (listed above)");
    }
  }
  return 0;
}

}  // namespace tessera::cli
