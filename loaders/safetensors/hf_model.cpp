#include "hf_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hf_tokenizer.h"
#include "tessera/error.h"

namespace tessera::hf {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kMaxConfigBytes = 4u << 20;
constexpr int kMaxJsonDepth = 32;

// A transformers class -> tessera's architecture.
struct ArchitectureName {
  const char* hf;
  const char* tessera;
};
constexpr ArchitectureName kArchitectures[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"Qwen3MoeForCausalLM", "qwen3moe"},
};

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(printable(path, 200) + ": cannot read: " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.size() > kMaxConfigBytes)
    throw Error(printable(path, 200) + ": " + std::to_string(text.size()) + " bytes, more than a config file holds");
  // Depth is bounded while parsing: a hostile file nested a million deep never builds.
  json::parser_callback_t depth_limit = [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth)
      throw Error(printable(path, 200) + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  json j;
  try {
    j = json::parse(text, depth_limit);
  } catch (const json::exception& e) {
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n') c = ' ';
    throw Error(printable(path, 200) + ": not valid JSON: " + printable(what, 200));
  }
  if (!j.is_object()) throw Error(printable(path, 200) + ": expected a JSON object");
  return j;
}

// config.json's scalars (and nested objects' scalars) as "hf.<key>[.<key>]" metadata.
void flatten(const json& j, const std::string& prefix, Metadata& md) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix + it.key();
    const json& v = it.value();
    MetaValue m;
    if (v.is_object()) {
      flatten(v, key + ".", md);
      continue;
    } else if (v.is_boolean()) {
      m.type = MetaType::Bool;
      m.value = int64_t(v.get<bool>());
    } else if (v.is_number_unsigned()) {
      m.type = MetaType::U64;
      m.value = v.get<uint64_t>();
    } else if (v.is_number_integer()) {
      m.type = MetaType::I64;
      m.value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      m.type = MetaType::F64;
      m.value = v.get<double>();
    } else if (v.is_string()) {
      m.type = MetaType::String;
      m.value = v.get<std::string>();
    } else if (v.is_array()) {
      // Shown as text: arrays in configs are short lists (architectures, layer lists).
      m.type = MetaType::String;
      m.value = v.dump();
    } else {
      continue;  // null: as if absent
    }
    md.set(key, std::move(m));
  }
}

// The translation of one checkpoint into tessera's names.
class Translator {
 public:
  Translator(const std::string& folder, const json& config, const std::vector<TensorInfo>& tensors,
             ModelDescription& d)
      : config_path_(printable((fs::path(folder) / "config.json").string(), 200)), cfg_(config), d_(d) {
    for (const TensorInfo& t : tensors) by_name_.emplace(t.name, &t);
  }

  // config.json's value `key`; nullptr when absent or null.
  const json* value(const std::string& key) const {
    auto it = cfg_.find(key);
    return it == cfg_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw Error(config_path_ + ": " + key + " " + why);
  }

  // Hyperparameter `ours` from config.json's `theirs` (integer), if present.
  void hp_int(const std::string& ours, const std::string& theirs) {
    const json* v = value(theirs);
    if (!v) return;
    if (!v->is_number_integer()) refuse(theirs, "must be an integer, not " + printable(v->dump(), 40));
    set(ours, theirs, MetaType::I64, v->get<int64_t>());
  }
  void hp_float(const std::string& ours, const std::string& theirs) {
    const json* v = value(theirs);
    if (!v) return;
    if (!v->is_number()) refuse(theirs, "must be a number, not " + printable(v->dump(), 40));
    set(ours, theirs, MetaType::F64, v->get<double>());
  }
  template <class T>
  void set(const std::string& ours, const std::string& theirs, MetaType type, T value) {
    MetaValue m;
    m.type = type;
    m.value = value;
    d_.hparams.set(ours, std::move(m));
    d_.origin[ours] = "config.json " + theirs;
  }

  // Refuse a config value that changes the model in a way the architecture lacks.
  void require_value(const std::string& key, const json& expected, bool absent_ok = true) const {
    const json* v = value(key);
    if (!v) {
      if (absent_ok) return;
      refuse(key, "is missing");
    }
    if (*v != expected)
      refuse(key, "= " + printable(v->dump(), 60) + " is not supported (only " + expected.dump() + ")");
  }

  const TensorInfo* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  // Tensor `theirs` under tessera's name `ours`; consumed so it is not kept twice.
  void rename(const std::string& theirs, const std::string& ours) {
    d_.origin[ours] = theirs;  // also names a missing tensor in messages
    const TensorInfo* t = find(theirs);
    if (!t) return;
    TensorInfo c = *t;
    c.name = ours;
    d_.tensors.push_back(std::move(c));
    by_name_.erase(theirs);
  }
  void consume(const std::string& theirs) { by_name_.erase(theirs); }
  // What remains under its own name (reported as unused by the model loader).
  void keep_the_rest() {
    for (const auto& [name, t] : by_name_) d_.tensors.push_back(*t);
    by_name_.clear();
  }

