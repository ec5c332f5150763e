// Token sampler (see sampler.h). The chain follows llama.cpp's default order:
//   logit bias -> repetition penalty -> presence/frequency penalties
//   -> [temperature <= 0: argmax] -> top-k -> top-p -> min-p
//   -> temperature -> softmax -> seeded draw.
// top-p and min-p therefore look at the temperature-1 distribution of the penalized
// logits, as in llama.cpp; temperature only reshapes what survives them.
//
// A grammar's mask of allowed tokens, when given, comes first of all: the other
// tokens get -inf before the biases and penalties.
//
// Conventions:
// - Repetition penalty: every distinct token among the last repeat_last_n accepted
//   ones (ids outside the logits row are ignored) has its logit divided by the
//   penalty when positive and multiplied by it otherwise (llama.cpp).
// - Ties are broken by the lower token id (argmax, top-k order).
// - NaN logits are treated as -inf (never chosen); +inf counts as the largest finite
//   float. A row with no finite-or-+inf logit (all NaN / -inf) is an error.
// - top-p keeps the smallest prefix (in descending probability) whose cumulative
//   probability is >= top_p, at least one token; min-p keeps tokens with
//   p >= min_p * p_max.
// - The draw is done by hand so results are the same on every standard library:
//   u = (rng() >> 11) * 2^-53 in [0, 1), the first token whose cumulative
//   (unnormalized, double) weight exceeds u * total is chosen.
#include "tessera/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "tessera/error.h"

namespace tessera {

// The order of `before` in sample() (descending logit, ascending id on ties) by a
// stable LSD radix sort of the logits' bits: cand_ starts in ascending id order, so
// stability orders the ties. The same permutation std::sort gives, at a fraction of
// its cost on a whole vocabulary (the server samples every sequence of a step on one
// thread, without top-k by default).
void Sampler::sort_by_logit() {
  const size_t n = cand_.size();
  if (n < 2048) {
    std::sort(cand_.begin(), cand_.end(), [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    return;
  }
  // Ascending key = descending logit; -0 and +0 compare equal, so they share a key.
  // Computed once per candidate, then carried through the passes.
  keyed_.resize(2 * n);
  Keyed* from = keyed_.data();
  Keyed* to = from + n;
  for (size_t i = 0; i < n; ++i) {
    float l = cand_[i].logit;
    if (l == 0.0f) l = 0.0f;
    uint32_t b;
    std::memcpy(&b, &l, 4);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ascending with the float
    from[i] = Keyed{~b, cand_[i]};
  }
  constexpr int kBits = 11;
  constexpr uint32_t kBuckets = 1u << kBits;
  for (int shift = 0; shift < 32; shift += kBits) {
    size_t count[kBuckets + 1] = {};
    for (size_t i = 0; i < n; ++i) ++count[((from[i].key >> shift) & (kBuckets - 1)) + 1];
    for (uint32_t b = 0; b < kBuckets; ++b) count[b + 1] += count[b];
    for (size_t i = 0; i < n; ++i) to[count[(from[i].key >> shift) & (kBuckets - 1)]++] = from[i];
    std::swap(from, to);
  }
  for (size_t i = 0; i < n; ++i) cand_[i] = from[i].c;
}

namespace {

void validate(const SamplerParams& p) {
  auto fail = [](const std::string& m) { throw Error("sampler: " + m); };
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
    fail("temperature must be a finite value >= 0 (0 = greedy), got " + std::to_string(p.temperature));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("min_p must be in [0, 1], got " + std::to_string(p.min_p));
  if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty))
    fail("repeat_penalty must be a finite value > 0 (1 = off), got " + std::to_string(p.repeat_penalty));
  if (p.repeat_last_n < 0) fail("repeat_last_n must be >= 0 (0 = off), got " + std::to_string(p.repeat_last_n));
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    fail("presence_penalty must be in [-2, 2], got " + std::to_string(p.presence_penalty));
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    fail("frequency_penalty must be in [-2, 2], got " + std::to_string(p.frequency_penalty));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) fail("logit_bias: negative token id " + std::to_string(id));
    if (!(bias >= -100.0f && bias <= 100.0f))
      fail("logit_bias of token " + std::to_string(id) + " must be in [-100, 100], got " + std::to_string(bias));
  }
}

}  // namespace

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int n_top) {
  if (logits.empty()) throw Error("token_logprobs: empty logits row");
  if (chosen < 0 || size_t(chosen) >= logits.size())
    throw Error("token_logprobs: token " + std::to_string(chosen) + " is outside the logits row");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto clean = [&](float l) {
    if (std::isnan(l)) return kNegInf;
    if (l == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
    return l;
  };
  const size_t n = logits.size();
  float max_l = kNegInf;
  for (size_t i = 0; i < n; ++i) max_l = std::max(max_l, clean(logits[i]));
  // log(sum exp(l - max)), in double; every logit -inf: every log-probability is -inf.
  double log_z = std::numeric_limits<double>::infinity();
  if (max_l != kNegInf) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(clean(logits[i])) - double(max_l));
    log_z = std::log(sum);
  }
  auto logprob = [&](float l) {
    if (l == kNegInf || max_l == kNegInf) return kNegInf;
    return float(double(l) - double(max_l) - log_z);
  };
  TokenLogprobs out;
  out.logprob = logprob(clean(logits[size_t(chosen)]));
  const size_t k = std::min(size_t(std::max(n_top, 0)), n);
  if (k == 0) return out;
  // The k best as a min-heap under "before" (the worst of them on top).
  auto before = [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  };
  std::vector<TokenLogprob>& heap = out.top;
  heap.reserve(k);
  for (size_t i = 0; i < n; ++i) {
    const TokenLogprob c{int32_t(i), clean(logits[i])};  // logits for now: same order
    if (heap.size() < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), before);  // most likely first
  for (TokenLogprob& t : heap) t.logprob = logprob(t.logprob);
  return out;
}

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) { validate(p_); }

