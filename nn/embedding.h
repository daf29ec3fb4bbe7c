// Embedding layer: a (num_embeddings, dim) table looked up by integer ids, as
// torch.nn.Embedding (GPT-2's wte / wpe, T5's shared).
//
// The lookup returns rows in the dtype of the weight's value (f32, or bf16
// under a mixed-precision policy). The backward scatter-adds the gradient rows
// into the fp32 weight gradient (deterministically); ids get no gradient.
#ifndef NN_EMBEDDING_H_
#define NN_EMBEDDING_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

struct EmbeddingOptions {
  InitSpec weight_init = InitSpec::Normal(0.0f, 0.02f);  // minGPT's init
  // The owner makes the ids itself and guarantees [0, num_embeddings) (e.g.
  // positions 0..T-1 after checking T against the table): a GPU skips the id
  // check's kernels (the CPU checks anyway).
  bool owner_checks_ids = false;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options = {});

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t dim() const { return dim_; }
  Parameter* weight() { return weight_; }

 protected:
  // inputs[0]: ids (...) i32 or i64 -> (..., dim) in the weight's dtype.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., dim) any floating dtype -> {undefined}; accumulates weight.grad.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor ids;  // (...) the caller's ids (no copy)
  };
  const int64_t num_embeddings_;
  const int64_t dim_;
  const bool owner_checks_ids_;
  Parameter* weight_;  // (num_embeddings, dim)
};

}  // namespace nn

#endif  // NN_EMBEDDING_H_
