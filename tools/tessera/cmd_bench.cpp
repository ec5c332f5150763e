// tessera bench: prefill and decode throughput, median and spread over repetitions,
// beside their physical bounds. Tokens are pseudo-random ids (fixed seed), so any
// model can be measured.
//
// Decode roofline: a decoded token reads every weight the forward pass uses once
// (all matrices and norms; one row of token_embd, or all of it when the output
// matrix is tied to it; of a mixture-of-experts tensor only the n_expert_used
// experts the token is routed to: the *active* weights) plus the KV cache up to its
// position and, for recurrent layers, their state (read and written); tokens/s
// cannot exceed (read bandwidth, probed after each decode run) / (those bytes). The
// bandwidth is probed twice: over a fresh buffer, and over the bytes the backend
// streams for the model's weights where they lie (decision 23). Prefill:
// FLOPs per token = 2 x active parameters of the matrices (attention score and
// delta-net recurrence FLOPs not included), against the arithmetic peak probed after
// each prefill run on a CPU backend (tessera/compute_peak.h: int8 vpdpbusd when most
// matrix parameters are quantized, else f32 FMA). With several threads, the cost of an
// empty FastPool dispatch is probed beside the bandwidth (tessera/dispatch_probe.h):
// on a VM it says which placement of the executors the run got.
// --json prints everything as one JSON object on stdout instead of the text report.
//
// --parallel N: N sequences, each with its own -p-token prompt, prefilled together
// (steps of up to --batch tokens) and then decoded together for -n steps (one token
// of every sequence per forward pass); the tok/s figures are then aggregates over all
// N sequences. The roofline is per sequence, so it is reported only for N = 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tessera/expert_stream.h"

#include "cli_common.h"
#include "tessera/rank_group.h"
#include "cli_grammar.h"
#include "tessera/backend.h"
#include "tessera/compute_peak.h"
#include "tessera/dispatch_probe.h"
#include "tessera/dtype.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/generator.h"
#include "tessera/grammar.h"
#include "tessera/hwprobe.h"
#include "tessera/membw.h"
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

// What one token of the forward pass reads and computes, from the model's weights.
struct WeightCost {
  double bytes_per_token = 0;  // weights read per decoded token (active experts only)
  double matrix_params = 0;    // parameters of the matrices multiplied per token
  double quantized_params = 0;  // of those, in a quantized dtype
  double total_bytes = 0;      // every distinct weight tensor
};

WeightCost weight_cost(const Model& model) {
  // weights() is non-const only because backends may repack through it; we only read.
  std::vector<Tensor*> ws = const_cast<Model&>(model).weights();
  const std::string embd = "token_embd.weight";
  int embd_uses = 0;
  for (const Tensor* t : ws)
    if (t->name == embd) ++embd_uses;
  const ModelInfo& mi = model.info();
  WeightCost c;
  bool embd_counted = false;
  for (const Tensor* t : ws) {
    const double nbytes = double(t->nbytes());
    // Expert tensors are [K, N, n_expert]: a token reads n_expert_used of the slices.
    const double active = mi.n_expert > 1 && t->ne[2] == mi.n_expert ? double(mi.n_expert_used) / double(mi.n_expert) : 1.0;
    const bool matrix = t->ne[1] > 1;
    if (t->name == embd) {
      if (embd_counted) continue;  // tied output: the same matrix, counted once in full
      embd_counted = true;
      c.total_bytes += nbytes;
      if (embd_uses > 1) {  // tied: read in full as the output matrix
        c.bytes_per_token += nbytes;
        c.matrix_params += double(t->nelements());
        if (dtype_traits(t->type).quantized) c.quantized_params += double(t->nelements());
      } else {  // embedding lookup: one row per token
        c.bytes_per_token += double(t->row_size());
      }
      continue;
    }
    c.total_bytes += nbytes;
    c.bytes_per_token += nbytes * active;
    if (matrix) {
      c.matrix_params += double(t->nelements()) * active;
      if (dtype_traits(t->type).quantized) c.quantized_params += double(t->nelements()) * active;
    }
  }
  return c;
}

// The bytes the first backend (the one that prepared the weights) streams for every
// weight a matrix product reads, in the model's order (a GetRows table, of which
// decode reads one row, is left out).
std::vector<std::span<const std::byte>> streamed_weight_spans(const Engine& engine) {
  std::vector<std::span<const std::byte>> out;
  Backend& be = *engine.scheduler().backends().front();
  for (const Tensor* t : engine.product_weights()) {
    auto sp = be.weight_bytes(*t);
    if (!sp.empty()) out.push_back(sp);
  }
  return out;
}

