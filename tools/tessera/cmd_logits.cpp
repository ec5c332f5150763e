// tessera logits: raw little-endian float32 logits, one row of n_vocab per token,
// from one batched prefill of the given token ids; with --tokens given several times,
// one sequence each, all in the same forward step, rows sequence after sequence.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "cli_common.h"
#include "tessera/error.h"

namespace tessera::cli {

int cmd_logits(int argc, char** argv) {
  CommonOptions o;
  std::vector<std::string> tokens;
  std::string out_path;
  bool show_placement = false;
  po::options_description desc("options");
  desc.add_options()
    ("tokens", po::value(&tokens)->required()->composing(),
     "comma-separated token ids, e.g. 1,2,3 (no BOS is added); given again, another sequence in the same step")
    ("out,o", po::value(&out_path)->required(), "output file: float32 little-endian [n_tokens][n_vocab] (all sequences' tokens)")
    ("show-placement", po::bool_switch(&show_placement), "print which backend runs each node");
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera logits -m MODEL --tokens 1,2,3 --out FILE [--backend NAME]", desc, nullptr, vm))
    return 0;
  std::vector<std::vector<int32_t>> lists;
  size_t n_tokens = 0;
  for (const std::string& t : tokens) n_tokens += lists.emplace_back(parse_token_list(t)).size();
  if (lists.size() > 1) o.parallel = std::max(o.parallel, int(lists.size()));  // a sequence each

  // The output is created (under a temporary name) before anything is computed, so an
  // unwritable folder fails at once; it gets its name only when complete.
  AtomicFile out(out_path);
  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  std::span<const float> logits;
  if (lists.size() == 1) {
    logits = engine->eval(lists[0], true);
  } else {
    if (int64_t(n_tokens) > engine->batch_tokens())
      throw Error("the " + std::to_string(lists.size()) + " sequences hold " + std::to_string(n_tokens) +
                  " tokens, more than one forward step takes (--batch " + std::to_string(engine->batch_tokens()) +
                  "): raise --batch");
    std::vector<Engine::Chunk> chunks;
    for (const std::vector<int32_t>& ids : lists)
      chunks.push_back({engine->kv().create_sequence(), ids, Engine::Logits::All});
    logits = engine->forward(chunks);
  }
  if (show_placement) std::cerr << engine->placement();

  static_assert(std::endian::native == std::endian::little, "logits are written in host order");
  out.write(logits.data(), logits.size() * sizeof(float));
  out.commit();
  std::cerr << "wrote " << n_tokens << " x " << engine->n_vocab() << " logits to " << out_path << "\n";
  return 0;
}

}  // namespace tessera::cli
