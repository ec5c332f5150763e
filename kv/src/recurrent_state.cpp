#include "tessera/recurrent_state.h"

#include <algorithm>
#include <string>

#include "tessera/error.h"

namespace tessera {

RecurrentState::RecurrentState(const RecurrentStateConfig& cfg) : cfg_(cfg) {
  if (cfg.n_layers < 0 || cfg.conv_elems < 0 || cfg.state_elems < 0)
    throw Error("RecurrentState: negative layer count or state size");
  if (cfg.n_layers > 0 && cfg.conv_elems + cfg.state_elems == 0)
    throw Error("RecurrentState: recurrent layers with no state");
  per_layer_ = size_t(cfg.conv_elems + cfg.state_elems);
}

std::vector<float>& RecurrentState::slot(int32_t seq, int layer) {
  if (seq < 0 || size_t(seq) >= slots_.size() || !slots_[size_t(seq)])
    throw Error("RecurrentState: unknown sequence id " + std::to_string(seq));
  if (layer < 0 || layer >= cfg_.n_layers)
    throw Error("RecurrentState: recurrent layer " + std::to_string(layer) + " outside [0, " +
                std::to_string(cfg_.n_layers) + ")");
  return *slots_[size_t(seq)];
}

void RecurrentState::create(int32_t seq) {
  if (empty()) return;
  if (seq < 0) throw Error("RecurrentState: negative sequence id");
  if (size_t(seq) >= slots_.size()) slots_.resize(size_t(seq) + 1);
  slots_[size_t(seq)] = std::make_unique<std::vector<float>>(per_layer_ * size_t(cfg_.n_layers), 0.0f);
}

void RecurrentState::copy(int32_t from, int32_t to) {
  if (empty()) return;
  std::vector<float>& src = slot(from, 0);
  slot(to, 0) = src;
}

void RecurrentState::reset(int32_t seq) {
  if (empty()) return;
  std::vector<float>& s = slot(seq, 0);
  std::fill(s.begin(), s.end(), 0.0f);
}

void RecurrentState::free(int32_t seq) {
  if (empty() || seq < 0 || size_t(seq) >= slots_.size()) return;
  slots_[size_t(seq)].reset();
}

float* RecurrentState::conv(int layer, int32_t seq) {
  return slot(seq, layer).data() + size_t(layer) * per_layer_;
}

float* RecurrentState::state(int layer, int32_t seq) {
  return slot(seq, layer).data() + size_t(layer) * per_layer_ + size_t(cfg_.conv_elems);
}

}  // namespace tessera
