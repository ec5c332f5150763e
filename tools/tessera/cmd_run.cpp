// tessera run: tokenize a prompt and stream up to N sampled tokens through the
// Generator (one request: prefill in chunks of --batch tokens, then decode), stopping
// at an end-of-generation token or a full context.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <unistd.h>

#include "cli_common.h"
#include "cli_grammar.h"
#include "server/text_stream.h"
#include "tessera/error.h"
#include "tessera/generator.h"
#include "tessera/model.h"
#include "tessera/sampler.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {
namespace {

// Emits only complete UTF-8 sequences, holding back a partial one across tokens. A
// failed write (full disk, closed pipe) stops the run with an error at once.
class Utf8Stream {
 public:
  void write(const std::string& bytes) {
    pending_ += bytes;
    const size_t complete = server::complete_utf8_prefix(pending_);
    std::fwrite(pending_.data(), 1, complete, stdout);
    pending_.erase(0, complete);
    check_stdout();
  }
  void flush() {
    std::fwrite(pending_.data(), 1, pending_.size(), stdout);
    pending_.clear();
    check_stdout();
  }

 private:
  std::string pending_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int cmd_run(int argc, char** argv) {
  CommonOptions o;
  std::string prompt;
  int n_predict = 64;
  SamplerParams sp;
  int64_t seed = -1;
  bool no_bos = false, show_placement = false, profile = false;
  po::options_description desc("options");
  desc.add_options()
    ("prompt,p", po::value(&prompt)->required(), "prompt text")
    ("n-predict,n", po::value(&n_predict)->default_value(64), "tokens to generate at most")
    ("seed", po::value(&seed)->default_value(-1), "random seed (-1 = random; the seed used is printed)")
    ("no-bos", po::bool_switch(&no_bos), "do not add the BOS token")
    ("show-placement", po::bool_switch(&show_placement), "print which backend runs each node of a decode step")
    ("profile", po::bool_switch(&profile), "print the time per op type and backend of the first prefill step and of "
                                           "the first decode step (nodes then run one by one, unfused)");
  add_sampling_options(desc, sp);
  SpecOptions spec;
  add_spec_options(desc, spec);
  GrammarOptions grammar;
  add_grammar_options(desc, grammar);
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera run [-m MODEL] -p TEXT [-n N] [sampling options] [--backend NAME]", desc,
             nullptr, vm))
    return 0;
  if (n_predict < 0) throw Error("-n must be >= 0");
  sp.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
  { Sampler check(sp); }  // validates the sampling parameters before the model loads

  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  const std::unique_ptr<Drafter> drafter = make_drafter(*reg, o, spec, *engine);
  const Tokenizer& tok = engine->tokenizer();
  const std::shared_ptr<GrammarConstraint> constraint = make_grammar(grammar, tok);
  std::vector<int32_t> ids = tok.encode(prompt, tok.add_bos_default() && !no_bos);
  if (ids.empty()) throw Error("the prompt is empty after tokenization (use a non-empty -p)");
  if (int64_t(ids.size()) >= engine->n_ctx())
    throw Error("the prompt has " + std::to_string(ids.size()) + " tokens and the context " +
                std::to_string(engine->n_ctx()) + " (raise --ctx)");

