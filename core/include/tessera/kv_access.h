// KvAccess: what a kernel sees of the KV cache a node works on (Node::kv): the C
// plugin ABI's TesseraKv with KvCache's calls. Header-only, so it compiles into the
// plugin; every call goes through the host's function table. The host's KvCache
// (kv/, above the core) is a KvAccess, so host code hands `&kv_cache` to a node
// unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/error.h"
#include "tessera/plugin_abi.h"

namespace tessera {

struct KvAccess : TesseraKv {
  using SeqId = int32_t;

  const TesseraKvInfo& config() const { return info; }
  const TesseraRecurrentInfo& recurrent_config() const { return recurrent; }
  bool has_recurrent() const { return recurrent.n_layers > 0; }
  size_t row_elems() const { return size_t(info.n_kv_heads) * size_t(info.head_dim); }

  // F16 row (n_kv_heads * head_dim) of K or V at a reserved position.
  uint16_t* k_row(int layer, SeqId seq, int64_t pos) const { return row(layer, seq, 0, pos); }
  uint16_t* v_row(int layer, SeqId seq, int64_t pos) const { return row(layer, seq, 1, pos); }
  // Rows of positions [first, first + count) of K (kv = 0) or V (kv = 1).
  void rows(int layer, SeqId seq, int kv, int64_t first, int64_t count, const uint16_t** out) const {
    if (api->rows(this, layer, seq, kv, first, count, out) != 0)
      throw Error("KV cache: positions " + std::to_string(first) + ".." + std::to_string(first + count) +
                  " of sequence " + std::to_string(seq) + " are not reserved");
  }
  float* conv_state(int layer, SeqId seq) const { return state(api->conv_state(this, layer, seq), layer, seq); }
  float* recurrent_state(int layer, SeqId seq) const {
    return state(api->recurrent_state(this, layer, seq), layer, seq);
  }
  bool has_sequence(SeqId seq) const { return api->has_sequence(this, seq) != 0; }
  int64_t length(SeqId seq) const { return api->length(this, seq); }
  int64_t reserved(SeqId seq) const { return api->reserved(this, seq); }

 private:
  uint16_t* row(int layer, SeqId seq, int which, int64_t pos) const {
    uint16_t* r = api->row(this, layer, seq, which, pos);
    if (!r)
      throw Error("KV cache: no row for layer " + std::to_string(layer) + ", sequence " + std::to_string(seq) +
                  ", position " + std::to_string(pos));
    return r;
  }
  static float* state(float* p, int layer, SeqId seq) {
    if (!p)
      throw Error("KV cache: no recurrent state for layer " + std::to_string(layer) + ", sequence " +
                  std::to_string(seq));
    return p;
  }
};

}  // namespace tessera
