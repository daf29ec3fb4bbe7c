// What the fused attention tests share: a case's shape, a plain-loop
// reference in double (output, logsumexp, dq, dk, dv and dS, with an optional
// bias and key padding mask), GPU inputs viewed as heads of a projection,
// and one case run through our kernels and compared. Used by attention_test
// (our kernels) and attention_cudnn_test (cuDNN's, and the two crossed).
#ifndef TENSOR_CUDA_ATTENTION_TESTING_H_
#define TENSOR_CUDA_ATTENTION_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda/attention.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {
namespace attention_testing {

struct Case {
  int64_t b, h, t_q, t_k, d;
  bool causal;
};

// "B2 H3 Tq17 Tk17 D64 causal bf16 tensor-core", for traces.
std::string Name(const Case& c, Dtype dt, FlashAttentionKernel k);

// Plain loops in double over (B*H, T, D) row-major vectors.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<double> dscores;  // (B*H, T_q, T_k): d loss / d (scale q k^T + bias)
};

// Score terms of the reference: bias (bias_batch (1 or B), H, T_q, T_k) and
// keep (B, T_k), each empty for none.
struct Terms {
  std::vector<float> bias;
  int64_t bias_batch = 1;
  std::vector<float> keep;
};

// The forward and backward of attention with loss = sum(out * dout).
Reference Compute(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const std::vector<float>& dout, double scale,
                  const Terms& terms = {});

// The relative tolerance of a dtype's results (the file comment of
// attention_test.cc derives them): bf16 2e-2, f16 5e-3, f32 1e-4.
double Tol(Dtype dt);

// A (B, H, T, D) view of a random GPU tensor in [-1, 1): heads of a (B, T, H,
// D) projection, or with `unaligned`, rows padded to D + 1 (no 16-byte loads).
Tensor GpuView(const Shape& bhtd, uint64_t seed, Dtype dt, bool unaligned);

// The kernels' results against the reference (lse is f32 whatever the dtype).
void ExpectNear(const Reference& ref, const Tensor& out, const Tensor& lse, const Tensor& dq,
                const Tensor& dk, const Tensor& dv, double tol);

// One case through FlashAttentionForward / Backward against the reference;
// scale 0: 1 / sqrt(D).
void RunCase(const Case& c, Dtype dt, FlashAttentionKernel kernel, bool unaligned = false,
             float scale = 0.0f);

}  // namespace attention_testing
}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ATTENTION_TESTING_H_
