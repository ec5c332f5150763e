// tessera logits: raw little-endian float32 logits, one row of n_vocab per token,
// from one batched prefill of the given token ids.
#include <bit>
#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "tessera/error.h"

namespace tessera::cli {

int cmd_logits(int argc, char** argv) {
  CommonOptions o;
  std::string tokens, out_path;
  bool show_placement = false;
  po::options_description desc("options");
  desc.add_options()
    ("tokens", po::value(&tokens)->required(), "comma-separated token ids, e.g. 1,2,3 (no BOS is added)")
    ("out,o", po::value(&out_path)->required(), "output file: float32 little-endian [n_tokens][n_vocab]")
    ("show-placement", po::bool_switch(&show_placement), "print which backend runs each node");
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera logits -m MODEL --tokens 1,2,3 --out FILE [--backend NAME]", desc, nullptr, vm))
    return 0;
  std::vector<int32_t> ids = parse_token_list(tokens);

  // The output is created (under a temporary name) before anything is computed, so an
  // unwritable folder fails at once; it gets its name only when complete.
  AtomicFile out(out_path);
  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  auto logits = engine->eval(ids, true);
  if (show_placement) std::cerr << engine->placement();

  static_assert(std::endian::native == std::endian::little, "logits are written in host order");
  out.write(logits.data(), logits.size() * sizeof(float));
  out.commit();
  std::cerr << "wrote " << ids.size() << " x " << engine->n_vocab() << " logits to " << out_path << "\n";
  return 0;
}

}  // namespace tessera::cli
