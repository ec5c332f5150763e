#include "models/model_loader_util.h"

#include "models/graph_builder.h"
#include "tessera/rope_table.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <sstream>
#include <unordered_set>

namespace tessera::models {

KvCacheConfig paged_kv_config(const ModelInfo& info, int64_t n_ctx, int page_tokens) {
  KvCacheConfig c;
  c.n_layers = int(info.n_layer);
  c.n_kv_heads = int(info.n_head_kv);
  c.head_dim = int(info.head_dim);
  c.page_tokens = page_tokens;
  c.n_pages = int((n_ctx + page_tokens - 1) / page_tokens);
  return c;
}

KvCacheConfig windowed_kv_config(const ModelInfo& info, int64_t n_ctx, int page_tokens, int32_t window,
                                 std::vector<uint8_t> local) {
  KvCacheConfig c = paged_kv_config(info, n_ctx, page_tokens);
  if (window <= 0 || std::find(local.begin(), local.end(), uint8_t(1)) == local.end()) return c;
  c.window = window;
  c.window_layers = std::move(local);
  c.n_window_pages = c.n_pages;
  return c;
}

namespace {

// N of a tensor named "blk.N.<rest>", or -1.
int64_t layer_index(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  int64_t n = 0;
  size_t i = kPrefix.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    if (n > (INT64_MAX - 9) / 10) return -1;  // absurd index: not a layer of any model
    n = n * 10 + (name[i] - '0');
  }
  return i < name.size() && name[i] == '.' ? n : -1;
}

std::string value_text(const Metadata& md, const std::string& key) {
  const MetaValue* v = md.find(key);
  if (!v) return "(absent)";
  if (auto i = v->as_int()) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&v->value)) return std::to_string(*u);
  if (auto d = v->as_float()) {
    std::ostringstream s;
    s << *d;
    return s.str();
  }
  std::string t = "(";
  t += meta_type_name(v->type);
  t += ')';
  return t;
}

}  // namespace

WeightSource::WeightSource(const ModelDescription& desc, std::vector<Tensor*>& weights)
    : desc_(desc), weights_(weights) {
  const auto& tensors = desc_.tensors;
  by_name_.reserve(tensors.size());
  std::unordered_set<int64_t> layers;
  for (const TensorInfo& t : tensors) {
    by_name_.emplace(std::string_view(t.name), &t);
    if (int64_t l = layer_index(t.name); l >= 0) layers.insert(l);
    for (int64_t d : t.ne) max_dim_ = std::max(max_dim_, d);
  }
  layers_in_file_ = int64_t(layers.size());
}

const TensorInfo* WeightSource::find(const std::string& name) const {
  auto it = by_name_.find(std::string_view(name));
  return it == by_name_.end() ? nullptr : it->second;
}

void WeightSource::refuse(const std::string& suffix, const std::string& value, const std::string& why) const {
  throw Error("hyperparameter " + key(suffix) + " = " + value + " " + why);
}

int64_t WeightSource::mul(int64_t a, int64_t b, const std::string& what) const {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    throw Error(arch() + ": " + what + " = " + std::to_string(a) + " x " + std::to_string(b) +
                " overflows (hyperparameters inconsistent with the tensors)");
  return r;
}

template <class F>
auto WeightSource::read(const std::string& suffix, F&& get) const -> decltype(get()) {
  try {
    return get();
  } catch (const Error& e) {
    const std::string theirs = key(suffix);
    if (theirs == suffix) throw;
    std::string msg = e.what();
    const std::string quoted = "'" + suffix + "'";
    if (size_t at = msg.find(quoted); at != std::string::npos) msg.replace(at, quoted.size(), "'" + theirs + "'");
    throw Error(msg);
  }
}

int64_t WeightSource::hp_int(const std::string& suffix) const {
  if (!hp_has(suffix)) throw Error("missing metadata key '" + key(suffix) + "'");
  return read(suffix, [&] { return md().require_int(suffix); });
}

int64_t WeightSource::hp_int(const std::string& suffix, int64_t fallback) const {
  return read(suffix, [&] { return md().get_int(suffix); }).value_or(fallback);
}

std::optional<std::string> WeightSource::hp_string(const std::string& suffix) const {
  return read(suffix, [&] { return md().get_string(suffix); });
}

