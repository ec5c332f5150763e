// Test-only backend plugin, in C ABI terms only: supports Op::Add on contiguous F32
// tensors and nothing else. create() fails on purpose when given the option fail=1,
// echoing every option it received (so tests can check what plugins.toml and
// overrides passed); fusion_window=N makes it declare that window.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "test_plugin_util.h"

#ifndef TEST_PLUGIN_NAME
#define TEST_PLUGIN_NAME "test_good"
#endif
#ifndef TEST_PLUGIN_FLAGS
#define TEST_PLUGIN_FLAGS 0u
#endif
#ifndef TEST_PLUGIN_SCORE
#define TEST_PLUGIN_SCORE 5
#endif

namespace {

using test_plugin::dense_f32;
using test_plugin::nelements;
using test_plugin::put;

struct Instance {
  int32_t fusion_window = 1;
};

int32_t probe(char* reason, size_t size) {
  put(reason, size, "always works");
  return TEST_PLUGIN_SCORE;
}

void* create(const TesseraCreateArgs* args, char* error, size_t error_size) {
  try {
    std::string opts;
    bool fail = false;
    int32_t window = 1;
    const size_t n = TESSERA_HAS_FIELD(args, TesseraCreateArgs, option_count) ? args->option_count : 0;
    for (size_t i = 0; i < n; ++i) {
      if (!opts.empty()) opts += ", ";
      opts += std::string(args->options[i].key) + "=" + args->options[i].value;
      if (std::strcmp(args->options[i].key, "fail") == 0 && std::strcmp(args->options[i].value, "1") == 0) fail = true;
      if (std::strcmp(args->options[i].key, "fusion_window") == 0) window = int32_t(std::atoi(args->options[i].value));
    }
    if (fail) {
      put(error, error_size, ("asked to fail (options: " + opts + ")").c_str());
      return nullptr;
    }
    auto* instance = new Instance();
    instance->fusion_window = window;
    return instance;
  } catch (const std::exception& e) {
    put(error, error_size, e.what());
    return nullptr;
  }
}

void destroy(void* self) { delete static_cast<Instance*>(self); }

int32_t uses_host_memory(void*) { return 1; }

int32_t fusion_window(void* self) { return static_cast<Instance*>(self)->fusion_window; }

int32_t supports(void*, const TesseraGraph* g, size_t node, char* reason, size_t size) {
  const TesseraNode& n = g->nodes[node];
  if (n.op != TESSERA_OP_ADD) {
    put(reason, size, "only add");
    return 0;
  }
  for (int32_t t : {n.dst, n.src[0], n.src[1]}) {
    if (t < 0) {
      put(reason, size, "add needs two sources and a destination");
      return 0;
    }
    if (g->tensors[t].type != TESSERA_DTYPE_F32) {
      put(reason, size, "only f32");
      return 0;
    }
    if (!dense_f32(g->tensors[t])) {
      put(reason, size, "only contiguous");
      return 0;
    }
  }
  if (nelements(g->tensors[n.src[0]]) != nelements(g->tensors[n.dst]) ||
      nelements(g->tensors[n.src[1]]) != nelements(g->tensors[n.dst])) {
    put(reason, size, "shapes differ");
    return 0;
  }
  return 1;
}

int32_t execute(void*, TesseraGraph* g, size_t first, size_t count, uint32_t, char*, size_t) {
  test_plugin::run_add_mul(g, first, count);
  return 0;
}

const TesseraBackendApi kApi = {
    sizeof(TesseraBackendApi), uses_host_memory, supports, execute, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    nullptr, nullptr, fusion_window,
};

const TesseraPluginDescriptor kDescriptor = {
    TESSERA_PLUGIN_ABI_VERSION, sizeof(TesseraPluginDescriptor), TEST_PLUGIN_NAME, TESSERA_PLUGIN_BACKEND,
    "test-only: f32 add", probe, create, destroy, &kApi, nullptr, TEST_PLUGIN_FLAGS,
};

}  // namespace

TESSERA_DEFINE_PLUGIN(kDescriptor)
