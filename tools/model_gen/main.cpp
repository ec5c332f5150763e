// tessera-gen: writes a valid GGUF model (llama, qwen3moe, qwen35moe, gemma3, glm4moe,
// deepseek2 or gpt-oss) with deterministic random weights in any supported weight format,
// or (--format hf) the same model as a Hugging Face checkpoint folder (config.json +
// safetensors). Same flags and seed -> same bytes, whatever the thread count. Used for the
// bundled default model and for benchmarks at real shapes (e.g. --preset qwen3-30b-a3b
// --type q4_k_m). The tensor data is produced one tensor at a time straight into the
// file, so models far larger than memory can be written.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "builtin_vocab.h"
#include "gen_quant.h"
#include "gguf_reader.h"
#include "gguf_writer.h"
#include "hf_export.h"
#include "model_spec.h"
#include "safetensors_writer.h"
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
// Matrices get std 1/sqrt(fan-in) so every projection keeps the size of its input and
// a deep model's activations (and logits) stay of order one.
void fill_row(const gen::TensorSpec& t, uint64_t seed, int64_t row, float* out) {
  using I = gen::TensorSpec::Init;
  const int64_t n = t.ne[0];
  uint64_t s = hash_name(t.name, seed) ^ (uint64_t(row) * 0xD1B54A32D192ED03ull);
  double stdev = t.init == I::Matrix ? 1.0 / std::sqrt(double(n))
               : t.init == I::Embedding ? 1.0
               : t.init == I::Bias ? 0.5
               : t.init == I::NegExp ? 1.0 / std::sqrt(3.0)  // uniform(-1, 1)
               : t.init == I::SmallBias ? 0.05
                                        : 0.1;
  double a = std::sqrt(3.0) * stdev;
  for (int64_t i = 0; i < n; ++i) {
    double u = double(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
    double v = (2.0 * u - 1.0) * a;
    out[i] = float(t.init == I::Norm ? 1.0 + v : t.init == I::NegExp ? -std::exp(v) : v);
  }
}

// --fast: the rows of quantized tensors are copies of rows drawn from a pool of
// kPoolRows rows, quantized once per (dtype, row length, init) from the same random
// values an exact run uses. Exact K-quant rows cost about 100 ns per weight (the
// quantizer's scale search), which is hours for a 30B model on two cores; a pooled
// row costs a copy. The bytes stay valid blocks of the real quantizer, the tensors'
// types and sizes are unchanged, and rows (hence experts) still differ from each other.
constexpr int64_t kPoolRows = 4096;

class RowPool {
 public:
  RowPool(uint64_t seed, FastPool& pool) : seed_(seed), pool_(pool) {}

  // Row `row` of tensor `t`, into dst (row_bytes(t.type, t.ne[0]) bytes).
  void copy_row(const gen::TensorSpec& t, int64_t row, uint8_t* dst) {
    const std::vector<uint8_t>& rows = get(t);
    const size_t rb = row_bytes(t.type, t.ne[0]);
    uint64_t h = hash_name(t.name, seed_) ^ (uint64_t(row) * 0xD1B54A32D192ED03ull);
    const uint64_t pick = splitmix64(h) % uint64_t(kPoolRows);
    std::memcpy(dst, rows.data() + pick * rb, rb);
  }

 private:
  const std::vector<uint8_t>& get(const gen::TensorSpec& t) {
    const std::string key = std::string(dtype_name(t.type)) + ":" + std::to_string(t.ne[0]) + ":" +
                            std::to_string(int(t.init));
    auto it = rows_.find(key);
    if (it != rows_.end()) return it->second;
    // The pool's rows are the rows of a pseudo-tensor named after the key.
    gen::TensorSpec p{"pool:" + key, {t.ne[0], kPoolRows}, t.type, t.init};
    const size_t rb = row_bytes(t.type, t.ne[0]);
    std::vector<uint8_t> bytes(rb * size_t(kPoolRows));
    pool_.parallel_for(kPoolRows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(t.ne[0]));
      for (int64_t r = r0; r < r1; ++r) {
        fill_row(p, seed_, r, row.data());
        gen::quantize_row(t.type, row.data(), bytes.data() + size_t(r) * rb, t.ne[0]);
      }
    });
    return rows_.emplace(key, std::move(bytes)).first->second;
  }

  uint64_t seed_;
  FastPool& pool_;
  std::map<std::string, std::vector<uint8_t>> rows_;
};

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

