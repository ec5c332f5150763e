// Prompt-lookup drafting (drafter.h): the continuation of the most recent earlier
// occurrence of the sequence's last n tokens.
#include <algorithm>

#include "tessera/drafter.h"
#include "tessera/error.h"

namespace tessera {
namespace {

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const NgramDrafterOptions& o) : o_(o) {
    if (o.min_n < 1 || o.max_n < o.min_n)
      throw Error("ngram drafter: need 1 <= min_n <= max_n, got " + std::to_string(o.min_n) + " and " +
                  std::to_string(o.max_n));
  }
  std::string name() const override { return "ngram"; }
  // Only the verification of a drafted token costs: the weights are read once per
  // step whatever its token count, so a drafted token costs its activations.
  double relative_cost() const override { return 0.05; }

  void propose(std::span<const DraftRequest> requests) override {
    for (const DraftRequest& r : requests) propose_one(r);
  }

 private:
  void propose_one(const DraftRequest& r) const {
    const std::span<const int32_t> t = r.tokens;
    const int64_t len = int64_t(t.size());
    for (int n = std::min<int64_t>(o_.max_n, len - 1); n >= o_.min_n; --n) {
      const std::span<const int32_t> key = t.subspan(size_t(len - n));
      // The latest match that ends before the last token, so at least one token follows it.
      for (int64_t end = len - 1; end >= n; --end) {
        if (!std::equal(key.begin(), key.end(), t.begin() + (end - n))) continue;
        // What followed the match, continued periodically past the end: a loop of
        // period len - end goes on repeating.
        const size_t first = r.out->size();
        for (int64_t i = 0; i < r.max_tokens; ++i) {
          const int64_t at = end + i;
          r.out->push_back(at < len ? t[size_t(at)] : (*r.out)[first + size_t(at - len)]);
        }
        return;
      }
    }
  }

  NgramDrafterOptions o_;
};

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(const NgramDrafterOptions& options) {
  return std::make_unique<NgramDrafter>(options);
}

}  // namespace tessera
