// Continuous batching (see generator.h).
//
// A sequence is its known tokens (prompt, then every sampled token) and how many of
// them are in the KV cache (`computed`). Decode and prefill are the same thing: a
// step feeds some of the tokens not yet computed; when a step computes the last known
// token, its logits are sampled and the new token is appended. A preempted sequence
// keeps its tokens and sampler and starts again from computed = 0 (or from what the
// prefix cache still holds).
#include "tessera/generator.h"

#include <algorithm>
#include <chrono>

#include "tessera/drafter.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/grammar.h"
#include "tessera/model.h"
#include "tessera/tokenizer.h"

namespace tessera {

struct Generator::Seq {
  uint64_t id = 0;
  GenerationRequest req;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt + generated
  int generated = 0;
  int64_t computed = 0;  // tokens whose KV is in the cache
  std::optional<KvCache::SeqId> kv;
  std::vector<KvCache::PageKey> keys;  // prefix-cache keys of the full pages computed so far
  int64_t step_tokens = 0;  // tokens fed in the current step
  // Speculative decoding: this step's tokens when it verifies a draft (its next token,
  // then the proposals), the copy of its KV sequence taken before the step when
  // recurrent state must be restorable, and the acceptance measured so far.
  std::vector<int32_t> feed, proposals;
  std::vector<TokenDistribution> proposals_drawn_from;  // a sampling drafter's, per proposal
  std::optional<KvCache::SeqId> checkpoint;
  double acceptance = 0.8;  // optimistic at first: speculation was asked for
  int steps_without_draft = 0;
  std::optional<GrammarMatcher> grammar;  // where the generated text is in the request's grammar
  // add_choices: the other choices of the request, forked off this sequence once its
  // prompt is computed.
  std::vector<std::unique_ptr<Seq>> forks;

