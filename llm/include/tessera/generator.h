// Continuous batching over the Engine: requests (a prompt, sampling parameters with
// their own RNG, a token limit, stop tokens) are added at any time, and each step()
// runs one forward pass that fills a token budget with one decode token for every
// running sequence first, then chunks of prompts still being prefilled, then chunks
// of newly admitted prompts (chunked prefill: a long prompt never stalls running
// streams for more than one step). A request is admitted when the KV pool has pages
// for its first chunk; when the pool runs dry mid-generation the most recently
// admitted sequence is preempted (its pages freed, recomputed when it resumes).
// Full KV pages are shared through the pool's prefix cache (kv_cache.h): a prompt
// whose leading pages match cached ones adopts them and computes only the rest. A
// model with recurrent layers shares exact whole prefixes instead: a finished
// sequence is kept (its pages and its recurrent state at its end) and a prompt that
// extends its tokens forks it (decision 38).
// Speculative decoding (drafter.h): a decoding request with spec_max > 0 feeds the
// drafter's proposals after its next token in the same step (they count against the
// budget), keeps what its sampler accepts and rolls the rest back: KV positions are
// truncated; recurrent layers' state is restored from a copy taken before the step and
// the accepted tokens are recomputed in the next one (decision 102).
// Not thread-safe: one thread adds, cancels and steps.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/kv_cache.h"
#include "tessera/sampler.h"
#include "tessera/speculation_cost.h"

namespace tessera {

class Engine;
class Drafter;
class GrammarConstraint;

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids (BOS included if wanted); not empty
  SamplerParams sampling;
  int max_tokens = 16;               // tokens to generate at most (>= 1)
  bool ignore_eos = false;           // do not stop at the vocabulary's end-of-generation tokens
  std::vector<int32_t> stop_tokens;  // further tokens that end the generation (not reported as text)
  // >= 0: every event with a token carries its log-probability and the `logprobs`
  // most likely tokens at that position (token_logprobs in sampler.h: the model's raw
  // distribution). -1: off, and nothing is computed.
  int logprobs = -1;
  // Speculative decoding: at most this many drafted tokens verified per step (0: off;
  // needs GeneratorOptions::drafter). The draft length adapts to the acceptance.
  int spec_max = 0;
  // Structured output: only tokens the grammar allows are sampled (the mask comes
  // before every other sampling step), an end-of-generation token only where the
  // grammar may end, and the generation stops once nothing can follow. Constrained
  // requests do not speculate.
  std::shared_ptr<GrammarConstraint> grammar;
};

enum class FinishReason : uint8_t {
  None,
  Stop,         // an end-of-generation or stop token was sampled, or the grammar is complete
  Length,       // max_tokens generated
  ContextFull,  // the sequence reached the context size
  Cancelled,
  Failed,  // the request could not go on (its grammar): GenerationEvent::error says why
};
const char* finish_reason_name(FinishReason r);

// What one step produced for one request: a sampled token (token >= 0, unless the
// token ended the generation as a stop token), and/or the reason it finished (a token
// that completes a grammar comes with Stop); with
// GenerationRequest::logprobs >= 0, the token's log-probabilities (a stop token, which
// is not reported, has none).
struct GenerationEvent {
  uint64_t id = 0;
  int32_t token = -1;
  FinishReason finish = FinishReason::None;
  std::optional<TokenLogprobs> logprobs;
  std::string error;  // with FinishReason::Failed
};

struct GeneratorOptions {
  int64_t batch_tokens = 0;  // token budget per step; 0 = the engine's batch_tokens
  int max_running = 0;       // sequences decoding at once; 0 = the engine's max_sequences
  bool prefix_cache = true;  // share full KV pages of equal prefixes (recurrent models: whole prefixes)
  int kept_sequences = 0;    // recurrent models: finished sequences kept for reuse; 0 = max_running
  Drafter* drafter = nullptr;  // proposes tokens for requests with spec_max > 0 (not owned)
  // The cost of a drafted token is measured from the steps' and the drafter's times
  // (SpeculationCost), the drafter's own estimate standing in until then; false: its
  // estimate throughout (tests that must see drafts whatever the machine's speed).
  bool measure_draft_cost = true;
};