std::string human_bytes(double b) {
  char buf[32];
  if (b >= double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", n * 1e-9);
  else std::snprintf(buf, sizeof buf, "%.2f M", n * 1e-6);
  return buf;
}

std::string preset_table() {
  std::ostringstream o;
  for (const auto& p : gen::presets()) {
    char line[64];
    std::snprintf(line, sizeof line, "  %-17s %-10s ", p.name.c_str(), gen::arch_name(p.arch));
    o << line << p.source << "\n";
  }
  return o.str();
}

// stdout is checked like any output (e.g. `--help > /dev/full` fails).
int check_stdout() {
  std::cout.flush();
  if (!std::cout) throw Error("cannot write to standard output");
  return 0;
}

// The temporaries being written (files, then the folder holding them for --format hf),
// removed by a fatal signal (Ctrl-C, kill) so an interrupted run leaves nothing behind.
// Only unlink(), rmdir() and raise() run in the handler, over paths made beforehand.
const char* const* volatile g_partial_files = nullptr;
volatile size_t g_partial_count = 0;
const char* volatile g_partial_dir = nullptr;

extern "C" void remove_partial_and_die(int sig) {
  for (size_t i = 0; i < g_partial_count; ++i) unlink(g_partial_files[i]);
  if (g_partial_dir) rmdir(g_partial_dir);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

class PartialOutput {
 public:
  // `files`: every file the run may create; `dir`: the temporary folder holding them
  // (empty for a single file).
  PartialOutput(std::vector<std::string> files, std::string dir = {}) : files_(std::move(files)), dir_(std::move(dir)) {
    for (const auto& f : files_) ptrs_.push_back(f.c_str());
    g_partial_files = ptrs_.data();
    g_partial_dir = dir_.empty() ? nullptr : dir_.c_str();
    g_partial_count = ptrs_.size();
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) std::signal(sig, remove_partial_and_die);
    // Over a file-size limit (ulimit -f) a write then fails with EFBIG and is reported,
    // instead of SIGXFSZ killing the process with the temporary left behind.
    std::signal(SIGXFSZ, SIG_IGN);
  }
  // Renames `from` (the temporary file or folder) to its final name: nothing to remove
  // any more.
  void commit(const std::string& from, const std::string& to) {
    std::error_code ec;
    std::filesystem::rename(from, to, ec);
    if (ec) throw Error("cannot rename " + from + " to " + to + ": " + ec.message());
    committed_ = true;
  }
  ~PartialOutput() {
    g_partial_count = 0;
    g_partial_dir = nullptr;
    if (!committed_) {
      std::error_code ec;
      for (const auto& f : files_) std::filesystem::remove(f, ec);
      if (!dir_.empty()) std::filesystem::remove(dir_, ec);
    }
  }

 private:
  std::vector<std::string> files_;
  std::vector<const char*> ptrs_;
  std::string dir_;
  bool committed_ = false;
};

// Progress: on a terminal a \r line at most 10 times a second, updated inside large
// tensors too; in a log a line every 10 s and one at the end.
class Progress {
 public:
  Progress(bool quiet, uint64_t total) : quiet_(quiet), total_(total), tty_(isatty(2)) {}
  void operator()(const std::string& name, uint64_t bytes, bool last) {
    if (quiet_) return;
    const double el = elapsed();
    if (el - last_line_ < (tty_ ? 0.1 : 10.0) && !last) return;
    last_line_ = el;
    const double frac = total_ ? double(bytes) / double(total_) : 1.0;
    const double eta = frac > 0 ? el / frac - el : 0;
    if (tty_) {
      std::fprintf(stderr, "\r[%5.1f%%] %-32s %7.1f s, about %.0f s left   ", 100.0 * frac, name.c_str(), el, eta);
      line_open_ = true;
    } else {
      std::fprintf(stderr, "[%5.1f%%] %s, %.1f s, about %.0f s left\n", 100.0 * frac, name.c_str(), el, eta);
    }
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  bool line_open() const { return line_open_; }  // a \r progress line without its newline yet

 private:
  bool quiet_;
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double last_line_ = -1.0;
  bool line_open_ = false;
};

// Makes rows 0 .. rows of a tensor on the pool, make(r0, r1) per chunk of rows. Large
// tensors go in slices so progress moves inside them (every row depends only on seed,
// name and row: the bytes do not depend on the slicing); on_slice(rows done) after
// each slice but the last.
template <class Make, class OnSlice>
void make_rows(FastPool& pool, int64_t rows, const Make& make, const OnSlice& on_slice) {
  const int64_t slice = std::max<int64_t>(rows / 64, 1024);
  for (int64_t s0 = 0; s0 < rows; s0 += slice) {
    const int64_t s1 = std::min(rows, s0 + slice);
    pool.parallel_for(s1 - s0, [&](int64_t r0, int64_t r1) { make(s0 + r0, s0 + r1); });
    if (s1 < rows) on_slice(s1);
  }
}

// `out` without trailing slashes ("dir/" names the folder "dir").
std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// --format hf: `dir` may be replaced when it does not exist, is empty, or holds only
// the files of a checkpoint tessera-gen writes (as an existing .gguf is replaced);
// anything else in it is refused, never deleted.
void check_replaceable_folder(const std::string& dir, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::symlink_status(dir, ec);
  if (ec || !fs::exists(st)) return;
  if (!fs::is_directory(st))
    throw Error(dir + " exists and is not a folder: --format hf writes a folder (" + what + ")");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.is_symlink() || !gen::hf::is_checkpoint_file_name(name))
      throw Error(dir + " is not empty (it holds '" + name + "'): --format hf only replaces a folder holding " +
                  "nothing but a checkpoint's config.json and *.safetensors files (" + what + ")");
  }
}