  Seq(uint64_t i, GenerationRequest r) : id(i), req(std::move(r)), sampler(req.sampling), tokens(req.prompt) {
    if (req.grammar) grammar.emplace(req.grammar);
  }
  int32_t sample(std::span<const float> row) {
    return grammar ? sampler.sample(row, grammar->allowed()) : sampler.sample(row);
  }
  int64_t remaining() const { return int64_t(tokens.size()) - computed; }
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::ContextFull: return "context_full";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Failed: return "failed";
  }
  return "unknown";
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The key of a full page: its tokens chained with the key of the page before (as
// vLLM's automatic prefix caching keys blocks). 0 is reserved for "no key".
KvCache::PageKey page_key(KvCache::PageKey before, std::span<const int32_t> tokens) {
  uint64_t h = before ^ 0x9e3779b97f4a7c15ull;
  for (int32_t t : tokens) {
    h ^= uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return h ? h : 1;
}

}  // namespace

Generator::Generator(Engine& engine, const GeneratorOptions& o)
    : engine_(engine), kv_(engine.kv()), drafter_(o.drafter), measure_draft_cost_(o.measure_draft_cost) {
  budget_ = o.batch_tokens > 0 ? o.batch_tokens : engine.batch_tokens();
  max_running_ = o.max_running > 0 ? o.max_running : std::max(1, kv_.total_pages() * kv_.config().page_tokens /
                                                                      int(std::max<int64_t>(1, engine.n_ctx())));
  // Recurrent state exists only at a sequence's end, so a shared page prefix would
  // come without the state that goes with it: such models keep whole finished
  // sequences instead (decision 38).
  prefix_cache_ = o.prefix_cache && !kv_.has_recurrent();
  if (o.prefix_cache && kv_.has_recurrent()) keep_finished_ = o.kept_sequences > 0 ? o.kept_sequences : max_running_;
}

Generator::~Generator() {
  for (auto& s : running_) release(*s);
  for (auto& s : waiting_) release(*s);
  release_kept_sequences();
}

void Generator::release_kept_sequences() {
  for (const Kept& k : kept_) kv_.free_sequence(k.kv);
  kept_.clear();
}

// The least recently used kept sequence gives its pages back; false if none is kept.
bool Generator::evict_kept() {
  if (kept_.empty()) return false;
  auto lru = std::min_element(kept_.begin(), kept_.end(),
                              [](const Kept& a, const Kept& b) { return a.last_used < b.last_used; });
  kv_.free_sequence(lru->kv);
  kept_.erase(lru);
  return true;
}

// A finished sequence: with whole-prefix reuse its KV and state are kept (the tokens
// computed so far: the last sampled token was never fed), else released.
void Generator::retire(Seq& s) {
  if (keep_finished_ > 0 && s.kv && s.computed > 0) {
    if (int(kept_.size()) >= keep_finished_) evict_kept();
    kept_.push_back({std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.computed), *s.kv, ++clock_});
    s.kv.reset();
  }
  release(s);
}

// Reserve KV positions [0, n_tokens) of s, releasing kept sequences when the pool is short.
bool Generator::reserve(Seq& s, int64_t n_tokens) {
  while (!kv_.reserve(*s.kv, n_tokens))
    if (!evict_kept()) return false;
  return true;
}

std::unique_ptr<Generator::Seq> Generator::make_seq(GenerationRequest r) {
  if (r.prompt.empty()) throw Error("the prompt is empty");
  if (r.max_tokens < 1) throw Error("max_tokens must be at least 1, got " + std::to_string(r.max_tokens));
  if (r.logprobs < -1) throw Error("logprobs must be -1 (off) or >= 0, got " + std::to_string(r.logprobs));
  if (r.spec_max < 0) throw Error("the speculative draft length must be >= 0, got " + std::to_string(r.spec_max));
  if (r.spec_max > 0 && (!drafter_ || r.grammar)) r.spec_max = 0;  // plain decoding
  const int64_t V = engine_.n_vocab();
  for (int32_t t : r.prompt)
    if (t < 0 || t >= V)
      throw Error("token id " + std::to_string(t) + " is out of range (vocabulary size " + std::to_string(V) + ")");
  const int64_t capacity = std::min<int64_t>(engine_.n_ctx(), int64_t(kv_.total_pages()) * kv_.config().page_tokens);
  if (int64_t(r.prompt.size()) >= capacity)
    throw Error("the prompt has " + std::to_string(r.prompt.size()) + " tokens; the context holds " +
                std::to_string(capacity) + " (one more is needed to generate)");
  auto s = std::make_unique<Seq>(next_id_++, std::move(r));  // its Sampler validates the parameters
  for (int32_t t : s->tokens) s->sampler.accept(t);
  return s;
}

uint64_t Generator::add(GenerationRequest r) {
  auto s = make_seq(std::move(r));
  const uint64_t id = s->id;
  waiting_.push_back(std::move(s));
  return id;
}

std::vector<uint64_t> Generator::add_choices(GenerationRequest r, int n) {
  if (n < 1) throw Error("the number of choices must be at least 1, got " + std::to_string(n));
  std::vector<GenerationRequest> others;
  for (int i = 1; i < n; ++i) {
    others.push_back(r);
    others.back().sampling.seed = r.sampling.seed + uint64_t(i);
  }
  auto first = make_seq(std::move(r));
  std::vector<uint64_t> ids{first->id};
  for (auto& o : others) {
    first->forks.push_back(make_seq(std::move(o)));
    ids.push_back(first->forks.back()->id);
  }
  waiting_.push_back(std::move(first));
  return ids;
}

// The choices waiting on s start from its computed prompt: each forks its KV sequence
// and samples from the same logits row. A fork the pool cannot make (no recurrent
// state slot) waits as a request of its own and prefills by itself.
void Generator::start_forks(Seq& s, std::span<const float> row, std::vector<GenerationEvent>& events) {
  for (auto& f : s.forks) {
    try {
      f->kv = kv_.fork_sequence(*s.kv);
    } catch (const Error&) {
      waiting_.push_front(std::move(f));
      continue;
    }
    f->computed = s.computed;
    f->keys = s.keys;
    if (sample_and_emit(*f, row, events)) {
      retire(*f);
      continue;
    }
    running_.push_back(std::move(f));
  }
  s.forks.clear();
}

Generator::Seq* Generator::find(uint64_t id) const {
  auto in = [&](const auto& list) -> Seq* {
    for (const auto& s : list) {
      if (s->id == id) return s.get();
      for (const auto& f : s->forks)
        if (f->id == id) return f.get();
    }
    return nullptr;
  };
  if (Seq* s = in(running_)) return s;
  return in(waiting_);
}

std::optional<KvCache::SeqId> Generator::sequence_of(uint64_t id) const {
  const Seq* s = find(id);
  return s ? s->kv : std::nullopt;
}

bool Generator::cancel(uint64_t id) {
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end(); ++it) {
      Seq& s = **it;
      for (auto f = s.forks.begin(); f != s.forks.end(); ++f)
        if ((*f)->id == id) {
          s.forks.erase(f);
          return true;
        }
      if (s.id != id) continue;
      // Its waiting choices go on without it: the first of them prefills for the rest.
      std::unique_ptr<Seq> heir;
      if (!s.forks.empty()) {
        heir = std::move(s.forks.front());
        for (size_t k = 1; k < s.forks.size(); ++k) heir->forks.push_back(std::move(s.forks[k]));
      }
      release(s);
      list.erase(it);
      if (heir) waiting_.push_front(std::move(heir));
      return true;
    }
    return false;
  };
  return drop(running_) || drop(waiting_);
}