std::optional<bool> WeightSource::hp_bool(const std::string& suffix) const {
  return read(suffix, [&] { return md().get_bool(suffix); });
}

int64_t WeightSource::check_size(const std::string& suffix, int64_t v, bool present) const {
  const std::string shown = present ? std::to_string(v) : std::to_string(v) + " (absent, derived)";
  if (v < 1) refuse(suffix, shown, "must be positive");
  if (v > INT32_MAX) refuse(suffix, shown, "exceeds 2^31 - 1");
  if (v > max_dim_)
    refuse(suffix, shown,
           "exceeds the largest tensor dimension in the file (" + std::to_string(max_dim_) +
               "): no tensor can have the shape it implies");
  return v;
}

int64_t WeightSource::hp_size(const std::string& suffix) const {
  return check_size(suffix, hp_int(suffix), true);
}

int64_t WeightSource::hp_size(const std::string& suffix, int64_t fallback) const {
  auto v = read(suffix, [&] { return md().get_int(suffix); });
  return check_size(suffix, v.value_or(fallback), v.has_value());
}

int64_t WeightSource::hp_block_count() const {
  const int64_t v = hp_int("block_count");
  if (v < 1) refuse("block_count", std::to_string(v), "must be positive");
  if (v > layers_in_file_)
    refuse("block_count", std::to_string(v),
           "exceeds the " + std::to_string(layers_in_file_) + " layers whose tensors (blk.N.*) the file holds");
  return v;
}

int64_t WeightSource::hp_context_length(int64_t fallback) const {
  const int64_t v = hp_int("context_length", fallback);
  if (v < 1 || v > INT32_MAX) refuse("context_length", std::to_string(v), "must be between 1 and 2^31 - 1");
  return v;
}

float WeightSource::hp_positive_float(const std::string& suffix, float fallback) const {
  const double v = read(suffix, [&] { return md().get_float(suffix); }).value_or(double(fallback));
  // NaN fails every comparison; the float conversion must neither overflow nor flush to 0.
  if (!(v > 0.0) || !(v <= double(FLT_MAX)) || !(float(v) > 0.f))
    refuse(suffix, value_text(md(), suffix), "must be a finite positive number");
  return float(v);
}

void read_decoder_hparams(const WeightSource& w, ModelInfo& i, const DecoderDefaults& defaults) {
  i.architecture = w.arch();
  i.name = w.desc().name;
  // block_count first: a file claiming millions of layers is refused before a single
  // layer is allocated.
  i.n_layer = w.hp_block_count();
  i.n_embd = w.hp_size("embedding_length");
  i.n_head = w.hp_size("attention.head_count");
  i.n_head_kv = w.hp_size("attention.head_count_kv", i.n_head);
  i.context_length = w.hp_context_length(defaults.context_length);
  i.rms_eps = w.hp_positive_float("attention.layer_norm_rms_epsilon", defaults.rms_eps);
  i.rope_freq_base = w.hp_positive_float("rope.freq_base", defaults.rope_freq_base);
  if (i.n_head % i.n_head_kv != 0)
    w.refuse("attention.head_count", std::to_string(i.n_head),
             "is not a multiple of attention.head_count_kv " + std::to_string(i.n_head_kv));
  i.head_dim = w.hp_size("attention.key_length", i.n_embd / i.n_head);
  if (const int64_t vl = w.hp_int("attention.value_length", i.head_dim); vl != i.head_dim && !defaults.own_value_length)
    w.refuse("attention.value_length", std::to_string(vl),
             "differs from attention.key_length " + std::to_string(i.head_dim) + " (not supported)");
  i.rope_dims = w.hp_int("rope.dimension_count", i.head_dim);
  if (i.rope_dims <= 0 || i.rope_dims > i.head_dim || i.rope_dims % 2)
    w.refuse("rope.dimension_count", std::to_string(i.rope_dims),
             "is invalid for head size " + std::to_string(i.head_dim) + " (must be even, 2 .. head size)");
}