 private:
  std::string config_path_;
  const json& cfg_;
  ModelDescription& d_;
  std::map<std::string, const TensorInfo*> by_name_;  // not yet translated
};

// Llama 3.1's RoPE frequency factors from rope_scaling (rope_type llama3), computed as
// Hugging Face's _compute_llama3_parameters does: pair i's wavelength against the
// original context's low/high-frequency wavelengths.
std::vector<float> llama3_rope_factors(const Translator& tr, const json& scaling, double base, int64_t head_dim) {
  auto num = [&](const char* key, double fallback) {
    auto it = scaling.find(key);
    if (it == scaling.end() || it->is_null()) return fallback;
    if (!it->is_number()) tr.refuse(std::string("rope_scaling.") + key, "must be a number");
    return it->get<double>();
  };
  const double factor = num("factor", 8.0), low = num("low_freq_factor", 1.0), high = num("high_freq_factor", 4.0);
  const double old_ctx = num("original_max_position_embeddings", 8192.0);
  if (!(factor > 0) || !(low > 0) || !(high > low) || !(old_ctx > 0))
    tr.refuse("rope_scaling", "(llama3) needs factor > 0, 0 < low_freq_factor < high_freq_factor and a positive "
                              "original_max_position_embeddings");
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> f(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float freq = float(1.0 / std::pow(base, double(2 * i) / double(head_dim)));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f[size_t(i)] = 1.f;
    } else if (wavelen > low_wavelen) {
      f[size_t(i)] = float(factor);
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f[size_t(i)] = float(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return f;
}

}  // namespace

CheckpointFile::~CheckpointFile() {
  for (void* p : owned_) std::free(p);
}

void* CheckpointFile::own(size_t bytes) const {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error(folder_ + ": out of memory (" + std::to_string(bytes) + " bytes)");
  owned_.push_back(p);
  return p;
}

std::unique_ptr<CheckpointFile> CheckpointFile::open(const std::string& path) {
  const std::string folder = safetensors::checkpoint_folder(path);
  if (folder.empty()) throw Error(printable(path, 200) + ": not a checkpoint folder or config.json");
  std::unique_ptr<CheckpointFile> f(new CheckpointFile());
  f->folder_ = folder;
  f->config_ = read_json((fs::path(folder) / "config.json").string());
  const json& config = f->config_;
  f->ckpt_ = safetensors::Checkpoint::open(folder);

  uint64_t total = 0;
  for (const safetensors::RawTensor* r : f->ckpt_->tensors()) {
    if (!r->type)
      throw Error(printable(r->file, 200) + ": tensor '" + printable(r->name, 120) + "' has dtype " +
                  printable(r->dtype, 16) + ", which tessera does not read (F32, F16 and BF16)");
    if (r->shape.size() > size_t(Tensor::kMaxDims))
      throw Error(printable(r->file, 200) + ": tensor '" + printable(r->name, 120) + "' has " +
                  std::to_string(r->shape.size()) + " dimensions (at most 4)");
    TensorInfo t;
    t.name = r->name;
    t.type = *r->type;
    t.ne.assign(r->shape.rbegin(), r->shape.rend());  // row-major outermost-first -> ggml order
    if (t.ne.empty()) t.ne.push_back(1);
    t.nbytes = r->nbytes;
    t.file_offset = r->file_offset;
    t.offset = r->file_offset;
    t.data = r->data;
    // safetensors does not align data; element reads must be aligned, so the rare
    // misaligned tensor is copied.
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_traits(t.type).block_bytes != 0) {
      void* copy = f->own(t.nbytes);
      std::memcpy(copy, t.data, t.nbytes);
      t.data = copy;
    }
    total += t.nbytes;
    f->tensors_.push_back(std::move(t));
  }
  f->file_size_ = total;

  // What `tessera info` shows: tessera's architecture, the folder's name, config.json.
  std::string arch;
  if (auto it = config.find("architectures"); it != config.end() && it->is_array() && !it->empty() &&
                                               (*it)[0].is_string())
    for (const auto& a : kArchitectures)
      if ((*it)[0].get<std::string>() == a.hf) arch = a.tessera;
  auto set_string = [&](const std::string& key, const std::string& v) {
    MetaValue m;
    m.type = MetaType::String;
    m.value = v;
    f->meta_.set(key, std::move(m));
  };
  if (!arch.empty()) set_string("general.architecture", arch);
  set_string("general.name", fs::path(folder).filename().string());
  flatten(config, "hf.", f->meta_);
  read_tokenizer(folder, f->meta_);
  return f;
}