void Generator::release(Seq& s) {
  if (drafter_ && s.req.spec_max > 0) drafter_->release(s.id);
  if (s.checkpoint) kv_.free_sequence(*s.checkpoint);
  s.checkpoint.reset();
  s.feed.clear();
  if (s.kv) kv_.free_sequence(*s.kv);  // registered full pages stay cached
  s.kv.reset();
  s.computed = 0;
  s.keys.clear();
}

void Generator::preempt(Seq& s) {
  release(s);
  ++stats_.preemptions;
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &s; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

// Reserve KV room for the sequence's first n_tokens positions. With may_preempt, the
// most recently admitted other sequences are preempted until it fits; if it still
// does not fit (or s itself is the most recent), s is preempted and false returned.
bool Generator::grow(Seq& s, int64_t n_tokens, bool may_preempt) {
  while (!reserve(s, n_tokens)) {
    if (!may_preempt) return false;
    Seq& victim = *running_.back();
    preempt(victim);
    if (&victim == &s) return false;
  }
  return true;
}

// A waiting sequence gets a KV sequence, adopts the cached pages of its longest
// matching prefix, and reserves its first chunk (at most the budget left).
void Generator::admit(Seq& s) {
  if (keep_finished_ > 0) {
    // The longest kept sequence whose tokens the prompt extends (by at least one
    // token, whose logits give the next token).
    Kept* best = nullptr;
    for (Kept& k : kept_)
      if (k.tokens.size() < s.tokens.size() && (!best || k.tokens.size() > best->tokens.size()) &&
          std::equal(k.tokens.begin(), k.tokens.end(), s.tokens.begin()))
        best = &k;
    if (best) {
      s.kv = kv_.fork_sequence(best->kv);  // shares its pages, copies its recurrent state
      s.computed = int64_t(best->tokens.size());
      best->last_used = ++clock_;
      stats_.prefix_tokens_reused += s.computed;
      return;
    }
  }
  s.kv = kv_.create_sequence();
  const int64_t pt = kv_.config().page_tokens;
  if (prefix_cache_) {
    // At least one token is computed, whose logits give the next token.
    const int64_t max_pages = (int64_t(s.tokens.size()) - 1) / pt;
    std::vector<int32_t> pages;
    KvCache::PageKey key = 0;
    for (int64_t p = 0; p < max_pages; ++p) {
      std::span<const int32_t> toks(s.tokens.data() + p * pt, size_t(pt));
      key = page_key(key, toks);
      const int32_t page = kv_.find_cached_page(key, toks);
      if (page < 0) break;
      pages.push_back(page);
      s.keys.push_back(key);
    }
    // Sliding-window layers need the window's last pages of the prefix kept too.
    const size_t usable = kv_.adoptable_pages(*s.kv, pages);
    pages.resize(usable);
    s.keys.resize(usable);
    if (!pages.empty()) {
      kv_.adopt_pages(*s.kv, pages);
      s.computed = int64_t(pages.size()) * pt;
      stats_.prefix_tokens_reused += s.computed;
    }
  }
}

void Generator::register_full_pages(Seq& s) {
  if (!prefix_cache_) return;
  const int64_t pt = kv_.config().page_tokens;
  for (int64_t p = int64_t(s.keys.size()); (p + 1) * pt <= s.computed; ++p) {
    std::span<const int32_t> toks(s.tokens.data() + p * pt, size_t(pt));
    const KvCache::PageKey key = page_key(s.keys.empty() ? 0 : s.keys.back(), toks);
    s.keys.push_back(key);
    kv_.register_page(*s.kv, size_t(p), key, toks);  // false: an equal page is cached already
  }
}

bool Generator::is_stop(const Seq& s, int32_t token) const {
  for (int32_t t : s.req.stop_tokens)
    if (t == token) return true;
  if (s.req.ignore_eos) return false;
  // A file without tokenizer metadata has no end-of-generation tokens.
  const Tokenizer* tok = engine_.tokenizer_if_any();
  return tok && tok->is_end_of_generation(token);
}

std::vector<GenerationEvent> Generator::step() {
  std::vector<GenerationEvent> events;
  int64_t budget = budget_;
  std::vector<Seq*> batch;

  // 1. One decode token for every running sequence, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq& s = *running_[i];
    if (s.remaining() != 1) continue;
    if (!grow(s, s.computed + 1, true)) {
      --i;  // s was preempted: running_ shrank at its index
      continue;
    }
    s.step_tokens = 1;
    batch.push_back(&s);
    --budget;
  }
  if (drafter_ && budget > 0) draft(batch, budget);
  // 2. The next chunk of every running sequence still prefilling, then
  // 3. newly admitted sequences, first come first served.
  auto chunk = [&](Seq& s) {
    int64_t n = std::min(s.remaining(), budget);
    while (n > 0 && !grow(s, s.computed + n, false)) n /= 2;  // what the free pages allow
    if (n == 0) return false;
    s.step_tokens = n;
    batch.push_back(&s);
    budget -= n;
    return true;
  };
  for (auto& p : running_)
    if (budget > 0 && p->remaining() > 1) chunk(*p);
  while (budget > 0 && !waiting_.empty() && int(running_.size()) < max_running_) {
    Seq& s = *waiting_.front();
    admit(s);
    if (!chunk(s)) {
      release(s);  // no pages for even one token now: try again next step
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (batch.empty()) {
    if (!waiting_.empty() && running_.empty() && !evict_kept())
      throw Error("the KV cache cannot hold the waiting request's first token (the pool is too small)");
    return events;
  }

  std::vector<Engine::Chunk> chunks;
  chunks.reserve(batch.size());
  for (Seq* s : batch) {
    if (!s->feed.empty()) {
      chunks.push_back({*s->kv, s->feed, Engine::Logits::All});
      continue;
    }
    const bool last = s->computed + s->step_tokens == int64_t(s->tokens.size());
    chunks.push_back({*s->kv, std::span<const int32_t>(s->tokens.data() + s->computed, size_t(s->step_tokens)),
                      last ? Engine::Logits::Last : Engine::Logits::None});
  }
  const int64_t before = engine_.tokens_evaluated();
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = engine_.forward(chunks);
  const int64_t step_tokens = engine_.tokens_evaluated() - before;
  if (drafter_) spec_cost_.record_step(step_tokens, seconds_since(t0));
  stats_.tokens_evaluated += step_tokens;
  stats_.max_step_tokens = std::max(stats_.max_step_tokens, step_tokens);
  ++stats_.steps;

  const size_t V = size_t(engine_.n_vocab());
  size_t row = 0;
  std::vector<Seq*> finished;
  for (size_t i = 0; i < batch.size(); ++i) {
    Seq& s = *batch[i];
    if (!s.feed.empty()) {
      // Verify the draft: the row of each fed token gives the next one, until the
      // sampler rejects a proposal (its replacement is the step's last token) or all
      // are accepted (the last row gives one more).
      const size_t n = s.feed.size() - 1;
      int accepted = 0;
      for (size_t j = 0; j <= n; ++j) {
        const std::span<const float> row_logits = logits.subspan(row++ * V, V);
        bool ok = false;
        int32_t tok;
        if (j == n)
          tok = s.sampler.sample(row_logits);
        else if (j < s.proposals_drawn_from.size())
          tok = s.sampler.verify(row_logits, s.feed[j + 1], s.proposals_drawn_from[j], ok);
        else
          tok = s.sampler.verify(row_logits, s.feed[j + 1], ok);
        if (j < n) s.acceptance = 0.9 * s.acceptance + (ok ? 0.1 : 0.0);
        if (emit(s, tok, row_logits, events) || !ok) {
          row += n - j;  // the rows after it are not read
          break;
        }
        ++accepted;
      }
      settle_draft(s, accepted);
      register_full_pages(s);
      if (events.back().finish != FinishReason::None) finished.push_back(&s);
      continue;
    }
    s.computed += s.step_tokens;
    register_full_pages(s);
    if (chunks[i].logits != Engine::Logits::Last) continue;
    const std::span<const float> row_logits = logits.subspan(row++ * V, V);
    if (!s.forks.empty()) start_forks(s, row_logits, events);
    if (sample_and_emit(s, row_logits, events)) finished.push_back(&s);
  }
  for (Seq* s : finished) {
    retire(*s);
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == s; });
    running_.erase(it);
  }
  return events;
}