// Removes the checkpoint files of a folder check_replaceable_folder accepted.
void clear_checkpoint_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (gen::hf::is_checkpoint_file_name(e.path().filename().string())) files.push_back(e.path());
  for (const auto& f : files)
    if (!fs::remove(f, ec) && ec) throw Error("cannot remove " + f.string() + ": " + ec.message());
}

void write_text_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) throw Error(path + ": write failed: " + std::strerror(err));
}

std::string types_help() {
  std::string names;
  for (const auto& n : gen::file_type_names()) names += " " + n;
  return "types (--type):" + names + "\n"
         "  f32 f16 bf16      every matrix in that type; vectors and norms F32 in every file\n"
         "  q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k_m q4_k_m q5_k_m iq4_xs\n"
         "                    mixed per tensor as llama.cpp's quantizer mixes that file type: output\n"
         "                    Q6_K (Q8_0 in q8_0); e.g. q3_k_m: attn_v Q5_K in layers 0-1 then Q4_K,\n"
         "                    ffn_down Q4_K (Q5_K in the first 1/16), attn_output Q4_K; q5_k_m:\n"
         "                    attn_v and ffn_down Q6_K in the first and last eighth of the layers and\n"
         "                    every third between; iq4_xs / iq4_nl: attn_v Q5_K when heads / kv-heads\n"
         "                    >= 4, ffn_down Q5_K in the first eighth; q2_k: attn_output and ffn_down\n"
         "                    Q3_K, attn_v Q3_K (Q4_K when heads / kv-heads >= 4); 8-expert models\n"
         "                    get llama.cpp's Mixtral rules (attn_v and attn_k Q8_0)\n"
         "  q3_k q4_k q5_k q6_k mxfp4\n"
         "                    one type for every matrix but the output (Q6_K; Q8_0 for mxfp4)\n"
         "  mxfp4_moe         llama.cpp's MXFP4_MOE: expert tensors MXFP4, every other matrix Q8_0\n"
         "A row whose length the chosen type's block does not divide (256 for the K and IQ4_XS\n"
         "types, 32 for the others) falls back as llama.cpp does: iq4_xs -> iq4_nl, q2_k and\n"
         "q3_k -> q4_0, q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0; f16 if that does not fit either.\n"
         "Q2_K, Q3_K and IQ4_XS blocks come from simple quantizers of the generator's own\n"
         "(largest-value scales, no error search); the other types from tessera's quantizers.\n";
}

