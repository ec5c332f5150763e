// Drafting with a second, smaller model (drafter.h). Each request has a sequence in
// the draft engine's own paged KV cache holding the tokens it has fed so far; a
// proposal first rolls that sequence back to what it shares with the request's
// tokens (the target rejected the rest), feeds the difference, then drafts: one forward
// step per drafted position, every request of the step in it. A greedy request gets
// the draft model's argmax; a sampling one a draw from the draft model's distribution
// under the request's sampling (penalties aside: they need the sequence's history),
// which accepts more than the argmax where the distribution is wide.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "tessera/drafter.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/kv_cache.h"
#include "tessera/model.h"

namespace tessera {
namespace {

int32_t argmax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[best]) best = i;
  return int32_t(best);
}

// The draft sampler of a request: its sampling without the penalties, with a seed of
// its own (the target's draws stay its own).
SamplerParams draft_sampling(const SamplerParams& p) {
  SamplerParams d = p;
  d.repeat_penalty = 1.0f;
  d.presence_penalty = d.frequency_penalty = 0.0f;
  d.seed = p.seed ^ 0x9e3779b97f4a7c15ull;
  return d;
}

class DraftModelDrafter final : public Drafter {
 public:
  // Positions a draft sequence's sliding-window layers keep beyond their window: a
  // rollback of up to this many drafted tokens keeps the sequence.
  static constexpr int kRollbackPositions = 32;

  DraftModelDrafter(const PluginRegistry& registry, EngineOptions o, const Engine& target) {
    o.n_ctx = target.n_ctx();
    o.page_tokens = target.kv().config().page_tokens;
    o.max_sequences = std::max<int>(
        1, int(int64_t(target.kv().total_pages()) * target.kv().config().page_tokens / std::max<int64_t>(1, target.n_ctx())));
    o.batch_tokens = target.batch_tokens();
    // Its sequences are rolled back by the rejected part of each draft.
    o.kv_window_slack = kRollbackPositions;
    if (!o.pool) o.pool = target.pool();
    engine_ = std::make_unique<Engine>(registry, o);
    if (engine_->n_vocab() != target.n_vocab())
      throw Error("the draft model " + o.model_path + " has a vocabulary of " + std::to_string(engine_->n_vocab()) +
                  " tokens, the target model " + std::to_string(target.n_vocab()) + ": they must be the same");
    if (engine_->kv().has_recurrent())
      throw Error("the draft model " + o.model_path + " (" + engine_->model().info().architecture +
                  ") has recurrent layers, whose state cannot be rolled back to the tokens the target accepts; "
                  "use an attention-only draft model");
    // Decode is bound by reading the weights: the byte ratio prices a drafted token.
    const double tb = double(target.memory_plan().needs.weights);
    cost_ = tb > 0 ? double(engine_->memory_plan().needs.weights) / tb + 0.05 : 0.5;
  }
  ~DraftModelDrafter() override {
    for (auto& [id, s] : seqs_) engine_->kv().free_sequence(s.kv);
  }

  std::string name() const override { return "draft"; }
  double relative_cost() const override { return cost_; }

  void release(uint64_t id) override {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return;
    engine_->kv().free_sequence(it->second.kv);
    seqs_.erase(it);
  }