bool Generator::sample_and_emit(Seq& s, std::span<const float> row, std::vector<GenerationEvent>& events) {
  if (!s.grammar) return emit(s, s.sample(row), row, events);
  // A grammar that cannot go on (too ambiguous, or nothing it allows is possible)
  // ends its own request, not the step.
  try {
    return emit(s, s.sample(row), row, events);
  } catch (const Error& e) {
    GenerationEvent ev;
    ev.id = s.id;
    ev.finish = FinishReason::Failed;
    ev.error = e.what();
    events.push_back(std::move(ev));
    return true;
  }
}

bool Generator::emit(Seq& s, int32_t tok, std::span<const float> row_logits, std::vector<GenerationEvent>& events) {
  s.sampler.accept(tok);
  s.sampler.count_generated(tok);
  ++s.generated;
  GenerationEvent ev;
  ev.id = s.id;
  ev.token = tok;
  if (is_stop(s, tok)) {
    ev.finish = FinishReason::Stop;
    ev.token = -1;  // a stop token is not part of the text (nor of the log-probabilities)
  } else {
    // Only requests that ask pay for the log-softmax (one pass over the vocabulary).
    if (s.req.logprobs >= 0) ev.logprobs = token_logprobs(row_logits, tok, s.req.logprobs);
    if (s.grammar) s.grammar->accept(tok);
    if (s.grammar && s.grammar->exhausted()) ev.finish = FinishReason::Stop;
    else if (s.generated >= s.req.max_tokens) ev.finish = FinishReason::Length;
    else if (int64_t(s.tokens.size()) + 1 > engine_.n_ctx()) ev.finish = FinishReason::ContextFull;
  }
  s.tokens.push_back(tok);
  events.push_back(std::move(ev));
  return events.back().finish != FinishReason::None;
}

