// Builds without --config=cuda: the CUDA GEMM entry points fail with a clear
// message; the TF32 switch and the cache statistics still answer.
#include <atomic>

#include "tensor/cuda/matmul.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {
namespace {

std::atomic<bool> allow_tf32{false};
std::atomic<bool> fuse_epilogues{true};
std::atomic<bool> fuse_bias_grad{true};
std::atomic<bool> dgelu_bias_grad{false};

}  // namespace

void Gemm(const GemmArgs& args) {
  ThrowOpError("matmul", "CUDA support was not built into this binary; rebuild with --config=cuda ",
               "(tensor on cuda:", args.device, ")");
}
bool GemmWithEpilogue(const GemmArgs& args, const GemmEpilogueArgs&) {
  Gemm(args);  // throws: not built
  return false;
}
void SetMatmulFuseEpilogues(bool fuse) { fuse_epilogues.store(fuse); }
bool MatmulFuseEpilogues() { return fuse_epilogues.load(); }
void SetMatmulFuseBiasGrad(bool fuse) { fuse_bias_grad.store(fuse); }
bool MatmulFuseBiasGrad() { return fuse_bias_grad.load(); }
void SetMatmulDGeluBiasGrad(bool fuse) { dgelu_bias_grad.store(fuse); }
bool MatmulDGeluBiasGrad() { return dgelu_bias_grad.load(); }
void MatmulScale(const Tensor& out, float) { NotBuilt("matmul", out); }
void SetMatmulAllowTf32(bool allow) { allow_tf32.store(allow); }
bool MatmulAllowTf32() { return allow_tf32.load(); }
MatmulCacheStats GetMatmulCacheStats() { return {}; }

}  // namespace cuda
}  // namespace tensor
