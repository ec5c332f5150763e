// tessera bench: prefill and decode throughput, median and spread over repetitions.
// Tokens are pseudo-random ids (fixed seed), so any model can be measured.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli_common.h"
#include "tessera/error.h"
#include "tessera/backend.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/scheduler.h"

namespace tessera::cli {
namespace {

struct Stats {
  double median, min, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {med, v.front(), v.back()};
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CommonOptions o;
  int n_prompt = 512, n_gen = 128, reps = 5;
  po::options_description desc("options");
  desc.add_options()
    ("n-prompt,p", po::value(&n_prompt)->default_value(512), "prompt tokens per prefill (0 = skip prefill)")
    ("n-gen,n", po::value(&n_gen)->default_value(128), "tokens decoded one at a time (0 = skip decode)")
    ("reps,r", po::value(&reps)->default_value(5), "repetitions (the median is reported)");
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera bench [-m MODEL] [-p 512] [-n 128] [-r 5] [--threads N] [--backend NAME]",
             desc, nullptr, vm))
    return 0;
  if (n_prompt < 0 || n_gen < 0 || reps < 1) throw Error("-p and -n must be >= 0 and -r >= 1");
  if (n_prompt + n_gen == 0) throw Error("nothing to measure: -p and -n are both 0");
  if (o.ctx == 0) o.ctx = n_prompt + n_gen + 1;

  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  const ModelInfo& mi = engine->model().info();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(mi.n_vocab - 1));
  std::vector<int32_t> prompt(size_t(std::max(n_prompt, 1)));

  std::printf("model: %s (%s, %lld layers, n_embd %lld)\nbackends:", engine->file().path().c_str(),
              mi.architecture.c_str(), (long long)mi.n_layer, (long long)mi.n_embd);
  for (const auto& b : engine->scheduler().backends()) std::printf(" %s", b->name().c_str());
  std::printf("; threads: %d; reps: %d\n", engine->threads(), reps);

  std::vector<double> pp, tg;
  for (int r = 0; r < reps + 1; ++r) {  // repetition 0 warms up caches and page tables
    engine->reset();
    for (auto& t : prompt) t = pick(rng);
    auto t0 = std::chrono::steady_clock::now();
    if (n_prompt > 0) engine->eval(prompt, false);
    else engine->eval(std::span<const int32_t>(prompt.data(), 1), false);
    double dt_p = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < n_gen; ++i) {
      int32_t t = pick(rng);
      engine->eval(std::span<const int32_t>(&t, 1), false);
    }
    double dt_g = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (r == 0) continue;
    if (n_prompt > 0) pp.push_back(n_prompt / dt_p);
    if (n_gen > 0) tg.push_back(n_gen / dt_g);
  }
  if (!pp.empty()) {
    Stats s = stats(pp);
    std::printf("prefill  %5d tokens: %10.2f tok/s median  (min %.2f, max %.2f)\n", n_prompt, s.median, s.min, s.max);
  }
  if (!tg.empty()) {
    Stats s = stats(tg);
    std::printf("decode   %5d tokens: %10.2f tok/s median  (min %.2f, max %.2f)\n", n_gen, s.median, s.min, s.max);
  }
  return 0;
}

}  // namespace tessera::cli
