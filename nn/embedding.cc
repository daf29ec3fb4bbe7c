// Embedding layer forward and backward.
#include "nn/embedding.h"

#include "tensor/error.h"
#include "tensor/ops/embedding.h"

namespace nn {

using tensor::Dtype;

Embedding::Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options)
    : Module("Embedding"),
      num_embeddings_(num_embeddings),
      dim_(dim),
      owner_checks_ids_(options.owner_checks_ids) {
  OP_CHECK(num_embeddings > 0 && dim > 0, "embedding", "num_embeddings and dim must be > 0; got (",
           num_embeddings, ",", dim, ")");
  weight_ = RegisterParameter("weight", {num_embeddings_, dim_}, options.weight_init,
                              /*weight_decay=*/false);
}

Tensors Embedding::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& ids = inputs.at(0);
  const Tensor& w = weight_->value;
  OP_CHECK(w.defined(), "embedding", "weight is not materialized");
  OP_CHECK(ids.defined() && (ids.dtype() == Dtype::kI32 || ids.dtype() == Dtype::kI64), "embedding",
           "ids must be i32 or i64; got ", ids.defined() ? ids.shape().ToString() : "undefined",
           " ", ids.defined() ? tensor::DtypeName(ids.dtype()) : "");
  // Out-of-range ids throw "[embedding] ..." naming id and position: from the
  // op on the CPU, at the host's next wait on a GPU (unless the owner checked
  // them).
  Tensor y = tensor::Embedding(w, ids, /*ids_checked=*/owner_checks_ids_);  // (..., dim)
  ctx.Save(Saved{ids});
  return {y};
}

Tensors Embedding::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  // f32 (V, dim) += rows of grad (..., dim), in any floating dtype (a frozen
  // table: nothing). Forward checked these ids against V: a GPU does not
  // check them again.
  if (weight_->requires_grad) {
    tensor::EmbeddingBackwardAccumulate(grad_outputs.at(0), s.ids, weight_->GradBuffer(),
                                        /*ids_checked=*/true);
  }
  return {Tensor()};
}

}  // namespace nn
