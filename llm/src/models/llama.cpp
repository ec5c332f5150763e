// The dense pre-norm decoders: grouped-query attention, RoPE, SwiGLU feed-forward, and
// the token embedding reused as the output matrix when output.weight is absent (tied).
// - `llama` (also Mistral-style models): RoPE in normal (adjacent pairs) mode; Llama
//   3.1's frequency factors (rope_freqs.weight) when present; linear RoPE scaling.
// - `qwen2`: NeoX RoPE and biases added to the q, k and v products.
// - `qwen3`: NeoX RoPE and RMS norms on each query and key head before it (the dense
//   sibling of qwen3moe).
#include "models/architectures.h"
#include "models/decoder_blocks.h"

namespace tessera::models {
namespace {

// What distinguishes the dense architectures.
struct DenseSpec {
  int rope_mode;
  bool qk_norms;
  bool qkv_bias;
  float default_rms_eps;
};

struct LlamaLayer {
  AttentionWeights attn;
  Tensor ffn_norm, w_gate, w_up, w_down;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelDescription& desc, const DenseSpec& spec) {
    WeightSource w(desc, weights_);
    // Every size is checked against the tensor table before anything is sized from it
    // (model_loader_util.h).
    read_decoder_hparams(w, info_, {2048, spec.default_rms_eps, 10000.f});
    info_.n_ff = w.hp_size("feed_forward_length");
    if (auto type = w.hp_string("rope.scaling.type"); type && *type != "none") {
      if (*type != "linear")
        throw Error(w.arch() + ": rope scaling type '" + printable(*type) + "' is not supported");
      info_.rope_freq_scale = 1.f / w.hp_positive_float("rope.scaling.factor", 1.f);
    }

    // Llama's q/k rows come interleaved for adjacent-pair RoPE in GGUF files; a format
    // that keeps them in rotate-half order (Hugging Face's) says so, and the same
    // rotation is then applied to pairs (i, i + d/2): NeoX mode, no weights copied.
    rope_mode_ = w.hp_bool("rope.qk_rotate_half").value_or(false) ? kRopeNeox : spec.rope_mode;

    // Llama 3.1-style frequency factors: pair i's angle is divided by factor i.
    if (w.has("rope_freqs.weight")) w.load_f32(rope_freqs_, "rope_freqs.weight", {info_.rope_dims / 2});

    load_embedding(w, embd_, info_);
    const int64_t E = info_.n_embd, F = info_.n_ff;
    layers_.resize(size_t(info_.n_layer));
    for (int64_t l = 0; l < info_.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LlamaLayer& L = layers_[size_t(l)];
      load_attention(w, L.attn, p, info_, spec.qk_norms, spec.qkv_bias);
      w.load(L.ffn_norm, p + "ffn_norm.weight", {E});
      w.load(L.w_gate, p + "ffn_gate.weight", {E, F});
      w.load(L.w_up, p + "ffn_up.weight", {E, F});
      w.load(L.w_down, p + "ffn_down.weight", {F, E});
    }
  }

  int32_t build_forward(Graph& graph, KvCache& kv, const ForwardBatch& b) const override {
    GraphBuilder g(graph);
    auto [pos, x] = embed_batch(g, embd_, b);
    const int32_t factors = rope_freqs_.data ? g.input(rope_freqs_) : -1;
    const LayerSpan span = step_layers(b, info_.n_layer);
    for (int64_t l = span.first; l < span.end; ++l) {
      const LlamaLayer& L = layers_[size_t(l)];
      x = g.add(x, self_attention(g, L.attn, info_, kv, int(l), b, x, pos, rope_mode_, factors));
      int32_t h = g.rms_norm(x, g.input(L.ffn_norm), info_.rms_eps);
      // gate's product first, then up's: one statement per node keeps the graph's order
      // independent of the compiler's argument evaluation order (GCC built up first).
      const int32_t gate = g.matmul(g.input(L.w_gate), h);
      const int32_t up = g.matmul(g.input(L.w_up), h);
      int32_t ff = g.swiglu(gate, up);
      x = g.add(x, g.matmul(g.input(L.w_down), ff));
    }
    return output_logits(g, embd_, info_, x, b);
  }

 private:
  int rope_mode_ = kRopeNormal;
  Tensor rope_freqs_;  // empty unless the file has rope_freqs.weight
  EmbeddingWeights embd_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_llama(const ModelDescription& d) {
  return std::make_unique<LlamaModel>(d, DenseSpec{kRopeNormal, false, false, 1e-5f});
}
std::unique_ptr<Model> make_qwen2(const ModelDescription& d) {
  return std::make_unique<LlamaModel>(d, DenseSpec{kRopeNeox, false, true, 1e-6f});
}
std::unique_ptr<Model> make_qwen3(const ModelDescription& d) {
  return std::make_unique<LlamaModel>(d, DenseSpec{kRopeNeox, true, false, 1e-6f});
}

}  // namespace tessera::models