RopeYarn read_rope_scaling(const WeightSource& w, ModelInfo& i) {
  RopeYarn yarn;
  const auto type = w.hp_string("rope.scaling.type");
  if (!type || *type == "none") return yarn;
  if (*type != "linear" && *type != "yarn")
    throw Error(i.architecture + ": rope scaling type '" + printable(*type) + "' is not supported");
  i.rope_freq_scale = 1.f / w.hp_positive_float("rope.scaling.factor", 1.f);
  if (*type == "linear") return yarn;
  const int64_t n_ctx_orig = w.hp_int("rope.scaling.original_context_length", i.context_length);
  if (n_ctx_orig < 1 || n_ctx_orig > INT32_MAX)
    w.refuse("rope.scaling.original_context_length", std::to_string(n_ctx_orig), "must be 1 .. 2^31 - 1");
  yarn.ext_factor = 1.f;
  yarn.attn_factor = w.hp_positive_float("rope.scaling.yarn_attn_factor", 1.f);
  const float beta_fast = w.hp_positive_float("rope.scaling.yarn_beta_fast", 32.f);
  const float beta_slow = w.hp_positive_float("rope.scaling.yarn_beta_slow", 1.f);
  rope_yarn_corr_dims(int32_t(i.rope_dims), n_ctx_orig, i.rope_freq_base, beta_fast, beta_slow, yarn.corr_dims);
  return yarn;
}

void read_expert_hparams(const WeightSource& w, ModelInfo& i) {
  i.n_expert = w.hp_size("expert_count");
  i.n_expert_used = w.hp_size("expert_used_count");
  if (i.n_expert_used > i.n_expert)
    w.refuse("expert_used_count", std::to_string(i.n_expert_used), "exceeds expert_count " + std::to_string(i.n_expert));
  i.n_ff = w.hp_has("expert_feed_forward_length") || !w.hp_has("feed_forward_length")
               ? w.hp_size("expert_feed_forward_length")
               : w.hp_size("feed_forward_length");
}

ExpertGroups read_expert_groups(const WeightSource& w, const ModelInfo& i) {
  ExpertGroups g;
  g.groups = w.hp_int("expert_group_count", 1);
  if (g.groups < 1 || g.groups > i.n_expert || i.n_expert % g.groups != 0)
    w.refuse("expert_group_count", std::to_string(g.groups),
             "must divide expert_count " + std::to_string(i.n_expert) + " into equal groups");
  g.kept = w.hp_int("expert_group_used_count", g.groups);
  if (g.kept < 1 || g.kept > g.groups)
    w.refuse("expert_group_used_count", std::to_string(g.kept), "must be 1 .. expert_group_count " + std::to_string(g.groups));
  if (g.kept * (i.n_expert / g.groups) < i.n_expert_used)
    w.refuse("expert_group_used_count", std::to_string(g.kept),
             "leaves fewer experts than expert_used_count " + std::to_string(i.n_expert_used));
  return g;
}

int32_t read_sliding_window(const WeightSource& w, int64_t fallback) {
  const int64_t window = w.hp_size("attention.sliding_window", fallback);
  if (window > INT32_MAX) w.refuse("attention.sliding_window", std::to_string(window), "exceeds 2^31 - 1");
  return int32_t(window);
}

static std::string shape_str(const int64_t* ne, size_t n) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < n; ++i) s << (i ? ", " : "") << ne[i];
  s << ']';
  return s.str();
}

void WeightSource::load(Tensor& into, const std::string& name, std::initializer_list<int64_t> shape) {
  into = require(name, shape);
  weights_.push_back(&into);
}

void WeightSource::load_f32(Tensor& into, const std::string& name, std::initializer_list<int64_t> shape) {
  load(into, name, shape);
  if (into.type != DType::F32) throw Error(arch() + ": tensor '" + desc_.origin_of(name) + "' must be F32");
}

void WeightSource::tie(Tensor& into, const Tensor& from) {
  into = from;
  weights_.push_back(&into);
}

Tensor WeightSource::require(const std::string& name, std::initializer_list<int64_t> shape) const {
  const TensorInfo* ti = find(name);
  if (!ti) throw Error("model is missing tensor '" + desc_.origin_of(name) + "'");
  bool ok = ti->ne.size() == shape.size();
  if (ok) {
    size_t i = 0;
    for (int64_t d : shape) ok = ok && ti->ne[i++] == d;
  }
  if (!ok)
    throw Error("tensor '" + desc_.origin_of(name) + "' has shape " + shape_str(ti->ne.data(), ti->ne.size()) +
                ", expected " + shape_str(shape.begin(), shape.size()));
  Tensor t = ti->view();
  t.name = name;
  return t;
}

}  // namespace tessera::models