  void propose(std::span<const DraftRequest> requests) override {
    KvCache& kv = engine_->kv();
    struct Active {
      const DraftRequest* r;
      State* s;
      int32_t last;  // the token fed in the next drafting step
    };
    std::vector<Active> active;
    // Catch up: each sequence gets the request's tokens it does not hold yet (at least
    // the last one, whose logits give the first proposal), in steps within the budget.
    std::vector<const DraftRequest*> pending;
    for (const DraftRequest& r : requests) {
      if (r.max_tokens < 1 || r.tokens.empty()) continue;
      auto [it, fresh] = seqs_.try_emplace(r.id);
      State& s = it->second;
      if (fresh) s.kv = kv.create_sequence();
      size_t common = 0;
      while (common < s.fed.size() && common < r.tokens.size() && s.fed[common] == r.tokens[common]) ++common;
      common = std::min(common, r.tokens.size() - 1);
      if (common < s.fed.size()) {
        if (kv.can_truncate(s.kv, int64_t(common))) {
          kv.truncate(s.kv, int64_t(common));
          s.fed.resize(common);
        } else {  // its sliding-window layers no longer hold what lies before `common`: start over
          kv.free_sequence(s.kv);
          s.kv = kv.create_sequence();
          s.fed.clear();
        }
      }
      pending.push_back(&r);
    }
    std::vector<Engine::Chunk> chunks;
    std::vector<const DraftRequest*> in_step;
    while (!pending.empty()) {
      chunks.clear();
      in_step.clear();
      int64_t budget = engine_->batch_tokens();
      for (auto it = pending.begin(); it != pending.end() && budget > 0;) {
        const DraftRequest& r = **it;
        State& s = seqs_.at(r.id);
        const int64_t from = int64_t(s.fed.size()), n = std::min<int64_t>(int64_t(r.tokens.size()) - from, budget);
        if (!kv.reserve(s.kv, from + n)) {  // the draft pool is full: no proposal for it
          release(r.id);
          it = pending.erase(it);
          continue;
        }
        const bool last = from + n == int64_t(r.tokens.size());
        chunks.push_back({s.kv, r.tokens.subspan(size_t(from), size_t(n)), last ? Engine::Logits::Last : Engine::Logits::None});
        s.fed.insert(s.fed.end(), r.tokens.begin() + from, r.tokens.begin() + from + n);
        in_step.push_back(&r);
        budget -= n;
        ++it;
      }
      if (chunks.empty()) break;
      const std::span<const float> logits = engine_->forward(chunks);
      size_t row = 0;
      const size_t V = size_t(engine_->n_vocab());
      for (size_t i = 0; i < in_step.size(); ++i) {
        if (chunks[i].logits != Engine::Logits::Last) continue;
        const DraftRequest& r = *in_step[i];
        State& st = seqs_.at(r.id);
        const int32_t tok = propose_one(r, st, logits.subspan(row++ * V, V));
        r.out->push_back(tok);
        active.push_back({&r, &st, tok});
        pending.erase(std::find(pending.begin(), pending.end(), &r));
      }
    }
    // Draft: every request still wanting tokens feeds its last proposal.
    std::vector<int32_t> feed;
    for (;;) {
      std::erase_if(active, [&](const Active& a) {
        return int(a.r->out->size()) >= a.r->max_tokens || int64_t(a.s->fed.size()) + 1 >= engine_->n_ctx();
      });
      if (active.empty()) break;
      chunks.clear();
      feed.resize(active.size());
      for (size_t i = 0; i < active.size(); ++i) {
        Active& a = active[i];
        if (!kv.reserve(a.s->kv, int64_t(a.s->fed.size()) + 1)) {
          a.s = nullptr;  // no room for another drafted position
          continue;
        }
        feed[i] = a.last;
        a.s->fed.push_back(a.last);
        chunks.push_back({a.s->kv, std::span<const int32_t>(&feed[i], 1), Engine::Logits::Last});
      }
      std::erase_if(active, [](const Active& a) { return a.s == nullptr; });
      if (chunks.empty()) break;
      const std::span<const float> logits = engine_->forward(chunks);
      const size_t V = size_t(engine_->n_vocab());
      for (size_t i = 0; i < active.size(); ++i) {
        active[i].last = propose_one(*active[i].r, *active[i].s, logits.subspan(i * V, V));
        active[i].r->out->push_back(active[i].last);
      }
    }
  }

 private:
  struct State {
    KvCache::SeqId kv = 0;
    std::vector<int32_t> fed;          // the tokens whose KV the draft sequence holds
    std::optional<Sampler> sampler;    // a sampling request's draws
  };
  // The next proposal of request r from a row of the draft model's logits.
  static int32_t propose_one(const DraftRequest& r, State& s, std::span<const float> row) {
    const bool sampled = r.sampling && r.sampling->temperature > 0 && r.drawn_from;
    if (!sampled) return argmax(row);
    if (!s.sampler) s.sampler.emplace(draft_sampling(*r.sampling));
    TokenDistribution& q = r.drawn_from->emplace_back();
    return s.sampler->sample(row, q);
  }
  std::unique_ptr<Engine> engine_;
  std::unordered_map<uint64_t, State> seqs_;
  double cost_ = 0.5;
};

}  // namespace

std::unique_ptr<Drafter> make_draft_model_drafter(const PluginRegistry& registry, EngineOptions options,
                                                  const Engine& target) {
  return std::make_unique<DraftModelDrafter>(registry, std::move(options), target);
}

}  // namespace tessera
