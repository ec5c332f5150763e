// tessera backends: every plugin file found, with its score, usability and rank.
#include <iomanip>
#include <iostream>

#include "cli_common.h"
#include "tessera/hwprobe.h"
#include "tessera/model_file.h"

namespace tessera::cli {

int cmd_backends(int argc, char** argv) {
  CommonOptions o;
  po::options_description desc("options");
  add_common_options(desc, o, false);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera backends [--plugins FILE]", desc, nullptr, vm)) return 0;

  auto reg = make_registry(o);
  // Names, files and reasons come from plugins and the file system: escaped.
  std::cout << "cpu: " << printable(cpu_features().brand, 100) << "\n     " << cpu_features().summary() << "\n";
  std::cout << "plugin folders:";
  for (const auto& p : reg->config().paths) std::cout << " " << printable(p, 300);
  std::cout << "\n\n";
  // rank: what orders usable plugins (plugins.toml's rank, else the probe score);
  // order: the backend's place in the default preference list.
  std::cout << std::left << std::setw(20) << "name" << std::setw(9) << "kind" << std::setw(7) << "score"
            << std::setw(6) << "rank" << std::setw(7) << "order" << std::setw(8) << "usable" << "file / reason\n";
  int order = 0;
  for (const auto& r : reg->records()) {
    const std::string pos = r.usable && r.kind == "backend" ? std::to_string(++order) : "-";
    const std::string name = r.name.empty() ? "?" : printable(r.name, 64);
    std::cout << std::left << std::setw(20) << (name.size() < 20 ? name : name + " ") << std::setw(9)
              << printable(r.kind, 16) << std::setw(7) << r.score << std::setw(6)
              << (r.usable ? std::to_string(r.rank) : std::string("-")) << std::setw(7) << pos << std::setw(8)
              << (r.usable ? "yes" : "no") << printable(r.file, 300) << "\n";
    if (!r.usable) std::cout << std::string(57, ' ') << "why not: " << printable(r.reason, 400) << "\n";
    else if (!r.reason.empty()) std::cout << std::string(57, ' ') << "probe: " << printable(r.reason, 400) << "\n";
  }
  if (reg->records().empty()) std::cout << "(no plugins found)\n";
  return 0;
}

}  // namespace tessera::cli
