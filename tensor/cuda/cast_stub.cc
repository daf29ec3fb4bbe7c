// Builds without --config=cuda: the fill kernel fails with a clear message.
#include "tensor/cuda/cast.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void Fill(const Tensor& t, double) { NotBuilt("fill", t); }

}  // namespace cuda
}  // namespace tensor