void Sampler::accept(int32_t token) {
  if (p_.repeat_last_n <= 0) return;
  recent_.push_back(token);
  while (recent_.size() > size_t(p_.repeat_last_n)) recent_.pop_front();
}

void Sampler::count_generated(int32_t token) {
  if (p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f) return;
  for (auto& [id, times] : generated_)
    if (id == token) {
      ++times;
      return;
    }
  generated_.emplace_back(token, 1);
}

// Fills cand_ with the tokens a draw chooses among, after the logit biases, the
// penalties, top-k, top-p and min-p: ids in descending logit order (ascending id on
// ties), every one possible. Returns the greedy choice instead (cand_ then unordered)
// when the temperature is <= 0, else -1.
int32_t Sampler::candidates(std::span<const float> logits, std::span<const uint64_t> allowed) {
  if (logits.empty()) throw Error("sampler: empty logits row");
  if (logits.size() > size_t(std::numeric_limits<int32_t>::max()))
    throw Error("sampler: logits row of " + std::to_string(logits.size()) + " entries is too long");
  const size_t n = logits.size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  cand_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float l = logits[i];
    if (std::isnan(l)) l = kNegInf;
    else if (l == std::numeric_limits<float>::infinity()) l = std::numeric_limits<float>::max();
    cand_[i] = Candidate{int32_t(i), l};
  }
  if (!allowed.empty()) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const bool ok = i / 64 < allowed.size() && ((allowed[i / 64] >> (i % 64)) & 1u);
      if (!ok) cand_[i].logit = kNegInf;
      any = any || (ok && cand_[i].logit != kNegInf);
    }
    if (!any) throw Error("sampler: the grammar allows no token the model gives a finite logit");
  }

  // Logit biases (ids outside the row ignored), then the penalties; cand_ is still
  // indexed by id.
  for (const auto& [id, bias] : p_.logit_bias)
    if (size_t(id) < n && cand_[size_t(id)].logit != kNegInf) cand_[size_t(id)].logit += bias;

  // Repetition penalty, once per distinct recent token.
  if (p_.repeat_penalty != 1.0f && !recent_.empty()) {
    std::vector<int32_t> ids(recent_.begin(), recent_.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t id : ids) {
      if (id < 0 || size_t(id) >= n) continue;
      float& l = cand_[size_t(id)].logit;
      if (l == kNegInf) continue;
      l = l <= 0.0f ? l * p_.repeat_penalty : l / p_.repeat_penalty;
    }
  }

  for (const auto& [id, times] : generated_) {
    if (id < 0 || size_t(id) >= n) continue;
    float& l = cand_[size_t(id)].logit;
    if (l != kNegInf) l -= p_.presence_penalty + p_.frequency_penalty * float(times);
  }

  // Greedy: argmax, lowest id on ties.
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (cand_[i].logit > cand_[best].logit) best = i;
  if (cand_[best].logit == kNegInf) throw Error("sampler: every logit is NaN or -inf");
  if (p_.temperature <= 0.0f) return cand_[best].id;

  // Descending logit, ascending id on ties; drop impossible (-inf) tokens.
  auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t k = n;
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    k = size_t(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.end(), before);
  } else {
    sort_by_logit();
  }
  while (k > 1 && cand_[k - 1].logit == kNegInf) --k;
  cand_.resize(k);

  const double max_l = cand_[0].logit;

  // top-p on the temperature-1 distribution.
  if (p_.top_p < 1.0f && k > 1) {
    double total = 0.0;
    for (const auto& c : cand_) total += std::exp(double(c.logit) - max_l);
    const double target = double(p_.top_p) * total;
    double cum = 0.0;
    size_t keep = k;
    for (size_t i = 0; i < k; ++i) {
      cum += std::exp(double(cand_[i].logit) - max_l);
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    k = std::max<size_t>(keep, 1);
    cand_.resize(k);
  }

  // min-p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
  if (p_.min_p > 0.0f && k > 1) {
    const double min_l = max_l + std::log(double(p_.min_p));
    size_t keep = 1;
    while (keep < k && double(cand_[keep].logit) >= min_l) ++keep;
    k = keep;
    cand_.resize(k);
  }
  return -1;
}

