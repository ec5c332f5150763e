// How a model's forward graph reads each of its weights: which are matrix-product
// operands, GetRows tables, or read some other way. Only the graph knows (a norm or a
// delta-net kernel has the same kind of name and shape as a matrix), so a one-token
// forward step is built, not run, over a scratch KV cache and its nodes are read.
#pragma once
#include <vector>

namespace tessera {
class Model;
struct Tensor;
}  // namespace tessera

namespace tessera::detail {

// One weight's storage and every Tensor of the model that views it (a tied output
// matrix is a second Tensor over the token embedding's data).
struct WeightGroup {
  std::vector<Tensor*> views;
  bool used = false;      // read by some node
  bool product = false;   // the whole tensor is MatMul's or MatMulId's weight operand
  bool table = false;     // the whole tensor is GetRows's table
  bool other = false;     // read any other way (another op or operand, a view or a
                          // reshape), or written
  bool matmul_id = false; // read by MatMulId (routed experts)
};

// The model's weights grouped by storage (those with data), each marked by how one
// forward step reads it. The marks stay true when the views are later pointed at a
// copy of the same layout (quantized or prepared): the graph reads the same Tensors.
std::vector<WeightGroup> weight_uses(Model& model);

// Same data, type, shape and strides.
bool same_layout(const Tensor& a, const Tensor& b);

}  // namespace tessera::detail
