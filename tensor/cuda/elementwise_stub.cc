// Builds without --config=cuda: the elementwise kernels fail with a clear message.
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void Binary(BinaryOp, const Tensor&, const Tensor&, const Tensor& out) { NotBuilt("binary", out); }
void Scale(const Tensor& x, float, const Tensor&) { NotBuilt("scale", x); }
void Axpy(float, const Tensor& x, const Tensor&) { NotBuilt("axpy", x); }
void BiasGelu(const Tensor& x, const Tensor&, const Tensor&) { NotBuilt("gelu", x); }
void BiasGeluBackward(const Tensor&, const Tensor& x, const Tensor&, const Tensor&) {
  NotBuilt("gelu_backward", x);
}
void SumAs(const std::vector<Tensor>&, const Tensor& out) { NotBuilt("sum_as", out); }
void Relu(const Tensor& x, const Tensor&) { NotBuilt("relu", x); }
void ReluBackward(const Tensor&, const Tensor& x, const Tensor&) { NotBuilt("relu_backward", x); }

}  // namespace cuda
}  // namespace tensor