ModelDescription CheckpointFile::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!desc_) desc_ = translate();
  return *desc_;
}

ModelDescription CheckpointFile::translate() const {
  const json& config = config_;
  ModelDescription d;
  d.name = fs::path(folder_).filename().string();
  Translator tr(folder_, config, tensors_, d);

  const json* archs = tr.value("architectures");
  if (!archs || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    tr.refuse("architectures", "is missing (a list naming the transformers model class)");
  const std::string hf_arch = (*archs)[0].get<std::string>();
  for (const auto& a : kArchitectures)
    if (hf_arch == a.hf) d.architecture = a.tessera;
  if (d.architecture.empty()) {
    std::string known;
    for (const auto& a : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(a.hf);
    tr.refuse("architectures", "= " + printable(hf_arch, 80) + " is not supported (this build reads: " + known + ")");
  }
  const bool moe = d.architecture == "qwen3moe";

  // Hyperparameters.
  tr.hp_int("block_count", "num_hidden_layers");
  tr.hp_int("embedding_length", "hidden_size");
  tr.hp_int("feed_forward_length", "intermediate_size");
  tr.hp_int("attention.head_count", "num_attention_heads");
  tr.hp_int("attention.head_count_kv", "num_key_value_heads");
  tr.hp_int("attention.key_length", "head_dim");
  tr.hp_int("attention.value_length", "head_dim");
  tr.hp_int("context_length", "max_position_embeddings");
  tr.hp_float("attention.layer_norm_rms_epsilon", "rms_norm_eps");
  tr.hp_float("rope.freq_base", "rope_theta");
  if (moe) {
    tr.hp_int("expert_count", "num_experts");
    tr.hp_int("expert_used_count", "num_experts_per_tok");
    tr.hp_int("expert_feed_forward_length", "moe_intermediate_size");
    // tessera's router renormalizes the chosen experts' weights, on every layer.
    tr.require_value("norm_topk_prob", true);
    tr.require_value("decoder_sparse_step", 1);
    if (const json* v = tr.value("mlp_only_layers"); v && !(v->is_array() && v->empty()))
      tr.refuse("mlp_only_layers", "lists dense layers, which tessera's qwen3moe does not have");
  }
  tr.require_value("hidden_act", "silu");
  tr.require_value("attention_bias", d.architecture == "qwen2");  // qwen2 always has q/k/v biases
  tr.require_value("mlp_bias", false);
  tr.require_value("use_sliding_window", false);
  // Mistral's configs state a window without a use_ flag; attention here is full.
  if (d.architecture == "llama" && tr.value("sliding_window"))
    tr.refuse("sliding_window", "is set: sliding-window attention is not supported (only null)");
  if (d.architecture == "llama") {
    // transformers keeps q/k rows in rotate-half order (GGUF files permute them).
    d.hparams.set("rope.qk_rotate_half", MetaValue{MetaType::Bool, int64_t(1)});
    d.origin["rope.qk_rotate_half"] = "(Hugging Face q/k row order)";
  }

  const int64_t n_layer = d.hparams.get_int("block_count").value_or(0);
  if (n_layer < 1 || n_layer > 100000) tr.refuse("num_hidden_layers", "must be between 1 and 100000");
  const int64_t n_embd = d.hparams.get_int("embedding_length").value_or(0);
  const int64_t n_head = d.hparams.get_int("attention.head_count").value_or(0);
  if (n_embd < 1 || n_head < 1) tr.refuse("hidden_size", "and num_attention_heads must be positive");
  const int64_t head_dim = d.hparams.get_int("attention.key_length").value_or(n_embd / n_head);
  if (head_dim < 2 || head_dim > 65536 || head_dim % 2) tr.refuse("head_dim", "must be even, 2 .. 65536");

  // RoPE scaling.
  if (const json* rs = tr.value("rope_scaling")) {
    if (!rs->is_object()) tr.refuse("rope_scaling", "must be an object");
    std::string type;
    for (const char* k : {"rope_type", "type"})
      if (auto it = rs->find(k); it != rs->end() && it->is_string()) type = it->get<std::string>();
    if (type == "linear") {
      auto it = rs->find("factor");
      if (it == rs->end() || !it->is_number()) tr.refuse("rope_scaling.factor", "must be a number (linear scaling)");
      d.hparams.set("rope.scaling.type", MetaValue{MetaType::String, std::string("linear")});
      d.hparams.set("rope.scaling.factor", MetaValue{MetaType::F64, it->get<double>()});
      d.origin["rope.scaling.factor"] = "config.json rope_scaling.factor";
    } else if (type == "llama3" && d.architecture == "llama") {
      const double base = d.hparams.get_float("rope.freq_base").value_or(10000.0);
      if (!(base > 1.0) || !std::isfinite(base)) tr.refuse("rope_theta", "must be a finite number above 1");
      const std::vector<float> f = llama3_rope_factors(tr, *rs, base, head_dim);
      TensorInfo t;
      t.name = "rope_freqs.weight";
      t.type = DType::F32;
      t.ne = {int64_t(f.size())};
      t.nbytes = f.size() * sizeof(float);
      void* p = own(t.nbytes);
      std::memcpy(p, f.data(), t.nbytes);
      t.data = p;
      d.tensors.push_back(std::move(t));
      d.origin["rope_freqs.weight"] = "(from config.json rope_scaling, rope_type llama3)";
    } else if (!type.empty() && type != "default") {
      tr.refuse("rope_scaling", "type '" + printable(type, 40) + "' is not supported (linear; llama3 for Llama)");
    }
  }

  // Tensors.
  tr.rename("model.embed_tokens.weight", "token_embd.weight");
  tr.rename("model.norm.weight", "output_norm.weight");
  tr.rename("lm_head.weight", "output.weight");
  static const std::pair<const char*, const char*> kLayerTensors[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
  };
  const int64_t n_expert = moe ? d.hparams.get_int("expert_count").value_or(0) : 0;
  if (moe && (n_expert < 1 || n_expert > 4096)) tr.refuse("num_experts", "must be between 1 and 4096");
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", ours = "blk." + std::to_string(l) + ".";
    for (const auto& [theirs, name] : kLayerTensors) tr.rename(hf + theirs, ours + name);
    if (!moe) continue;
    // Routed experts: one tensor per expert in the checkpoint, one [in, out, experts]
    // batch for MatMulId: copied side by side (the shards do not keep them adjacent).
    for (const char* proj : {"gate", "up", "down"}) {
      const std::string batch = ours + "ffn_" + proj + "_exps.weight";
      const std::string pattern = hf + "mlp.experts.*." + proj + "_proj.weight";
      d.origin[batch] = pattern;
      std::vector<const TensorInfo*> parts;
      for (int64_t e = 0; e < n_expert; ++e) {
        const std::string name = hf + "mlp.experts." + std::to_string(e) + "." + proj + "_proj.weight";
        const TensorInfo* t = tr.find(name);
        if (!t) {
          if (e == 0) break;  // none: the architecture reports the batch missing
          throw Error(folder_ + ": tensor '" + name + "' is missing (num_experts = " + std::to_string(n_expert) + ")");
        }
        if (!parts.empty() && (t->type != parts[0]->type || t->ne != parts[0]->ne))
          throw Error(folder_ + ": tensor '" + name + "' differs in dtype or shape from expert 0's");
        if (t->ne.size() != 2) throw Error(folder_ + ": tensor '" + name + "' is not a matrix");
        parts.push_back(t);
      }
      if (parts.empty()) continue;
      TensorInfo b;
      b.name = batch;
      b.type = parts[0]->type;
      b.ne = {parts[0]->ne[0], parts[0]->ne[1], n_expert};
      b.nbytes = parts[0]->nbytes * size_t(n_expert);
      auto* dst = static_cast<uint8_t*>(own(b.nbytes));
      for (size_t e = 0; e < parts.size(); ++e) {
        std::memcpy(dst + e * parts[0]->nbytes, parts[e]->data, parts[e]->nbytes);
        // The copy is what runs: the mapped pages need not stay resident.
        const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
        const uintptr_t a = (uintptr_t(parts[e]->data) + page - 1) & ~(page - 1);
        const uintptr_t z = (uintptr_t(parts[e]->data) + parts[e]->nbytes) & ~(page - 1);
        if (z > a) madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED);
      }
      b.data = dst;
      for (const TensorInfo* t : parts) tr.consume(t->name);
      d.tensors.push_back(std::move(b));
    }
  }
  tr.keep_the_rest();

  // The vocabulary size config.json states must be the embedding's.
  const auto emb_it = std::find_if(d.tensors.begin(), d.tensors.end(),
                                   [](const TensorInfo& t) { return t.name == "token_embd.weight"; });
  if (emb_it != d.tensors.end()) {
    const TensorInfo* emb = &*emb_it;
    if (const json* v = tr.value("vocab_size"); v && v->is_number_integer() && emb->ne.size() == 2 &&
                                                 v->get<int64_t>() != emb->ne[1])
      tr.refuse("vocab_size", "= " + std::to_string(v->get<int64_t>()) + " but model.embed_tokens.weight has " +
                                  std::to_string(emb->ne[1]) + " rows");
  }
  return d;
}

}  // namespace tessera::hf
