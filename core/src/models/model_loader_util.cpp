#include "models/model_loader_util.h"

#include <sstream>

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

int64_t WeightSource::hp_int(const std::string& suffix) const {
  return md().require_int(arch_ + "." + suffix);
}

int64_t WeightSource::hp_int(const std::string& suffix, int64_t fallback) const {
  return md().get_int(arch_ + "." + suffix).value_or(fallback);
}

float WeightSource::hp_float(const std::string& suffix, float fallback) const {
  return float(md().get_float(arch_ + "." + suffix).value_or(fallback));
}

static std::string shape_str(const int64_t* ne, size_t n) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < n; ++i) s << (i ? ", " : "") << ne[i];
  s << ']';
  return s.str();
}

Tensor WeightSource::require(const std::string& name, std::initializer_list<int64_t> shape) const {
  const TensorInfo* ti = file_.find_tensor(name);
  if (!ti) throw Error("model is missing tensor '" + name + "'");
  bool ok = ti->ne.size() == shape.size();
  if (ok) {
    size_t i = 0;
    for (int64_t d : shape) ok = ok && ti->ne[i++] == d;
  }
  if (!ok)
    throw Error("tensor '" + name + "' has shape " + shape_str(ti->ne.data(), ti->ne.size()) +
                ", expected " + shape_str(shape.begin(), shape.size()));
  Tensor t = ti->view();
  t.name = name;
  return t;
}

}  // namespace tessera::models