// A uniform double in [0, 1) from the seeded generator (53 random bits).
double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

// The temperature-scaled softmax weight of candidate i (unnormalised).
double Sampler::weight(size_t i) const {
  return std::exp((double(cand_[i].logit) - double(cand_[0].logit)) * (1.0 / double(p_.temperature)));
}

// A draw among cand_ with their weights, leaving out token `skip` (-1: none);
// `total` is the sum of the weights drawn among.
int32_t Sampler::draw(double total, int32_t skip) {
  const double target = uniform() * total;
  double cum = 0.0;
  const size_t k = cand_.size();
  for (size_t i = 0; i < k; ++i) {
    if (cand_[i].id == skip) continue;
    cum += weight(i);
    if (target < cum) return cand_[i].id;
  }
  // Rounding left target at the very top: the last token with positive weight.
  for (size_t i = k; i-- > 0;)
    if (cand_[i].id != skip && weight(i) > 0.0) return cand_[i].id;
  return cand_[0].id;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const uint64_t> allowed) {
  const int32_t greedy = candidates(logits, allowed);
  if (greedy >= 0) return greedy;
  double total = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) total += weight(i);
  return draw(total, -1);
}

int32_t Sampler::weigh(std::span<const float> logits, int32_t draft, double& total, double& w_draft) {
  const int32_t greedy = candidates(logits);
  total = w_draft = 0.0;
  if (greedy >= 0) return greedy;
  for (size_t i = 0; i < cand_.size(); ++i) {
    const double w = weight(i);
    total += w;
    if (cand_[i].id == draft) w_draft = w;
  }
  return -1;
}

int32_t Sampler::verify(std::span<const float> logits, int32_t draft, bool& accepted) {
  double total, w_draft;
  if (const int32_t greedy = weigh(logits, draft, total, w_draft); greedy >= 0) {
    accepted = greedy == draft;
    return greedy;
  }
  // The draft is a point mass q: accept it with probability min(1, p/q) = p(draft);
  // otherwise draw from the residual max(p - q, 0), which is p without the draft.
  accepted = uniform() * total < w_draft;
  if (accepted) return draft;
  return draw(total - w_draft, draft);
}

double TokenDistribution::prob(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return it != ids.end() && *it == id ? probs[size_t(it - ids.begin())] : 0.0;
}

int32_t Sampler::sample(std::span<const float> logits, TokenDistribution& drawn_from) {
  drawn_from.ids.clear();
  drawn_from.probs.clear();
  const int32_t greedy = candidates(logits);
  if (greedy >= 0) {
    drawn_from.ids.push_back(greedy);
    drawn_from.probs.push_back(1.0);
    return greedy;
  }
  // Each candidate's weight once: the distribution, in id order, and the draw's total.
  std::vector<std::pair<int32_t, double>> byid(cand_.size());
  double total = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) total += (byid[i] = {cand_[i].id, weight(i)}).second;
  std::sort(byid.begin(), byid.end());
  for (const auto& [id, w] : byid) {
    drawn_from.ids.push_back(id);
    drawn_from.probs.push_back(w / total);
  }
  return draw(total, -1);
}

int32_t Sampler::verify(std::span<const float> logits, int32_t draft, const TokenDistribution& q, bool& accepted) {
  const double q_draft = q.prob(draft);
  if (q_draft <= 0.0) return verify(logits, draft, accepted);  // not drawn from q: a point mass
  double total, w_draft;
  if (const int32_t greedy = weigh(logits, draft, total, w_draft); greedy >= 0) {
    // p is the argmax alone: min(1, p / q) is 1 there, 0 elsewhere
    accepted = greedy == draft;
    return greedy;
  }
  accepted = uniform() * q_draft * total < w_draft;  // u < p(draft) / q(draft)
  if (accepted) return draft;
  // The residual max(p - q, 0) over the candidates (p is 0 elsewhere), then a draw from it.
  residual_.resize(cand_.size());
  double sum = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i)
    sum += (residual_[i] = std::max(0.0, weight(i) / total - q.prob(cand_[i].id)));
  if (!(sum > 0.0)) return draw(total - w_draft, draft);  // rounding: p and q agree
  const double target = uniform() * sum;
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < cand_.size(); ++i) {
    if (residual_[i] <= 0.0) continue;
    cum += residual_[i];
    last = cand_[i].id;
    if (target < cum) return last;
  }
  return last;
}

}  // namespace tessera