// One result from probes taken after each timed run (bandwidth after decode, the
// arithmetic peak after prefill): the median of their medians, the extremes of all
// their passes, the number of probes; the other fields (e.g. the read pattern a
// bandwidth probe kept) are those of the probe nearest that median.
template <typename R>
R combine(const std::vector<R>& probes, double R::*median, double R::*min, double R::*max) {
  if (probes.empty()) return R{};
  std::vector<double> med;
  for (const R& p : probes) med.push_back(p.*median);
  const double m = stats(med).median;
  R out = *std::min_element(probes.begin(), probes.end(), [&](const R& a, const R& b) {
    return std::abs(a.*median - m) < std::abs(b.*median - m);
  });
  for (const R& p : probes) {
    out.*min = std::min(out.*min, p.*min);
    out.*max = std::max(out.*max, p.*max);
  }
  out.*median = m;
  out.reps = int(med.size());
  return out;
}
BandwidthResult combine(const std::vector<BandwidthResult>& probes) {
  return combine(probes, &BandwidthResult::median_gbs, &BandwidthResult::min_gbs, &BandwidthResult::max_gbs);
}
PeakResult combine(const std::vector<PeakResult>& probes) {
  return combine(probes, &PeakResult::median_gops, &PeakResult::min_gops, &PeakResult::max_gops);
}
DispatchResult combine(const std::vector<DispatchResult>& probes) {
  return combine(probes, &DispatchResult::median_ns, &DispatchResult::min_ns, &DispatchResult::max_ns);
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (f >> a >> b >> c) return a + " " + b + " " + c;
  return "?";
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CommonOptions o;
  int n_prompt = 512, n_gen = 128, reps = 5, bw_mib = 512, peak_runs = 3;
  bool json = false, profile = false;
  po::options_description desc("options");
  desc.add_options()
    ("n-prompt,p", po::value(&n_prompt)->default_value(512), "prompt tokens per prefill (0 = skip prefill)")
    ("n-gen,n", po::value(&n_gen)->default_value(128), "tokens decoded one at a time (0 = skip decode)")
    ("reps,r", po::value(&reps)->default_value(5), "repetitions (the median is reported)")
    ("membw-mib", po::value(&bw_mib)->default_value(512),
     "fresh buffer of the read-bandwidth probe behind the decode roofline (the fastest of three read patterns), "
     "MiB; it and a read of the model's weights where they lie run after each timed decode, with (several "
     "threads) a probe of the pool's empty dispatch (0 = skip all three)")
    ("peak-runs", po::value(&peak_runs)->default_value(3),
     "runs (20 ms each) of the arithmetic-peak probe behind prefill's fraction, after each timed prefill on a CPU "
     "backend with AVX-512 (0 = skip)")
    ("parallel", po::value(&o.parallel)->default_value(1),
     "sequences prefilled and decoded together, each with its own -p-token prompt; tok/s are then aggregates over "
     "all of them")
    ("profile", po::bool_switch(&profile), "after the timed runs, print the time per op type and backend of one "
                                           "prefill step and one decode step (nodes then run one by one, unfused)")
    ("json", po::bool_switch(&json), "print the results as one JSON object");
  SpecOptions spec;
  add_spec_options(desc, spec);
  GrammarOptions grammar;
  add_grammar_options(desc, grammar);
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera bench [-m MODEL] [-p 512] [-n 128] [-r 5] [--parallel N] [--spec KIND] [--json-schema S] "
             "[--threads N] [--backend NAME] [--json]",
             desc, nullptr, vm))
    return 0;
  if (n_prompt < 0 || n_gen < 0 || reps < 1) throw Error("-p and -n must be >= 0 and -r >= 1");
  if (n_prompt + n_gen == 0) throw Error("nothing to measure: -p and -n are both 0");
  if (bw_mib < 0) throw Error("--membw-mib must be >= 0");
  if (peak_runs < 0) throw Error("--peak-runs must be >= 0");
  if (o.parallel < 1) throw Error("--parallel must be >= 1");
  const int n_par = o.parallel;
  // --spec (none included) and a grammar: decode generates greedily through the
  // Generator, so the tokens fed are the model's own (drafts can be verified against
  // them, a grammar's masks are computed for them).
  const bool constrained = !grammar.grammar_file.empty() || !grammar.grammar.empty() || !grammar.json_schema.empty();
  const bool generated_decode = !spec.spec.empty() || constrained;
  const char* why_generated = constrained ? "a grammar" : "--spec";
  if (generated_decode && n_par > 1)
    throw Error(std::string(why_generated) + " measures one sequence; leave out --parallel");
  if (generated_decode && n_prompt < 1) throw Error(std::string(why_generated) + " needs a prompt: -p must be >= 1");
  // The context is sized to the prompt and generation (decision 8), but never silently
  // beyond what the model was trained for: past it, --ctx must say so.
  const int64_t needed = int64_t(n_prompt) + n_gen + 1;
  auto reg = make_registry(o);
  if (o.ctx == 0) {
    const int64_t trained = trained_context_length(*reg, o);
    if (needed > trained)
      throw Error("-p " + std::to_string(n_prompt) + " and -n " + std::to_string(n_gen) + " need a context of " +
                  std::to_string(needed) + " positions, more than the model's trained context length " +
                  std::to_string(trained) + " (prefill cost grows with the square of it); pass --ctx " +
                  std::to_string(needed) + " to measure past it anyway");
    o.ctx = needed;
  } else if (o.ctx < needed) {
    throw Error("--ctx " + std::to_string(o.ctx) + " is too small for -p " + std::to_string(n_prompt) + " and -n " +
                std::to_string(n_gen) + " (" + std::to_string(needed) + " positions needed)");
  }
  auto engine = make_engine(*reg, o);
  const std::unique_ptr<Drafter> drafter = make_drafter(*reg, o, spec, *engine);
  const std::shared_ptr<GrammarConstraint> constraint = make_grammar(grammar, engine->tokenizer());
  GrammarConstraint::Stats grammar_stats;  // over the timed decode runs, each with a fresh cache
  const ModelInfo& mi = engine->model().info();
  const CpuFeatures& cpu = cpu_features();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(mi.n_vocab - 1));
  std::vector<int32_t> prompt(size_t(std::max(n_prompt, 1)));
  std::string backends;
  for (const auto& b : engine->scheduler().backends()) {
    if (!backends.empty()) backends += ',';
    backends += b->name();
  }

  if (!json) {
    // Family and model tell machines with the same brand string apart (virtual machines
    // often report only the vendor's product line), and kernels can be chosen by them
    // (decision 32).
    std::printf("machine: %s (family 0x%X, model 0x%X); %u hardware threads; load average %s\n", cpu.brand.c_str(),
                unsigned(cpu.family), unsigned(cpu.model), std::thread::hardware_concurrency(), loadavg().c_str());
    std::printf("model: %s (%s, %lld layers, n_embd %lld%s)\nbackends: %s; threads: %d; reps: %d; parallel: %d; "
                "batch: %lld tokens\n",
                engine->file().path().c_str(), mi.architecture.c_str(), (long long)mi.n_layer, (long long)mi.n_embd,
                o.quantize.empty() ? "" : (", quantized to " + o.quantize + " at load").c_str(), backends.c_str(), engine->threads(), reps, n_par, (long long)engine->batch_tokens());
    std::fflush(stdout);
  }
  const std::string load_before = loadavg();

  // The read bandwidth behind the decode roofline is probed right after each timed
  // decode run, so probe and decode sample the same minutes: on a shared VM the
  // bandwidth drifts by tens of percent over a run, and one probe at the end could
  // be taken in another phase than the decode it bounds. The pause first lets the
  // engine's workers go to sleep; the probe uses as many executors as the engine.
  // A second probe streams the model's weights themselves, the bytes the backend
  // reads for them where they lie (decision 23): on a VM, pages can read slower or
  // faster than the fresh buffer of the first probe, depending on where the host
  // placed them (docs/performance.md).
  //
  // The arithmetic peak behind prefill's fraction is probed right after each timed
  // prefill for the same reason, on CPU backends only (a GPU's peak is not the
  // host's): the instruction of the products that dominate, int8 dot products when
  // most matrix parameters are quantized, else f32 FMA. Both probes share one pool.
  constexpr int kProbePasses = 3;
  const WeightCost wc = weight_cost(engine->model());
  const PeakKernel peak_kernel = wc.quantized_params * 2 >= wc.matrix_params ? PeakKernel::VnniInt8 : PeakKernel::FmaF32;
  const std::string first_backend = engine->scheduler().backends().front()->name();
  const bool probe_bandwidth = bw_mib > 0 && n_gen > 0 && n_par == 1;
  const bool probe_peak =
      peak_runs > 0 && n_prompt > 0 && first_backend.rfind("cpu", 0) == 0 && peak_kernel_usable(peak_kernel);
  std::unique_ptr<FastPool> probe_pool;
  if (probe_bandwidth || probe_peak) probe_pool = std::make_unique<FastPool>(engine->threads());
  std::vector<BandwidthResult> probes, weight_probes;
  std::vector<PeakResult> peaks;
  std::vector<DispatchResult> dispatches;
  std::vector<std::span<const std::byte>> weight_spans;
  if (probe_bandwidth) {
    weight_spans = streamed_weight_spans(*engine);
    if (spans_read_bytes(weight_spans) < (size_t(1) << 20)) weight_spans.clear();  // too little to time
  }
  auto let_engine_sleep = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * FastPool::kIdleSleepMicros / 1000 + 1));
  };
  auto probe = [&] {
    let_engine_sleep();
    probes.push_back(measure_read_bandwidth_ex(*probe_pool, size_t(bw_mib) << 20, kProbePasses));
    if (!weight_spans.empty())
      weight_probes.push_back(measure_read_bandwidth_spans(*probe_pool, weight_spans, kProbePasses));
    if (probe_pool->executor_count() > 1) dispatches.push_back(measure_dispatch(*probe_pool));
  };

  // --parallel: every sequence's prompt, prefilled in steps that fill the batch, then
  // one decode token of every sequence per step.
  std::vector<KvCache::SeqId> seqs;
  std::vector<std::vector<int32_t>> prompts(size_t(n_par), prompt);
  auto parallel_prefill = [&] {
    for (auto sq : seqs) engine->kv().free_sequence(sq);
    seqs.clear();
    for (auto& p : prompts) {
      for (auto& t : p) t = pick(rng);
      seqs.push_back(engine->kv().create_sequence());
    }
    const int64_t len = int64_t(prompt.size());
    std::vector<int64_t> done(size_t(n_par), 0);
    std::vector<Engine::Chunk> chunks;
    for (size_t next = 0; next < size_t(n_par);) {
      chunks.clear();
      int64_t budget = engine->batch_tokens();
      for (size_t i = next; i < size_t(n_par) && budget > 0; ++i) {
        const int64_t n = std::min(budget, len - done[i]);
        const bool last = done[i] + n == len;
        chunks.push_back({seqs[i], std::span<const int32_t>(prompts[i].data() + done[i], size_t(n)),
                          last ? Engine::Logits::Last : Engine::Logits::None});
        done[i] += n;
        budget -= n;
      }
      engine->forward(chunks);
      while (next < size_t(n_par) && done[next] == len) ++next;
    }
  };
  std::vector<int32_t> step_tokens(static_cast<size_t>(n_par));
  std::vector<Engine::Chunk> step_chunks(static_cast<size_t>(n_par));
  auto parallel_decode_step = [&] {
    for (size_t i = 0; i < size_t(n_par); ++i) {
      step_tokens[i] = pick(rng);
      step_chunks[i] = {seqs[i], std::span<const int32_t>(&step_tokens[i], 1), Engine::Logits::Last};
    }
    engine->forward(step_chunks);
  };

  std::vector<double> pp, tg;
  // Streamed experts: what the timed decode runs read (deltas of the stream's counters).
  ExpertStreamStats xs_decode{};
  int64_t xs_tokens = 0;
  TransferStats decode_transfers;  // host <-> device bytes over the timed decode steps
  RankTraffic decode_traffic;      // a distributed run: rank 0's messages over the timed decode steps
  auto traffic_now = [&] { return engine->ranks() ? engine->ranks()->traffic() : RankTraffic{}; };
  int64_t decode_tokens = 0;
  int64_t spec_steps = 0, spec_drafted = 0, spec_accepted = 0;  // --spec: over the timed decode runs
  double spec_cost = 0;  // --spec: the measured cost of a drafted token at the end
  auto xs_now = [&] { return engine->expert_stream() ? engine->expert_stream()->stats() : ExpertStreamStats{}; };
  for (int r = 0; r < reps + 1; ++r) {  // repetition 0 warms up caches and page tables
    engine->reset();
    for (auto& t : prompt) t = pick(rng);
    // --spec: one Generator request prefills the prompt (until its first token) and
    // then decodes greedily; the engine's own sequence is not used.
    std::optional<Generator> gen;
    Generator::Stats gen_before;
    const std::shared_ptr<GrammarConstraint> rep_constraint = constraint ? constraint->fresh() : nullptr;
    auto t0 = std::chrono::steady_clock::now();
    if (generated_decode) {
      GeneratorOptions go;
      go.drafter = drafter.get();
      go.prefix_cache = false;
      gen.emplace(*engine, go);
      GenerationRequest req;
      req.prompt = prompt;
      req.sampling.temperature = 0;
      req.max_tokens = n_gen + 1;  // the first comes from the prompt's logits
      req.ignore_eos = true;
      req.spec_max = drafter ? spec.spec_max : 0;
      req.grammar = rep_constraint;
      gen->add(std::move(req));
      bool first = false;
      while (!gen->idle() && !first)
        for (const GenerationEvent& ev : gen->step()) first = first || ev.token >= 0 || ev.finish != FinishReason::None;
      gen_before = gen->stats();
    } else if (n_par > 1) {
      parallel_prefill();
    } else if (n_prompt > 0) {
      prefill_with_progress(*engine, prompt);  // progress on a terminal only
    } else {
      engine->eval(std::span<const int32_t>(prompt.data(), 1), false);
    }
    double dt_p = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (probe_peak && r > 0) {  // outside the timed decode below
      let_engine_sleep();
      peaks.push_back(measure_compute_peak(*probe_pool, peak_kernel, peak_runs));
    }
    const ExpertStreamStats xs0 = xs_now();
    const TransferStats tr0 = engine->transfers();
    const RankTraffic rt0 = traffic_now();
    auto t1 = std::chrono::steady_clock::now();
    if (gen) {
      int decoded = 0;
      while (!gen->idle())
        for (const GenerationEvent& ev : gen->step()) {
          if (ev.finish == FinishReason::Failed) throw Error(ev.error);
          decoded += ev.token >= 0;
          if (ev.finish == FinishReason::Stop && decoded < n_gen)
            throw Error("the grammar ended the answer after " + std::to_string(decoded + 1) + " tokens, before -n " +
                        std::to_string(n_gen) + ": give one that goes on (a JSON array of strings, say) or a "
                        "smaller -n");
        }
      if (r > 0 && rep_constraint) {
        const GrammarConstraint::Stats st = rep_constraint->stats();
        grammar_stats.states += st.states;
        grammar_stats.mask_hits += st.mask_hits;
        grammar_stats.mask_misses += st.mask_misses;
      }
      if (r > 0) {
        spec_steps += gen->stats().steps - gen_before.steps;
        spec_drafted += gen->stats().drafted_tokens - gen_before.drafted_tokens;
        spec_accepted += gen->stats().accepted_tokens - gen_before.accepted_tokens;
        spec_cost = gen->stats().spec_relative_cost;
      }
    }
    for (int i = 0; i < (generated_decode ? 0 : n_gen); ++i) {
      if (n_par > 1) {
        parallel_decode_step();
        continue;
      }
      int32_t t = pick(rng);
      engine->eval(std::span<const int32_t>(&t, 1), false);
    }
    double dt_g = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (r == 0) continue;
    const TransferStats tr1 = engine->transfers();
    decode_transfers.upload_bytes += tr1.upload_bytes - tr0.upload_bytes;
    decode_transfers.download_bytes += tr1.download_bytes - tr0.download_bytes;
    const RankTraffic rt1 = traffic_now();
    decode_traffic.bytes_sent += rt1.bytes_sent - rt0.bytes_sent;
    decode_traffic.bytes_received += rt1.bytes_received - rt0.bytes_received;
    decode_traffic.seconds += rt1.seconds - rt0.seconds;
    decode_tokens += int64_t(n_gen) * n_par;
    if (const ExpertStreamStats xs1 = xs_now(); engine->expert_stream()) {
      xs_decode.lookups += xs1.lookups - xs0.lookups;
      xs_decode.hits += xs1.hits - xs0.hits;
      xs_decode.prefetched += xs1.prefetched - xs0.prefetched;
      xs_decode.prefetch_hits += xs1.prefetch_hits - xs0.prefetch_hits;
      xs_decode.bytes_read += xs1.bytes_read - xs0.bytes_read;
      xs_decode.read_seconds += xs1.read_seconds - xs0.read_seconds;
      xs_decode.stall_seconds += xs1.stall_seconds - xs0.stall_seconds;
      xs_tokens += int64_t(n_gen) * n_par;
    }
    if (n_prompt > 0) pp.push_back(double(n_prompt) * n_par / dt_p);
    if (n_gen > 0) tg.push_back(double(n_gen) * n_par / dt_g);
    if (probe_bandwidth) probe();
  }
  if (profile) {  // one more prefill and decode step, timed per node
    OpProfile prof;
    engine->reset();
    engine->set_profile(&prof);
    const int64_t np = std::min<int64_t>(std::max(n_prompt, 1), engine->batch_tokens());
    engine->eval(std::span<const int32_t>(prompt.data(), size_t(np)), false);
    print_profile("prefill step (" + std::to_string(np) + " tokens)", prof);
    prof.clear();
    int32_t t = pick(rng);
    if (engine->position() < engine->n_ctx()) {
      engine->eval(std::span<const int32_t>(&t, 1), false);
      print_profile("decode step (1 token)", prof);
    }
    engine->set_profile(nullptr);
  }

  // Physical bounds: the bandwidth is the median of the probes' medians (one probe
  // per timed decode run), with the extremes of every pass.
  const BandwidthResult bw = combine(probes), wbw = combine(weight_probes);
  const PeakResult peak = combine(peaks);
  const DispatchResult barrier = combine(dispatches);
  // KV cache (F16 K and V) read per position attended, and the mean number of
  // positions a decoded token attends over (the first decoded token sits at
  // position max(n_prompt, 1) and attends to itself and everything before it).
  // Sliding-window layers attend to their window at most. Recurrent layers read and
  // write their whole state once per token.
  const KvCacheConfig kvc = engine->model().kv_config(engine->n_ctx(), 16);
  const double kv_bytes_per_layer_pos =
      (kvc.v_in_k > 0 ? 1.0 : 2.0) * double(kvc.n_kv_heads) * double(kvc.head_dim) * 2.0;
  const double kv_bytes_per_pos = kv_bytes_per_layer_pos * double(kvc.n_layers);  // every layer
  const double mean_attended = double(std::max(n_prompt, 1)) + (double(n_gen) - 1.0) / 2.0 + 1.0;
  double kv_bytes = 0;
  for (int l = 0; l < kvc.n_layers; ++l)
    kv_bytes += kv_bytes_per_layer_pos *
                (kvc.windowed(l) ? std::min(mean_attended, double(kvc.window)) : mean_attended);
  const double state_bytes =
      double(kvc.recurrent.n_layers) * double(kvc.recurrent.conv_elems + kvc.recurrent.state_elems) * 4.0 * 2.0;
  const double decode_bytes = wc.bytes_per_token + kv_bytes + state_bytes;
  const double roofline = bw.median_gbs > 0 ? bw.median_gbs * 1e9 / decode_bytes : 0.0;
  const double roofline_in_place = wbw.median_gbs > 0 ? wbw.median_gbs * 1e9 / decode_bytes : 0.0;
  const double flops_per_token = 2.0 * wc.matrix_params;
  // Each decode run against the probe taken right after it: the VM's bandwidth can
  // change phase between runs, and then the median run over the median probe pairs
  // a run with another phase's bound (printed fractions above 100% in such runs,
  // docs/performance.md). The median of the per-run fractions does not.
  std::vector<double> per_run, per_run_in_place;
  for (size_t i = 0; i < tg.size(); ++i) {
    if (i < probes.size() && probes[i].median_gbs > 0)
      per_run.push_back(tg[i] * decode_bytes / (probes[i].median_gbs * 1e9));
    if (i < weight_probes.size() && weight_probes[i].median_gbs > 0)
      per_run_in_place.push_back(tg[i] * decode_bytes / (weight_probes[i].median_gbs * 1e9));
  }
  const Stats fr = per_run.empty() ? Stats{} : stats(per_run);
  const Stats fr_in_place = per_run_in_place.empty() ? Stats{} : stats(per_run_in_place);

  nlohmann::json j;
  j["machine"] = {{"cpu_brand", cpu.brand},
                  {"cpu_family", cpu.family},
                  {"cpu_model", cpu.model},
                  {"cpu_features", cpu.summary()},
                  {"hardware_threads", std::thread::hardware_concurrency()},
                  {"loadavg_before", load_before},
                  {"loadavg_after", loadavg()}};
  j["model"] = {{"path", engine->file().path()},
                {"quantize", o.quantize},  // --quantize TYPE, "" when not asked
                {"architecture", mi.architecture},
                {"name", mi.name},
                {"n_layer", mi.n_layer},
                {"n_embd", mi.n_embd},
                {"n_vocab", mi.n_vocab},
                {"weight_bytes", wc.total_bytes},
                {"n_expert", mi.n_expert},
                {"n_expert_used", mi.n_expert_used},
                {"matrix_params", wc.matrix_params}};
  j["backends"] = backends;
  j["threads"] = engine->threads();
  j["reps"] = reps;
  j["parallel"] = n_par;
  j["batch_tokens"] = engine->batch_tokens();
  if (bw.median_gbs > 0)
    j["membw"] = {{"read_gbs_median", bw.median_gbs}, {"read_gbs_min", bw.min_gbs}, {"read_gbs_max", bw.max_gbs},
                  {"kernel", std::string(read_kernel_name(bw.kernel))}, {"buffer_bytes", bw.bytes},
                  {"probes", bw.reps}, {"passes_per_probe", kProbePasses}, {"threads", bw.threads}};
  if (wbw.median_gbs > 0)
    j["membw_weights_in_place"] = {{"read_gbs_median", wbw.median_gbs}, {"read_gbs_min", wbw.min_gbs},
                                   {"read_gbs_max", wbw.max_gbs}, {"bytes", wbw.bytes}, {"probes", wbw.reps},
                                   {"passes_per_probe", kProbePasses}};
  if (barrier.median_ns > 0)
    j["pool_dispatch"] = {{"ns_median", barrier.median_ns}, {"ns_min", barrier.min_ns}, {"ns_max", barrier.max_ns},
                          {"probes", barrier.reps}, {"executors", barrier.executors}};
  if (peak.median_gops > 0)
    j["compute_peak"] = {{"gops_median", peak.median_gops}, {"gops_min", peak.min_gops}, {"gops_max", peak.max_gops},
                         {"kernel", std::string(peak_kernel_name(peak.kernel))}, {"probes", peak.reps},
                         {"runs_per_probe", peak_runs}, {"threads", peak.threads}};
  if (!pp.empty()) {
    Stats s = stats(pp);
    const double gflops = flops_per_token * s.median / 1e9;
    j["prefill"] = {{"tokens", n_prompt},       {"tok_s_median", s.median},
                    {"tok_s_min", s.min},       {"tok_s_max", s.max},
                    {"flops_per_token", flops_per_token},
                    {"gflops_median", gflops}};
    if (peak.median_gops > 0) j["prefill"]["fraction_of_peak"] = gflops / peak.median_gops;
    if (!json) {
      std::printf("prefill  %5d tokens%s: %10.2f tok/s median  (min %.2f, max %.2f)\n", n_prompt,
                  n_par > 1 ? (" x " + std::to_string(n_par) + " sequences").c_str() : "", s.median, s.min, s.max);
      std::printf("         %.3f GFLOP per token (2 x %.0f matrix parameters) -> %.2f GFLOP/s achieved\n",
                  flops_per_token / 1e9, wc.matrix_params, gflops);
      if (peak.median_gops > 0)
        std::printf("         arithmetic peak %.1f GOP/s (%s, %d threads, median of %d probes, one after each prefill "
                    "run, %.1f-%.1f) -> prefill at %.1f%% of it\n",
                    peak.median_gops, std::string(peak_kernel_name(peak.kernel)).c_str(), peak.threads, peak.reps,
                    peak.min_gops, peak.max_gops, 100.0 * gflops / peak.median_gops);
    }
  }
  if (!tg.empty()) {
    Stats s = stats(tg);
    j["decode"] = {{"tokens", n_gen},
                   {"tok_s_median", s.median},
                   {"tok_s_min", s.min},
                   {"tok_s_max", s.max},
                   {"weight_bytes_per_token", wc.bytes_per_token},
                   {"kv_bytes_per_token", kv_bytes},
                   {"kv_bytes_per_position", kv_bytes_per_pos},
                   {"recurrent_state_bytes_per_token", state_bytes},
                   {"mean_positions_attended", mean_attended},
                   {"bytes_per_token", decode_bytes}};
    if (roofline > 0) {
      j["decode"]["roofline_tok_s"] = roofline;
      j["decode"]["fraction_of_roofline"] = s.median / roofline;
      j["decode"]["achieved_gbs"] = s.median * decode_bytes / 1e9;
    }
    if (roofline_in_place > 0) {
      j["decode"]["roofline_in_place_tok_s"] = roofline_in_place;
      j["decode"]["fraction_of_roofline_in_place"] = s.median / roofline_in_place;
    }
    if (!per_run.empty())
      j["decode"]["fraction_per_run"] = {{"median", fr.median}, {"min", fr.min}, {"max", fr.max}};
    if (!per_run_in_place.empty())
      j["decode"]["fraction_in_place_per_run"] = {
          {"median", fr_in_place.median}, {"min", fr_in_place.min}, {"max", fr_in_place.max}};
    if (!json) {
      std::printf("decode   %5d tokens%s: %10.2f tok/s median  (min %.2f, max %.2f)\n", n_gen,
                  n_par > 1 ? (" x " + std::to_string(n_par) + " sequences, aggregate").c_str() : "", s.median, s.min,
                  s.max);
      std::printf("         %.2f MB read per token (weights %.2f MB%s + KV %.2f MB at %.1f positions",
                  decode_bytes / 1e6, wc.bytes_per_token / 1e6, mi.n_expert > 1 ? " with active experts only" : "",
                  kv_bytes / 1e6, mean_attended);
      if (state_bytes > 0) std::printf(" + recurrent state %.2f MB read and written", state_bytes / 1e6);
      std::printf(")\n");
      if (roofline > 0)
        std::printf("         read bandwidth %.2f GB/s (median of %d probes, one after each decode run, %.1f-%.1f; "
                    "%s, %d threads) -> roofline %.2f tok/s; achieved %.1f%% (%.2f GB/s)\n",
                    bw.median_gbs, bw.reps, bw.min_gbs, bw.max_gbs, std::string(read_kernel_name(bw.kernel)).c_str(),
                    bw.threads, roofline,
                    100.0 * s.median / roofline, s.median * decode_bytes / 1e9);
      if (roofline_in_place > 0)
        std::printf("         the weights read where they lie (%.2f MB, %d probes): %.2f GB/s (%.1f-%.1f) -> "
                    "roofline %.2f tok/s; achieved %.1f%%\n",
                    double(wbw.bytes) / 1e6, wbw.reps, wbw.median_gbs, wbw.min_gbs, wbw.max_gbs, roofline_in_place,
                    100.0 * s.median / roofline_in_place);
      if (!per_run.empty()) {
        std::printf("         each run against the probes right after it: %.1f%% median (%.1f-%.1f)", 100.0 * fr.median,
                    100.0 * fr.min, 100.0 * fr.max);
        if (!per_run_in_place.empty())
          std::printf("; in place %.1f%% (%.1f-%.1f)", 100.0 * fr_in_place.median, 100.0 * fr_in_place.min,
                      100.0 * fr_in_place.max);
        std::printf("\n");
      }
      if (barrier.median_ns > 0)
        std::printf("         pool dispatch (empty tasks, %d executors, one probe after each decode run): %.0f ns "
                    "median (%.0f-%.0f)\n",
                    barrier.executors, barrier.median_ns, barrier.min_ns, barrier.max_ns);
    }
  }
  if (generated_decode && spec_steps > 0) {
    const double acceptance = spec_drafted > 0 ? double(spec_accepted) / double(spec_drafted) : 0.0;
    const double per_step = double(decode_tokens) / double(spec_steps);
    j["spec"] = {{"drafter", drafter ? drafter->name() : "none"},
                 {"max_tokens", drafter ? spec.spec_max : 0},
                 {"drafted_tokens", spec_drafted},
                 {"accepted_tokens", spec_accepted},
                 {"acceptance_rate", acceptance},
                 {"tokens_per_step", per_step},
                 {"relative_cost", spec_cost}};
    if (!json)
      std::printf("speculative %s: %lld drafted, %lld accepted (%.1f%%); %.2f tokens per decode step; a drafted "
                  "token costs %.2f decode steps\n",
                  drafter ? drafter->name().c_str() : "none (the model's own greedy tokens, one per step)",
                  (long long)spec_drafted, (long long)spec_accepted, 100.0 * acceptance, per_step, spec_cost);
  }
  if (constraint) {
    j["grammar"] = {{"states", grammar_stats.states},
                    {"masks_computed", grammar_stats.mask_misses},
                    {"masks_from_cache", grammar_stats.mask_hits}};
    if (!json)
      std::printf("grammar: %llu states, %llu token masks computed, %llu taken from the cache (timed runs, each "
                  "with an empty cache)\n",
                  (unsigned long long)grammar_stats.states, (unsigned long long)grammar_stats.mask_misses,
                  (unsigned long long)grammar_stats.mask_hits);
  }
  if (const ExpertStream* xs = engine->expert_stream()) {
    const ExpertStreamStats all = xs->stats();
    const double tok = double(std::max<int64_t>(xs_tokens, 1));
    const auto ratio = [](uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; };
    j["experts"] = {{"cache_bytes", all.cache_bytes},
                    {"direct_io", all.direct_io},
                    {"io_uring", all.io_uring},
                    {"decode_tokens", xs_tokens},
                    {"hit_rate", ratio(xs_decode.hits, xs_decode.lookups)},
                    {"prefetch_hit_rate", ratio(xs_decode.prefetch_hits, xs_decode.prefetched)},
                    {"disk_bytes_per_token", double(xs_decode.bytes_read) / tok},
                    {"disk_gbs", xs_decode.read_seconds > 0 ? double(xs_decode.bytes_read) / xs_decode.read_seconds / 1e9 : 0.0},
                    {"stall_seconds_per_token", xs_decode.stall_seconds / tok}};
    if (!json)
      std::printf("experts     streamed through a %.0f MiB cache (%s%s): decode hit rate %.1f%%, prefetch hit rate %.1f%%, "
                  "%.1f MB read per token at %.2f GB/s, %.1f ms stalled per token\n",
                  double(all.cache_bytes) / double(1 << 20), all.direct_io ? "O_DIRECT" : "buffered",
                  all.io_uring ? ", io_uring" : ", pread", 100.0 * ratio(xs_decode.hits, xs_decode.lookups),
                  100.0 * ratio(xs_decode.prefetch_hits, xs_decode.prefetched), double(xs_decode.bytes_read) / tok / 1e6,
                  xs_decode.read_seconds > 0 ? double(xs_decode.bytes_read) / xs_decode.read_seconds / 1e9 : 0.0,
                  1e3 * xs_decode.stall_seconds / tok);
  }
  {
    const double tok = double(std::max<int64_t>(decode_tokens, 1));
    j["transfers"] = {{"upload_bytes_per_token", double(decode_transfers.upload_bytes) / tok},
                      {"download_bytes_per_token", double(decode_transfers.download_bytes) / tok}};
    const Engine::PlanCacheStats pc = engine->plan_cache();
    j["plan_cache"] = {{"hits", pc.hits}, {"misses", pc.misses}};
    const Engine::PaddingStats pad = engine->padding();
    j["step_buckets"] = {{"on", engine->pads_steps()},
                         {"padded_steps", pad.padded_steps},
                         {"padding_tokens", pad.padding_tokens},
                         {"unpadded_steps", pad.unpadded_steps}};
    if (const RankGroup* g = engine->ranks()) {
      // Rank 0's side of the exchanges: what it sent and received per decoded token, and
      // the time it spent in them (waiting for the slowest rank included).
      const double bytes = double(decode_traffic.bytes_sent + decode_traffic.bytes_received) / tok;
      const double secs = decode_traffic.seconds / tok;
      j["distributed"] = {{"ranks", g->size()}, {"split", engine->split() == Split::Layers ? "layers" : "experts"}, {"comm_bytes_per_token", bytes},
                          {"comm_seconds_per_token", secs}};
      if (!json)
        std::printf("ranks       %d, %s split: rank 0 exchanged %.1f KB per decode token, %.3f ms per token in "
                    "the exchanges\n",
                    g->size(), engine->split() == Split::Layers ? "layers" : "experts", bytes / 1e3, secs * 1e3);
    }
    if (!json)
      std::printf("plans       %llu forward steps reused a plan, %llu made one; host<->device %.1f KB up, %.1f KB down "
                  "per decode token\n",
                  (unsigned long long)pc.hits, (unsigned long long)pc.misses, double(decode_transfers.upload_bytes) / tok / 1e3,
                  double(decode_transfers.download_bytes) / tok / 1e3);
  }
  if (json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace tessera::cli