  Utf8Stream out;
  // With the prefill's progress on the terminal the prompt is echoed when it is done,
  // so the progress line does not overwrite it (stdout gets the same bytes either way).
  const bool long_prefill = int64_t(ids.size()) > engine->batch_tokens() && isatty(STDERR_FILENO) == 1;
  bool echoed = false;
  auto echo_prompt = [&] {
    if (!echoed) out.write(prompt);
    echoed = true;
  };
  if (!long_prefill) echo_prompt();
  int generated = 0;
  double t_prefill = 0, t_decode = 0;
  std::vector<std::pair<std::string, OpProfile>> profiles;
  Generator::Stats stats;
  if (n_predict > 0) {
    GeneratorOptions go;
    go.drafter = drafter.get();
    Generator gen(*engine, go);
    GenerationRequest req;
    req.prompt = ids;
    req.sampling = sp;
    req.max_tokens = n_predict;
    req.spec_max = drafter ? spec.spec_max : 0;
    req.grammar = constraint;
    gen.add(std::move(req));
    OpProfile prof;
    bool prefill_profiled = false, decode_profiled = false, first = true;
    // A prompt of several steps shows its prefill's progress on a terminal.
    Progress progress("prefill", int64_t(ids.size()));
    const int64_t evaluated_before = engine->tokens_evaluated();
    auto t0 = std::chrono::steady_clock::now();
    while (!gen.idle()) {
      // The first step is a prefill step; the first step after the first token a decode step.
      const bool profile_now = profile && (!prefill_profiled || (!first && !decode_profiled));
      if (profile_now) {
        prof.clear();
        engine->set_profile(&prof);
      }
      const auto events = gen.step();
      if (first && int64_t(ids.size()) > engine->batch_tokens())
        progress.update(std::min<int64_t>(engine->tokens_evaluated() - evaluated_before, int64_t(ids.size())));
      if (profile_now) {
        engine->set_profile(nullptr);
        // Printed after the text, which streams to stdout meanwhile.
        profiles.emplace_back(prefill_profiled ? "decode step (1 token)"
                                               : "prefill step (" +
                                                     std::to_string(std::min<int64_t>(o.batch, int64_t(ids.size()))) +
                                                     " tokens)",
                              prof);
        (prefill_profiled ? decode_profiled : prefill_profiled) = true;
      }
      for (const GenerationEvent& ev : events) {
        if (first) {
          progress.done();
          echo_prompt();
          t_prefill = seconds_since(t0);
          t0 = std::chrono::steady_clock::now();
          first = false;
        }
        ++generated;
        if (ev.token >= 0) out.write(tok.token_to_piece(ev.token));
        if (ev.finish == FinishReason::Failed) throw Error(ev.error);
        if (ev.finish == FinishReason::ContextFull)
          std::fprintf(stderr, "\n[context of %lld tokens is full]\n", (long long)engine->n_ctx());
      }
    }
    t_decode = generated > 1 ? seconds_since(t0) : 0.0;
    stats = gen.stats();
  } else {  // -n 0: the prefill alone
    auto t0 = std::chrono::steady_clock::now();
    prefill_with_progress(*engine, ids);
    t_prefill = seconds_since(t0);
  }
  echo_prompt();
  out.flush();
  std::printf("\n");
  check_stdout();  // the statistics below go to stderr: keep them after the text
  if (show_placement) std::fprintf(stderr, "%s", engine->placement().c_str());
  for (const auto& [title, table] : profiles) print_profile(title, table);
  const int decoded = std::max(generated - 1, 0);  // the first token comes from the prefill's logits
  std::fprintf(stderr, "[prefill %zu tokens in %.3f s (%.1f tok/s); generated %d tokens, the %d after the first in "
               "%.3f s (%.1f tok/s); seed %llu; %d threads]\n",
               ids.size(), t_prefill, t_prefill > 0 ? double(ids.size()) / t_prefill : 0.0, generated, decoded,
               t_decode, decoded > 0 && t_decode > 0 ? double(decoded) / t_decode : 0.0,
               (unsigned long long)sp.seed, engine->threads());
  if (drafter)
    std::fprintf(stderr, "[speculative (%s): %lld steps verified %lld drafted tokens, %lld accepted (%.0f%%)]\n",
                 drafter->name().c_str(), (long long)stats.spec_steps, (long long)stats.drafted_tokens,
                 (long long)stats.accepted_tokens,
                 stats.drafted_tokens > 0 ? 100.0 * double(stats.accepted_tokens) / double(stats.drafted_tokens) : 0.0);
  return 0;
}

}  // namespace tessera::cli
