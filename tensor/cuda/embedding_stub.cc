// Builds without --config=cuda: the embedding kernels fail with a clear message.
#include "tensor/cuda/embedding.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void CheckIdsDeferred(const char* op, const Tensor& ids, int64_t,
                      std::function<std::string(int64_t, int64_t)>) {
  NotBuilt(op, ids);
}
void EmbeddingForward(const Tensor& weight, const Tensor&, const Tensor&) {
  NotBuilt("embedding", weight);
}
void EmbeddingBackward(const Tensor& grad_out, const Tensor&, const Tensor&, bool) {
  NotBuilt("embedding_backward", grad_out);
}

}  // namespace cuda
}  // namespace tensor