std::string hf_help() {
  return "--format hf: the same model as a Hugging Face checkpoint folder, for the llama and qwen3moe presets\n"
         "(qwen35moe, gemma3, glm4moe, deepseek2 and gpt-oss are refused: tessera has no Hugging Face loader\n"
         "for them) and --type f32, f16 or bf16 only:\n"
         "  config.json       LlamaForCausalLM or Qwen3MoeForCausalLM, the shape's hyperparameters\n"
         "  *.safetensors     the weights under transformers' names (model.layers.N.self_attn.q_proj.weight,\n"
         "                    mlp.experts.E.gate_proj.weight, ...), [out, in] row-major; the values of the GGUF\n"
         "                    file the same flags write (llama's q_proj / k_proj rows in transformers'\n"
         "                    rotate-half order, the inverse of llama.cpp's convert permutation); matrices in\n"
         "                    the --type, norms F32. One model.safetensors when the weights fit in one shard,\n"
         "                    else model-00001-of-0000N.safetensors shards of at most --shard-size (split as\n"
         "                    save_pretrained splits; a larger tensor gets a shard of its own) and\n"
         "                    model.safetensors.index.json\n"
         "  no tokenizer.json tessera's tokenizer.json reader takes GPT-2-style byte-level BPE only, and the\n"
         "                    built-in vocabulary is SentencePiece-style (byte fallback): the folder runs from\n"
         "                    token ids (tessera logits, tessera bench); tessera run reports no usable tokenizer\n"
         "The folder is written as FOLDER.part and renamed when complete. An existing FOLDER is replaced when it\n"
         "is empty or holds only a checkpoint's files (config.json, *.safetensors, the index), as an existing\n"
         ".gguf file is; a folder holding anything else is refused.\n";
}

