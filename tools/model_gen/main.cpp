// tessera-gen: writes a valid GGUF llama-family model with deterministic random
// weights in any supported weight format. Same flags and seed -> same bytes, whatever
// the thread count. Used for the bundled default model and for benchmarks at real
// shapes (e.g. --preset tinyllama-1.1b --type q4_0).
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "builtin_vocab.h"
#include "gguf_reader.h"
#include "gguf_writer.h"
#include "model_spec.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/quant.h"

namespace po = boost::program_options;
using namespace tessera;

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Row r of a tensor: uniform values with the tensor's standard deviation, from a
// generator seeded by (seed, tensor name, row) so rows can be made in any order.
void fill_row(const gen::TensorSpec& t, uint64_t seed, int64_t row, float* out) {
  const int64_t n = t.ne[0];
  uint64_t s = hash_name(t.name, seed) ^ (uint64_t(row) * 0xD1B54A32D192ED03ull);
  double stdev = t.init == gen::TensorSpec::Init::Matrix ? 1.0 / std::sqrt(double(n))
               : t.init == gen::TensorSpec::Init::Embedding ? 1.0 : 0.1;
  double a = std::sqrt(3.0) * stdev;
  for (int64_t i = 0; i < n; ++i) {
    double u = double(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
    double v = (2.0 * u - 1.0) * a;
    out[i] = float(t.init == gen::TensorSpec::Init::Norm ? 1.0 + v : v);
  }
}

void copy_tokenizer(const std::string& vocab_path, gguf::GgufWriter& w, int64_t& n_vocab) {
  auto f = gguf::GgufFile::open(vocab_path);
  const MetaValue* tokens = f->metadata().find("tokenizer.ggml.tokens");
  if (!tokens || !tokens->as_array()) throw Error(vocab_path + ": has no tokenizer.ggml.tokens array");
  for (const auto& key : f->key_order())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, *f->metadata().find(key));
  int64_t size = int64_t(tokens->as_array()->size());
  if (n_vocab != 0 && n_vocab != size)
    throw Error("--vocab-size " + std::to_string(n_vocab) + " differs from the vocabulary file's " + std::to_string(size));
  n_vocab = size;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string preset = "default", type = "q8_0", out, vocab_path;
  uint64_t seed = 42;
  int threads = 0;
  bool quiet = false;
  gen::LlamaShape s;
  po::options_description desc("options");
  desc.add_options()
    ("help,h", "show this help")
    ("out,o", po::value(&out)->required(), "output .gguf file")
    ("preset", po::value(&preset)->default_value(preset), "shape: default, tiny, tinyllama-1.1b, llama2-7b")
    ("type", po::value(&type)->default_value(type), "weights: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q4_k_m")
    ("vocab", po::value(&vocab_path), "copy the tokenizer from this GGUF (default: built-in byte-level vocabulary)")
    ("seed", po::value(&seed)->default_value(seed), "random seed of the weights")
    ("layers", po::value<int64_t>(), "override: number of layers")
    ("embd", po::value<int64_t>(), "override: embedding size")
    ("heads", po::value<int64_t>(), "override: attention heads")
    ("kv-heads", po::value<int64_t>(), "override: key/value heads")
    ("ff", po::value<int64_t>(), "override: feed-forward size")
    ("vocab-size", po::value<int64_t>(), "override: vocabulary size (built-in vocabulary is padded)")
    ("ctx", po::value<int64_t>(), "override: context length")
    ("tied", po::bool_switch(&s.tied_output), "no output.weight: reuse the token embedding")
    ("threads,t", po::value(&threads)->default_value(0), "threads (0 = all cores)")
    ("quiet,q", po::bool_switch(&quiet), "no progress output");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << "usage: tessera-gen --out FILE [--preset NAME] [--type TYPE] [--vocab VOCAB.gguf] [overrides]\n\n"
                << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }

  bool tied = s.tied_output;
  s = gen::preset(preset);
  s.tied_output = tied;
  if (vm.count("layers")) s.n_layer = vm["layers"].as<int64_t>();
  if (vm.count("embd")) s.n_embd = vm["embd"].as<int64_t>();
  if (vm.count("heads")) s.n_head = vm["heads"].as<int64_t>();
  if (vm.count("kv-heads")) s.n_head_kv = vm["kv-heads"].as<int64_t>();
  if (vm.count("ff")) s.n_ff = vm["ff"].as<int64_t>();
  if (vm.count("vocab-size")) s.n_vocab = vm["vocab-size"].as<int64_t>();
  if (vm.count("ctx")) s.context_length = vm["ctx"].as<int64_t>();
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.context_length <= 0)
    throw Error("every size must be positive");
  if (s.n_embd % s.n_head || s.n_head % s.n_head_kv || (s.n_embd / s.n_head) % 2)
    throw Error("embd must be a multiple of heads, heads a multiple of kv-heads, and the head size even");

  gguf::GgufWriter w(3);
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", s.name);
  if (!vocab_path.empty()) {
    copy_tokenizer(vocab_path, w, s.n_vocab);
  } else {
    gen::Vocab v = gen::builtin_vocab(s.n_vocab);
    s.n_vocab = int64_t(v.tokens.size());
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", v.tokens);
    w.set_f32_array("tokenizer.ggml.scores", v.scores);
    w.set_i32_array("tokenizer.ggml.token_type", v.types);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_u32("tokenizer.ggml.unknown_token_id", 0);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
  }
  w.set_u32("llama.context_length", uint32_t(s.context_length));
  w.set_u32("llama.embedding_length", uint32_t(s.n_embd));
  w.set_u32("llama.block_count", uint32_t(s.n_layer));
  w.set_u32("llama.feed_forward_length", uint32_t(s.n_ff));
  w.set_u32("llama.attention.head_count", uint32_t(s.n_head));
  w.set_u32("llama.attention.head_count_kv", uint32_t(s.n_head_kv));
  w.set_f32("llama.attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set_f32("llama.rope.freq_base", s.rope_base);
  w.set_u32("llama.rope.dimension_count", uint32_t(s.n_embd / s.n_head));
  w.set_u32("llama.vocab_size", uint32_t(s.n_vocab));
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", gen::ggml_file_type(type));

  std::vector<gen::TensorSpec> specs = gen::llama_tensors(s, type);
  for (const auto& t : specs) w.declare_tensor(t.name, t.type, t.ne);

  FastPool pool(threads);
  uint64_t total = 0, done = 0;
  for (const auto& t : specs) total += row_bytes(t.type, t.ne[0]) * uint64_t(t.nelements_rows());
  auto t0 = std::chrono::steady_clock::now();
  w.write_file_streaming(out, [&](size_t index, uint8_t* dst, size_t nbytes) {
    const gen::TensorSpec& t = specs[index];
    const int64_t rows = t.nelements_rows();
    const size_t rb = row_bytes(t.type, t.ne[0]);
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(t.ne[0]));
      for (int64_t r = r0; r < r1; ++r) {
        fill_row(t, seed, r, row.data());
        quant::quantize_row(t.type, row.data(), dst + size_t(r) * rb, t.ne[0]);
      }
    });
    done += nbytes;
    if (!quiet) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\r[%5.1f%%] %-28s %6.1f s", 100.0 * double(done) / double(total), t.name.c_str(), el);
    }
  });
  if (!quiet)
    std::fprintf(stderr, "\nwrote %s: llama, %lld layers, n_embd %lld, vocab %lld, %s, %.1f MiB\n", out.c_str(),
                 (long long)s.n_layer, (long long)s.n_embd, (long long)s.n_vocab, type.c_str(),
                 double(total) / (1 << 20));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tessera-gen: error: %s\n", e.what());
  return 1;
}
