// tessera embed: the embedding of each text (pooled final hidden states, embedder.h),
// one line of space-separated floats per text, or a JSON array of arrays.
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "tessera/embedder.h"
#include "tessera/error.h"
#include "tessera/model_file.h"

namespace tessera::cli {

int cmd_embed(int argc, char** argv) {
  CommonOptions o;
  std::vector<std::string> texts;
  std::string pooling_name;
  int64_t dimensions = 0;
  bool no_normalize = false, json = false;
  po::options_description desc("options");
  desc.add_options()
    ("text", po::value(&texts)->required(), "texts to embed (the positional arguments; all run as one batch)")
    ("pooling", po::value(&pooling_name), "mean or last (token); default: the model's pooling_type metadata, else last")
    ("dimensions", po::value(&dimensions)->default_value(0), "keep the first N values (then normalised); 0 = all")
    ("no-normalize", po::bool_switch(&no_normalize), "print the pooled hidden state as it is (not L2-normalised)")
    ("json", po::bool_switch(&json), "print a JSON array of arrays instead of one line per text");
  o.parallel = 1;
  add_common_options(desc, o, true);
  po::positional_options_description pos;
  pos.add("text", -1);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: tessera embed -m MODEL [--pooling mean|last] [--dimensions N] [--json] TEXT...", desc,
             &pos, vm))
    return 0;
  if (dimensions < 0) throw Error("--dimensions must be >= 0 (0 = all)");
  std::optional<Pooling> pooling;
  if (!pooling_name.empty() && !(pooling = parse_pooling(pooling_name)))
    throw Error("--pooling must be mean or last, not '" + printable(pooling_name, 40) + "'");

  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  if (!pooling) pooling = model_pooling(engine->file());
  if (dimensions > engine->n_embd())
    throw Error("--dimensions " + std::to_string(dimensions) + " is more than the model's " +
                std::to_string(engine->n_embd()) + " values");
  const bool add_eos = tokenizer_adds_eos(engine->file());
  std::vector<std::vector<int32_t>> inputs;
  for (const auto& t : texts) {
    if (t.empty()) throw Error("an empty text has no embedding");
    inputs.push_back(embedding_tokens(engine->tokenizer(), t, add_eos));
  }
  int64_t tokens = 0;
  for (const auto& in : inputs) tokens += int64_t(in.size());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> out = embed(*engine, std::move(inputs), *pooling);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& v : out) shape_embedding(v, dimensions, !no_normalize);

  if (json) {
    std::cout << nlohmann::json(out).dump() << "\n";
  } else {
    for (const auto& v : out) {
      for (size_t i = 0; i < v.size(); ++i) std::printf(i ? " %.9g" : "%.9g", double(v[i]));
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::fprintf(stderr, "embedded %zu texts (%lld tokens, %s pooling) in %.3f s: %.1f texts/s, %.1f tokens/s\n",
               out.size(), (long long)tokens, tessera::pooling_name(*pooling), seconds, double(out.size()) / seconds,
               double(tokens) / seconds);
  return 0;
}

}  // namespace tessera::cli