// --format hf: the checkpoint folder `out` (the preset's name for a dry run).
int write_hf(gen::ModelShape s, std::string out, const std::string& type, uint64_t seed, int threads, bool quiet,
             bool dry_run, uint64_t shard_bytes) {
  namespace fs = std::filesystem;
  namespace st = gen::safetensors;
  // The vocabulary size of the GGUF file of the same flags (the built-in vocabulary's).
  s.n_vocab = int64_t(gen::builtin_vocab(s.n_vocab).tokens.size());
  const std::vector<gen::TensorSpec> specs = gen::model_tensors(s, type);
  const std::vector<gen::hf::HfTensor> tensors = gen::hf::hf_tensors(s, specs);
  std::vector<st::Entry> entries;
  for (const auto& t : tensors) entries.push_back(t.entry);
  const std::vector<std::vector<size_t>> shards = st::plan_shards(entries, shard_bytes);
  std::vector<st::FileLayout> layouts;
  for (const auto& members : shards) layouts.push_back(st::layout_file(entries, members));
  const std::string config = gen::hf::config_json(s, type);
  const std::string index = shards.size() > 1 ? st::index_json(entries, shards) : std::string();

  uint64_t total = 0, largest = 0, params = 0, folder_bytes = config.size() + index.size();
  for (const auto& e : entries) {
    total += e.nbytes();
    largest = std::max(largest, e.nbytes());
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= uint64_t(d);
    params += n;
  }
  for (const auto& l : layouts) folder_bytes += l.file_size;
  if (!quiet || dry_run) {
    std::fprintf(stderr, "%s: %s, %lld layers, n_embd %lld, vocab %lld, %s, %zu tensors, %s parameters\n",
                 out.c_str(), gen::arch_name(s.arch), (long long)s.n_layer, (long long)s.n_embd,
                 (long long)s.n_vocab, type.c_str(), entries.size(), human_count(double(params)).c_str());
    std::fprintf(stderr, "folder size: %s in %zu safetensors file%s (largest tensor %s, the memory it needs)\n",
                 human_bytes(double(folder_bytes)).c_str(), shards.size(), shards.size() == 1 ? "" : "s",
                 human_bytes(double(largest)).c_str());
  }
  if (dry_run) return 0;

  out = strip_slashes(out);
  const std::string tmp = out + ".part";
  check_replaceable_folder(out, "--out");
  check_replaceable_folder(tmp, "the temporary folder of an interrupted run");
  {
    std::error_code ec;
    auto dir = fs::absolute(out).parent_path();
    auto space = fs::space(dir, ec);
    if (!ec && space.available < folder_bytes)
      throw Error("not enough disk space in " + dir.string() + ": the folder needs " +
                  human_bytes(double(folder_bytes)) + ", " + human_bytes(double(space.available)) + " available");
    clear_checkpoint_folder(tmp);
    fs::remove(tmp, ec);
    if (!fs::create_directory(tmp, ec) || ec)
      throw Error(tmp + ": cannot create the folder: " + (ec ? ec.message() : std::string("exists")));
  }
  std::vector<std::string> paths = {tmp + "/config.json"};
  for (size_t k = 0; k < shards.size(); ++k) paths.push_back(tmp + "/" + st::shard_name(k, shards.size()));
  if (!index.empty()) paths.push_back(tmp + "/model.safetensors.index.json");

  FastPool pool(threads);
  Progress progress(quiet, total);
  uint64_t done = 0;
  // Written as OUT.part and renamed when complete; on any failure the folder is removed.
  try {
    PartialOutput partial(paths, tmp);
    write_text_file(paths[0], config);
    for (size_t k = 0; k < shards.size(); ++k) {
      st::write_file(paths[1 + k], entries, layouts[k], [&](size_t i, uint8_t* dst, size_t nbytes) {
        const gen::hf::HfTensor& h = tensors[i];
        const gen::TensorSpec& t = specs[h.spec];
        const size_t rb = row_bytes(t.type, t.ne[0]);
        make_rows(
            pool, h.rows,
            [&](int64_t r0, int64_t r1) {
              std::vector<float> row(size_t(t.ne[0]));
              for (int64_t r = r0; r < r1; ++r) {
                fill_row(t, seed, h.gguf_row(r), row.data());
                gen::quantize_row(t.type, row.data(), dst + size_t(r) * rb, t.ne[0]);
              }
            },
            [&](int64_t rows_done) { progress(h.entry.name, done + uint64_t(rows_done) * rb, false); });
        done += nbytes;
        progress(h.entry.name, done, done == total);
      });
    }
    if (!index.empty()) write_text_file(paths.back(), index);
    clear_checkpoint_folder(out);  // a previous checkpoint: the rename replaces the empty folder
    partial.commit(tmp, out);
  } catch (...) {
    if (progress.line_open()) std::fputc('\n', stderr);
    throw;
  }
  if (!quiet)
    std::fprintf(stderr, "%swrote %s: %s, %lld layers, n_embd %lld, vocab %lld, %s, %s in %zu safetensors file%s in %.1f s\n",
                 progress.line_open() ? "\n" : "", out.c_str(), gen::arch_name(s.arch), (long long)s.n_layer,
                 (long long)s.n_embd, (long long)s.n_vocab, type.c_str(), human_bytes(double(folder_bytes)).c_str(),
                 shards.size(), shards.size() == 1 ? "" : "s", progress.elapsed());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string preset = "default", type = "q8_0", out, vocab_path, format = "gguf", shard_size_text = "5GB";
  uint64_t seed = 42;
  int threads = 0;
  bool quiet = false, tied = false, dry_run = false, fast = false;
  po::options_description desc("options");
  desc.add_options()
    ("help,h", "show this help")
    ("list-presets", "list the presets: architecture and where each shape comes from")
    ("out,o", po::value(&out), "output .gguf file, or with --format hf the checkpoint folder (required)")
    ("format", po::value(&format)->default_value(format),
     "gguf: one GGUF file; hf: a Hugging Face checkpoint folder (see '--format hf' below)")
    ("shard-size", po::value(&shard_size_text)->default_value(shard_size_text),
     "--format hf: largest shard, as save_pretrained's max_shard_size (500MB, 5GB, 2GiB; GB = 10^9 bytes)")
    ("preset", po::value(&preset)->default_value(preset),
     "shape: default, tiny, tinyllama-1.1b, llama2-7b (llama); qwen3moe-tiny, qwen3-30b-a3b (qwen3moe); "
     "qwen35moe-tiny, qwen3.5-35b-a3b, qwen3.5-397b-a17b (qwen35moe); gemma3-tiny, gemma-3-27b (gemma3); "
     "glm4moe-tiny, glm-4.5-air (glm4moe); deepseek2-tiny, deepseek-v3, kimi-k2 (deepseek2); gpt-oss-tiny, "
     "gpt-oss-20b, gpt-oss-120b (gpt-oss)")
    ("type", po::value(&type)->default_value(type),
     "weight types (see 'types' below); the gpt-oss presets default to mxfp4_moe, their published format")
    ("vocab", po::value(&vocab_path),
     "copy the tokenizer from this GGUF (default: built-in byte-level vocabulary; not with --format hf)")
    ("seed", po::value(&seed)->default_value(seed), "random seed of the weights")
    ("layers", po::value<int64_t>(),
     "override: number of layers (glm4moe: with the NextN layers, kept last; deepseek2: the leading dense layers "
     "kept first, every layer dense when N is no more than they are)")
    ("embd", po::value<int64_t>(), "override: embedding size")
    ("heads", po::value<int64_t>(), "override: attention heads")
    ("kv-heads", po::value<int64_t>(), "override: key/value heads")
    ("head-dim", po::value<int64_t>(), "override: attention head size (default embd / heads for llama)")
    ("ff", po::value<int64_t>(),
     "override: feed-forward size (qwen MoE models and gpt-oss: only the feed_forward_length key; glm4moe, "
     "deepseek2: the leading dense layers)")
    ("dense-layers", po::value<int64_t>(), "override (glm4moe, deepseek2): leading dense layers")
    ("experts", po::value<int64_t>(), "override (MoE): number of experts")
    ("experts-used", po::value<int64_t>(), "override (MoE): experts used per token")
    ("expert-ff", po::value<int64_t>(), "override (MoE): feed-forward size of each expert")
    ("shared-ff", po::value<int64_t>(), "override (qwen35moe): feed-forward size of the shared expert")
    ("expert-groups", po::value<int64_t>(), "override (deepseek2): expert groups of the router (n_group)")
    ("expert-groups-used", po::value<int64_t>(), "override (deepseek2): expert groups kept per token (topk_group)")
    ("q-lora-rank", po::value<int64_t>(),
     "override (deepseek2): rank of the query latent (0: attn_q straight from the embedding, as DeepSeek-V2-Lite)")
    ("vocab-size", po::value<int64_t>(), "override: vocabulary size (built-in vocabulary is padded)")
    ("ctx", po::value<int64_t>(), "override: context length")
    ("tied", po::bool_switch(&tied), "no output.weight: reuse the token embedding")
    ("threads,t", po::value(&threads)->default_value(0), "threads (0 = all cores)")
    ("quiet,q", po::bool_switch(&quiet), "no progress output")
    ("dry-run,n", po::bool_switch(&dry_run), "print the model's size and the estimated file size, write nothing")
    ("fast", po::bool_switch(&fast),
     "quantized tensors: copy each row from a pool of 4096 rows quantized once per row shape, instead of "
     "quantizing every row (minutes instead of hours for the 30B presets; same types and sizes)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << "usage: tessera-gen --out FILE [--preset NAME] [--type TYPE] [--vocab VOCAB.gguf] [overrides]\n"
                << "       tessera-gen --format hf --out FOLDER [--preset NAME] [--type f32|f16|bf16] [--shard-size SIZE]\n\n"
                << "Writes a GGUF model (or with --format hf the same model as a Hugging Face checkpoint folder,\n"
                << "see below) with deterministic random weights (same flags and seed, same bytes, for any thread\n"
                << "count), streaming one tensor at a time to the file: memory use stays at the size of the\n"
                << "largest tensor, whatever the model's size. Architectures: llama, qwen3moe, qwen35moe, gemma3,\n"
                << "glm4moe, deepseek2, gpt-oss.\n\n"
                << "presets:\n" << preset_table() << "\n" << types_help() << "\n" << hf_help() << "\n" << desc << "\n";
      return check_stdout();
    }
    if (vm.count("list-presets")) {
      std::cout << preset_table();
      return check_stdout();
    }
    po::notify(vm);
    if (out.empty() && !dry_run) throw po::error("the option '--out' is required but missing");
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }

  gen::ModelShape s = gen::preset(preset);
  if (vm["type"].defaulted()) type = gen::preset_info(preset).type;
  if (tied) s.tied_output = true;
  auto ov = [&](const char* flag, int64_t& field) {
    if (vm.count(flag)) field = vm[flag].as<int64_t>();
  };
  ov("layers", s.n_layer), ov("embd", s.n_embd), ov("heads", s.n_head), ov("kv-heads", s.n_head_kv);
  ov("head-dim", s.head_dim), ov("ff", s.n_ff), ov("vocab-size", s.n_vocab), ov("ctx", s.context_length);
  ov("experts", s.n_expert), ov("experts-used", s.n_expert_used), ov("expert-ff", s.n_ff_exp);
  ov("shared-ff", s.n_ff_shexp);
  if (!gen::is_moe(s.arch) &&
      (vm.count("experts") || vm.count("experts-used") || vm.count("expert-ff") || vm.count("shared-ff")))
    throw Error("--experts, --experts-used, --expert-ff and --shared-ff need a MoE preset");
  if (s.arch != gen::Arch::Qwen35Moe && vm.count("shared-ff")) throw Error("--shared-ff needs a qwen35moe preset");
  const bool deepseek2 = s.arch == gen::Arch::Deepseek2;
  if (!deepseek2 && (vm.count("expert-groups") || vm.count("expert-groups-used") || vm.count("q-lora-rank")))
    throw Error("--expert-groups, --expert-groups-used and --q-lora-rank need a deepseek2 preset");
  if (!deepseek2 && s.arch != gen::Arch::Glm4Moe && vm.count("dense-layers"))
    throw Error("--dense-layers needs a glm4moe or deepseek2 preset");
  // A cut below the leading dense layers keeps only dense ones.
  if (deepseek2 && vm.count("layers") && !vm.count("dense-layers"))
    s.n_dense_lead = std::min(s.n_dense_lead, s.n_layer);
  ov("dense-layers", s.n_dense_lead), ov("expert-groups", s.n_expert_groups);
  ov("expert-groups-used", s.n_expert_groups_used), ov("q-lora-rank", s.q_lora_rank);
  gen::validate(s);
  if (format != "gguf" && format != "hf") throw Error("unknown --format '" + format + "' (gguf or hf)");
  if (format == "gguf" && !vm["shard-size"].defaulted()) throw Error("--shard-size needs --format hf");
  if (format == "hf") {
    gen::hf::check_supported(s, type);
    if (!vocab_path.empty())
      throw Error("--vocab needs --format gguf: the Hugging Face folder gets no tokenizer (--vocab-size sets the "
                  "vocabulary's size)");
    const uint64_t shard_bytes = gen::safetensors::parse_size(shard_size_text);
    return write_hf(s, dry_run ? preset : out, type, seed, threads, quiet, dry_run, shard_bytes);
  }

  gguf::GgufWriter w(3);
  w.set_string("general.architecture", gen::arch_name(s.arch));
  w.set_string("general.name", s.name);
  if (!vocab_path.empty()) {
    // The file's size wins over the preset's (an explicit --vocab-size must agree).
    const int64_t preset_vocab = s.n_vocab;
    if (!vm.count("vocab-size")) s.n_vocab = 0;
    copy_tokenizer(vocab_path, w, s.n_vocab);
    if (!quiet && preset_vocab != 0 && preset_vocab != s.n_vocab)
      std::fprintf(stderr, "vocabulary of %s: %lld pieces (the preset has %lld)\n", vocab_path.c_str(),
                   (long long)s.n_vocab, (long long)preset_vocab);
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
  gen::write_hparams(w, s);
  w.set_u32("general.quantization_version", 2);
  w.set_u32("general.file_type", gen::ggml_file_type(type));

  std::vector<gen::TensorSpec> specs = gen::model_tensors(s, type);

  uint64_t total = 0, done = 0, params = 0, largest = 0;
  for (const auto& t : specs) {
    const uint64_t nb = row_bytes(t.type, t.ne[0]) * uint64_t(t.nelements_rows());
    total += nb;
    largest = std::max(largest, nb);
    params += uint64_t(t.ne[0]) * uint64_t(t.nelements_rows());
  }
  // Header: about the vocabulary's strings plus the tensor infos; data: padded to 32.
  const uint64_t estimate = total + 32 * specs.size() + uint64_t(s.n_vocab) * 32 + specs.size() * 64;
  if (!quiet || dry_run) {
    std::fprintf(stderr, "%s: %s, %lld layers, n_embd %lld, vocab %lld, %s, %zu tensors, %s parameters\n",
                 dry_run ? preset.c_str() : out.c_str(), gen::arch_name(s.arch), (long long)s.n_layer,
                 (long long)s.n_embd, (long long)s.n_vocab, type.c_str(), specs.size(), human_count(double(params)).c_str());
    std::fprintf(stderr, "estimated file size: %s (largest tensor %s, the memory it needs)\n",
                 human_bytes(double(estimate)).c_str(), human_bytes(double(largest)).c_str());
  }
  // A dry run stops before the tensors are declared to the writer (whose duplicate-name
  // check is linear per tensor, so declaring is quadratic in the layer count).
  if (dry_run) return 0;
  {
    std::error_code ec;
    auto st = std::filesystem::status(out, ec);
    // Renaming over a directory fails late, over a device (as root) replaces it.
    if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      throw Error(out + " exists and is not a regular file: --out needs a file name");
    auto dir = std::filesystem::absolute(out).parent_path();
    auto space = std::filesystem::space(dir, ec);
    if (!ec && space.available < estimate)
      throw Error("not enough disk space in " + dir.string() + ": the model needs about " +
                  human_bytes(double(estimate)) + ", " + human_bytes(double(space.available)) + " available");
  }
  if (!quiet && !fast && estimate > (2ull << 30) && type.find("_k") != std::string::npos)
    std::fprintf(stderr, "note: quantizing every K-quant row takes about 100 ns per weight and core; --fast "
                         "copies rows from a pool of quantized rows instead\n");
  for (const auto& t : specs) w.declare_tensor(t.name, t.type, t.ne);

  FastPool pool(threads);
  RowPool row_pool(seed, pool);
  Progress progress(quiet, total);
  // Written under a temporary name and renamed when complete; on any failure (a write
  // error, a full disk, an exception, a fatal signal) the temporary is removed.
  try {
    PartialOutput partial({out + ".part"});
    w.write_file_streaming(out + ".part", [&](size_t index, uint8_t* dst, size_t nbytes) {
      const gen::TensorSpec& t = specs[index];
      const size_t rb = row_bytes(t.type, t.ne[0]);
      const bool pooled = fast && dtype_traits(t.type).quantized;
      if (pooled) row_pool.copy_row(t, 0, dst);  // makes the pool for this row shape (parallel) first
      make_rows(
          pool, t.nelements_rows(),
          [&](int64_t r0, int64_t r1) {
            std::vector<float> row(pooled ? 0 : size_t(t.ne[0]));
            for (int64_t r = r0; r < r1; ++r) {
              if (pooled) {
                row_pool.copy_row(t, r, dst + size_t(r) * rb);
              } else {
                fill_row(t, seed, r, row.data());
                gen::quantize_row(t.type, row.data(), dst + size_t(r) * rb, t.ne[0]);
              }
            }
          },
          [&](int64_t rows_done) { progress(t.name, done + uint64_t(rows_done) * rb, false); });
      done += nbytes;
      progress(t.name, done, index + 1 == specs.size());
    });
    partial.commit(out + ".part", out);
  } catch (...) {
    if (progress.line_open()) std::fputc('\n', stderr);
    throw;
  }
  if (!quiet) {
    std::error_code ec;
    auto size = std::filesystem::file_size(out, ec);
    std::fprintf(stderr, "%swrote %s: %s, %lld layers, n_embd %lld, vocab %lld, %s, %s in %.1f s\n",
                 progress.line_open() ? "\n" : "", out.c_str(), gen::arch_name(s.arch), (long long)s.n_layer,
                 (long long)s.n_embd, (long long)s.n_vocab, type.c_str(), human_bytes(double(ec ? total : size)).c_str(),
                 progress.elapsed());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tessera-gen: error: %s\n", e.what());
  return 1;
}
