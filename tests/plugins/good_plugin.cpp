// Test-only backend plugin: supports Op::Add on contiguous F32 tensors and nothing
// else. create() fails on purpose when given the option fail=1, echoing every
// option it received (so tests can check what plugins.toml and overrides passed).
#include <cstdio>
#include <cstring>
#include <string>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/plugin_abi.h"

#ifndef TEST_PLUGIN_NAME
#define TEST_PLUGIN_NAME "test_good"
#endif
#ifndef TEST_PLUGIN_SCORE
#define TEST_PLUGIN_SCORE 5
#endif

namespace {

using namespace tessera;

class AddBackend final : public Backend {
 public:
  std::string name() const override { return TEST_PLUGIN_NAME; }

  OpSupport supports(const Graph& g, const Node& n) const override {
    if (n.op != Op::Add) return OpSupport::no("only add");
    for (int32_t t : {n.dst, n.src[0], n.src[1]}) {
      if (t < 0) return OpSupport::no("add needs two sources and a destination");
      if (g.tensor(t).type != DType::F32) return OpSupport::no("only f32");
      if (!g.tensor(t).is_contiguous()) return OpSupport::no("only contiguous");
    }
    if (g.tensor(n.src[0]).nelements() != g.tensor(n.dst).nelements() ||
        g.tensor(n.src[1]).nelements() != g.tensor(n.dst).nelements())
      return OpSupport::no("shapes differ");
    return OpSupport::yes();
  }

  void execute(Graph& g, size_t first, size_t count) override {
    for (size_t k = first; k < first + count; ++k) {
      const Node& n = g.nodes()[k];
      const float* a = static_cast<const float*>(g.tensor(n.src[0]).data);
      const float* b = static_cast<const float*>(g.tensor(n.src[1]).data);
      float* d = static_cast<float*>(g.tensor(n.dst).data);
      const int64_t ne = g.tensor(n.dst).nelements();
      for (int64_t i = 0; i < ne; ++i) d[i] = a[i] + b[i];
    }
  }
};

int32_t probe(char* reason, size_t size) {
  std::snprintf(reason, size, "always works");
  return TEST_PLUGIN_SCORE;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  std::string opts;
  bool fail = false;
  for (size_t i = 0; i < args->option_count; ++i) {
    if (!opts.empty()) opts += ", ";
    opts += std::string(args->options[i].key) + "=" + args->options[i].value;
    if (std::strcmp(args->options[i].key, "fail") == 0 && std::strcmp(args->options[i].value, "1") == 0) fail = true;
  }
  if (fail) {
    std::snprintf(error, error_size, "asked to fail (options: %s)", opts.c_str());
    return nullptr;
  }
  return static_cast<Backend*>(new AddBackend());
}

void destroy(void* instance) { delete static_cast<Backend*>(instance); }

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, sizeof(TesseraPluginDescriptor), TEST_PLUGIN_NAME, TESSERA_PLUGIN_BACKEND,
    "test-only: f32 add", probe, create, destroy,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
