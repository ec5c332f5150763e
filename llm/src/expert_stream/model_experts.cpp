#include "expert_stream/model_experts.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>

#include <sys/mman.h>
#include <unistd.h>

#include "tessera/error.h"
#include "tessera/quant.h"

namespace tessera::detail {

namespace {

// blk.N.ffn_{gate,up,down}_exps.weight -> N, else -1.
int expert_layer(const std::string& name) {
  static const std::regex re(R"(^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoi(m[1].str());
}

}  // namespace

bool is_routed_expert(const Tensor& w) { return expert_layer(w.name) >= 0; }

uint64_t load_expert_share(Model& model, int64_t first, int64_t end) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  uint64_t bytes = 0;
  volatile uint8_t sink = 0;
  for (const Tensor* w : model.weights()) {
    if (!is_routed_expert(*w) || !w->data || w->ne[2] < end) continue;
    const auto* base = static_cast<const uint8_t*>(w->data);
    const size_t from = size_t(first) * w->nb[2], to = size_t(end) * w->nb[2];
    const uintptr_t a = uintptr_t(base + from) & ~uintptr_t(page - 1);
    madvise(reinterpret_cast<void*>(a), size_t(uintptr_t(base + to) - a), MADV_WILLNEED);
    uint8_t acc = 0;
    for (size_t off = from; off < to; off += page) acc = uint8_t(acc + base[off]);
    sink = uint8_t(sink + acc);
    bytes += to - from;
  }
  (void)sink;
  return bytes;
}

ExpertBytes expert_bytes(Model& model) {
  ExpertBytes b;
  std::map<int, uint64_t> per_layer;
  for (const Tensor* w : model.weights()) {
    b.all += w->nbytes();
    if (const int l = expert_layer(w->name); l >= 0) {
      b.experts += w->nbytes();
      b.largest_layer = std::max(b.largest_layer, per_layer[l] += w->nbytes());
    }
  }
  return b;
}

std::unique_ptr<ExpertStream> stream_model_experts(const ModelFile& file, Model& model, uint64_t cache_bytes,
                                                   std::unordered_set<const Tensor*>& streamed) {
  std::vector<std::pair<Tensor*, int>> todo;
  for (Tensor* w : model.weights())
    if (const int l = expert_layer(w->name); l >= 0) todo.emplace_back(w, l);
  if (todo.empty()) return nullptr;
  // Streaming reads each expert batch as one range of the model file: GGUF keeps it so;
  // a checkpoint folder's experts are separate tensors across shards.
  if (file.format().rfind("gguf", 0) != 0)
    throw Error("expert streaming reads experts from GGUF files, and " + file.path() + " is " + file.format() +
                ": use --expert-cache off (keeps every expert in memory) or convert it to GGUF");
  auto stream = std::make_unique<ExpertStream>(file.path(), cache_bytes);
  for (auto [w, layer] : todo) {
    const TensorInfo* ti = file.find_tensor(w->name);
    if (!ti || ti->data != w->data)
      throw Error("expert streaming: tensor " + w->name + " is not read straight from the file");
    if (w->ne[3] != 1 || !w->is_contiguous())
      throw Error("expert streaming: tensor " + w->name + " is not a dense [K, N, experts] tensor");
    w->data = stream->add_tensor(w->name, layer, ti->file_offset, w->nb[2], w->ne[2]);
    streamed.insert(w);
  }
  return stream;
}

namespace {

// One layer's routed experts in a graph: where its first MatMulId is, the ids it
// reads, its input rows and the router that chose them.
struct RoutedLayer {
  int layer = -1;
  size_t node = 0;      // the first MatMulId reading this layer's streamed experts
  int32_t ids = -1;     // I32 [k, n]
  int32_t input = -1;   // F32 [n_embd, 1, n]: the normed hidden state the experts read
  Tensor router;        // [n_embd, n_expert] weight of the MatMul feeding the TopK, if found
};

std::vector<RoutedLayer> routed_layers(const Graph& graph, const ExpertStream& stream) {
  std::vector<RoutedLayer> out;
  std::map<int32_t, size_t> producer;  // tensor -> node writing it
  const auto& nodes = graph.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (n.dst >= 0) producer[n.dst] = k;
    if (n.op != Op::MatMulId) continue;
    const int layer = stream.layer_of(graph.tensor(n.src[0]).data);
    if (layer < 0 || (!out.empty() && out.back().ids == n.src[2])) continue;
    RoutedLayer r{layer, k, n.src[2], n.src[1], {}};
    // The router's product feeds the TopK directly, or through a softmax or sigmoid, a
    // bias (Add) and a choice of expert groups (GroupLimit); the prediction ranks by the
    // product alone (exact through the softmax or sigmoid; a prefetch may miss after a
    // bias or a group choice).
    if (auto top = producer.find(n.src[2]); top != producer.end() && nodes[top->second].op == Op::TopK) {
      int32_t t = nodes[top->second].src[0];
      for (int hop = 0; hop < 4; ++hop) {
        const auto p = producer.find(t);
        if (p == producer.end()) break;
        const Node& pn = nodes[p->second];
        if (pn.op == Op::MatMul) {
          r.router = graph.tensor(pn.src[0]);
          break;
        }
        if (pn.op != Op::Add && pn.op != Op::Sigmoid && pn.op != Op::Softmax && pn.op != Op::GroupLimit) break;
        t = pn.src[0];
      }
    }
    out.push_back(r);
  }
  return out;
}

// Router lookahead: the experts `router` would pick for each of the n rows of `x`
// (F32, K each), top `k` per row by the router's logits (the TopK's order: largest
// first, lowest id on ties), the union over rows.
std::vector<int32_t> predict(const Tensor& router, const std::vector<float>& x, int64_t K, int64_t n, int64_t k) {
  const int64_t E = router.ne[1];
  const DType vt = quant::vec_dot_type(router.type);
  std::vector<uint8_t> act(row_bytes(vt, K));
  std::vector<char> chosen(size_t(E), 0);
  std::vector<std::pair<float, int32_t>> score(static_cast<size_t>(E));
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data() + r * K;
    const void* a = xr;
    if (vt != DType::F32) {
      quant::quantize_row(vt, xr, act.data(), K);
      a = act.data();
    }
    for (int64_t e = 0; e < E; ++e)
      score[size_t(e)] = {quant::vec_dot(router.type, K, static_cast<const uint8_t*>(router.data) + e * router.nb[1], a),
                          int32_t(e)};
    const int64_t kk = std::min(k, E);
    std::partial_sort(score.begin(), score.begin() + kk, score.end(),
                      [](const auto& p, const auto& q) { return p.first > q.first || (p.first == q.first && p.second < q.second); });
    for (int64_t i = 0; i < kk; ++i) chosen[size_t(score[size_t(i)].second)] = 1;
  }
  std::vector<int32_t> ids;
  for (int64_t e = 0; e < E; ++e)
    if (chosen[size_t(e)]) ids.push_back(int32_t(e));
  return ids;
}

}  // namespace