class Generator {
 public:
  Generator(Engine& engine, const GeneratorOptions& options = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Queue a request; returns its id. Throws tessera::Error for an empty prompt, a
  // token out of range, max_tokens < 1, or a prompt that leaves no room in the context.
  uint64_t add(GenerationRequest request);
  // n answers to one prompt (OpenAI's n): the prompt is prefilled once, and when its
  // last token is computed the other n - 1 choices fork that sequence, sharing its KV
  // pages (and copying recurrent state), each sampling with its own seed (the
  // request's seed + i). Returns the choices' ids, the first being the one prefilled.
  std::vector<uint64_t> add_choices(GenerationRequest request, int n);
  // Drop a waiting or running request (its pages are released). Returns false for an
  // unknown or finished id.
  bool cancel(uint64_t id);
  // One forward pass; returns the tokens sampled and the requests finished.
  std::vector<GenerationEvent> step();
  bool idle() const { return running_.empty() && waiting_.empty(); }
  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }

  struct Stats {
    int64_t steps = 0;
    int64_t tokens_evaluated = 0;  // tokens run through the model
    int64_t prefix_tokens_reused = 0;  // prompt tokens whose KV came from the prefix cache
    int64_t preemptions = 0;
    int64_t max_step_tokens = 0;
    // Speculative decoding: steps of a sequence that verified a draft, the tokens
    // drafted and those accepted.
    int64_t spec_steps = 0, drafted_tokens = 0, accepted_tokens = 0;
    // The cost of a drafted token the last draft lengths were chosen with, relative to
    // one decode step (measured: SpeculationCost).
    double spec_relative_cost = 0;
  };
  const Stats& stats() const { return stats_; }
  bool prefix_cache_enabled() const { return prefix_cache_ || keep_finished_ > 0; }
  // Finished sequences kept for whole-prefix reuse (recurrent models), and their release
  // (their pages return to the pool; it happens by itself when the pool runs short).
  size_t kept_sequences() const { return kept_.size(); }
  void release_kept_sequences();
  // The KV sequence of a running request (for tests), if it has one.
  std::optional<KvCache::SeqId> sequence_of(uint64_t id) const;

 private:
  struct Seq;
  Seq* find(uint64_t id) const;
  std::unique_ptr<Seq> make_seq(GenerationRequest r);
  void start_forks(Seq& s, std::span<const float> row, std::vector<GenerationEvent>& events);
  // Samples s's next token from its row and reports it; true when that ends it.
  bool sample_and_emit(Seq& s, std::span<const float> row, std::vector<GenerationEvent>& events);
  void admit(Seq& s);
  bool reserve(Seq& s, int64_t n_tokens);
  bool evict_kept();
  void retire(Seq& s);
  bool grow(Seq& s, int64_t n_tokens, bool may_preempt);
  void preempt(Seq& s);
  void release(Seq& s);
  void register_full_pages(Seq& s);
  bool is_stop(const Seq& s, int32_t token) const;
  void draft(std::vector<Seq*>& batch, int64_t& budget);
  // Appends a sampled token to s with its event; true when it ends the generation.
  bool emit(Seq& s, int32_t token, std::span<const float> row, std::vector<GenerationEvent>& events);
  void settle_draft(Seq& s, int accepted);

  Engine& engine_;
  KvCache& kv_;
  Drafter* drafter_ = nullptr;
  int64_t budget_ = 0;
  int max_running_ = 0;
  bool prefix_cache_ = false;  // page sharing through the KV pool's registry
  int keep_finished_ = 0;       // whole-prefix reuse: finished sequences kept at most
  struct Kept {
    std::vector<int32_t> tokens;  // the tokens whose KV and state it holds
    KvCache::SeqId kv;
    uint64_t last_used;
  };
  std::vector<Kept> kept_;
  uint64_t clock_ = 0;
  uint64_t next_id_ = 1;
  std::vector<std::unique_ptr<Seq>> running_;  // in admission order
  std::deque<std::unique_ptr<Seq>> waiting_;   // preempted ones at the front
  Stats stats_;
  SpeculationCost spec_cost_;
  bool measure_draft_cost_ = true;
};

}  // namespace tessera