// Proposals for the decoding sequences of the batch that speculate: each asks for the
// draft length its measured acceptance makes worth it, within the step's budget, its
// context, its token limit and the free KV pages.
void Generator::draft(std::vector<Seq*>& batch, int64_t& budget) {
  std::vector<DraftRequest> requests;
  std::vector<Seq*> asking;
  const double cost = measure_draft_cost_ ? spec_cost_.relative_cost(int64_t(batch.size()), drafter_->relative_cost())
                                          : drafter_->relative_cost();
  stats_.spec_relative_cost = cost;
  for (Seq* s : batch) {
    if (s->req.spec_max <= 0) continue;
    int64_t k = choose_draft_length(s->acceptance, cost, s->req.spec_max);
    // When drafting does not pay, one token is still drafted every kProbeEvery steps,
    // so a sequence whose drafts become good again is noticed.
    constexpr int kProbeEvery = 16;
    if (k == 0 && ++s->steps_without_draft >= kProbeEvery) k = 1;
    if (k == 0) continue;
    s->steps_without_draft = 0;
    k = std::min({k, budget, engine_.n_ctx() - int64_t(s->tokens.size()), int64_t(s->req.max_tokens - s->generated - 1)});
    if (k < 1) continue;
    s->proposals.clear();
    s->proposals_drawn_from.clear();
    requests.push_back({s->id, s->tokens, int(k), &s->proposals, &s->req.sampling, &s->proposals_drawn_from});
    asking.push_back(s);
  }
  if (requests.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  drafter_->propose(requests);
  int64_t proposed = 0;
  for (const Seq* s : asking) proposed += int64_t(s->proposals.size());
  spec_cost_.record_draft(proposed, seconds_since(t0));
  for (size_t i = 0; i < asking.size(); ++i) {
    Seq& s = *asking[i];
    int64_t n = std::min<int64_t>({int64_t(s.proposals.size()), requests[i].max_tokens, budget});
    if (n < 1) continue;
    // Recurrent state exists only at the sequence's end: a fork keeps it (and shares
    // the pages) for the case that a proposal is rejected.
    if (kv_.has_recurrent()) s.checkpoint = kv_.fork_sequence(*s.kv);
    while (n > 0 && !reserve(s, s.computed + 1 + n)) n /= 2;
    if (n == 0) {
      if (s.checkpoint) kv_.free_sequence(*s.checkpoint);
      s.checkpoint.reset();
      continue;
    }
    s.feed.assign(1, s.tokens.back());
    s.feed.insert(s.feed.end(), s.proposals.begin(), s.proposals.begin() + n);
    s.step_tokens = 1 + n;
    budget -= n;
  }
}

// After a verified draft: the KV cache keeps the fed tokens up to the last accepted
// proposal. Without recurrent layers the positions past it are dropped; with them,
// unless every proposal was accepted, the sequence goes back to the copy taken before
// the step and the next step recomputes the accepted tokens.
void Generator::settle_draft(Seq& s, int accepted) {
  const int n = int(s.feed.size()) - 1;
  ++stats_.spec_steps;
  stats_.drafted_tokens += n;
  stats_.accepted_tokens += accepted;
  if (s.checkpoint) {
    if (accepted == n) {
      kv_.free_sequence(*s.checkpoint);
      s.computed += 1 + n;
    } else {
      kv_.free_sequence(*s.kv);
      s.kv = *s.checkpoint;
    }
    s.checkpoint.reset();
  } else {
    s.computed += 1 + accepted;
    kv_.truncate(*s.kv, s.computed);
  }
  s.feed.clear();
}

}  // namespace tessera