void add_expert_hooks(Graph& graph, ExpertStream& stream) {
  const std::vector<RoutedLayer> layers = routed_layers(graph, stream);
  for (size_t i = 0; i < layers.size(); ++i) {
    const RoutedLayer& r = layers[i];
    const RoutedLayer* next = i + 1 < layers.size() && layers[i + 1].router.data ? &layers[i + 1] : nullptr;
    std::optional<RoutedLayer> ahead;
    if (next) ahead = *next;
    graph.add_host_hook(r.node, [&stream, r, ahead](Graph& g) {
      const Tensor& t = g.tensor(r.ids);
      if (t.type != DType::I32 || !t.is_contiguous()) throw Error("expert streaming: expert ids are not dense I32");
      stream.ensure(r.layer, std::span<const int32_t>(static_cast<const int32_t*>(t.data), size_t(t.nelements())));
      if (!ahead) return;
      // The next layer's router applied to this layer's input predicts its experts
      // (hidden states change little from one layer to the next); they are read on
      // the stream's thread while this layer computes.
      const Tensor& x = g.tensor(r.input);
      const int64_t K = x.ne[0], n = x.nelements() / K;
      if (x.type != DType::F32 || !x.is_contiguous() || ahead->router.ne[0] != K) return;
      std::vector<float> rows(static_cast<const float*>(x.data), static_cast<const float*>(x.data) + n * K);
      const int64_t k = t.ne[0];
      stream.run_async([ahead, rows = std::move(rows), K, n, k](ExpertStream& s) {
        const std::vector<int32_t> ids = predict(ahead->router, rows, K, n, k);
        s.prefetch(ahead->layer, ids);
      });
    });
  }
}

}  // namespace tessera::detail
