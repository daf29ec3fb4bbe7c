// cuDNN's fused attention as another engine for the flash attention entry points
// (attention.h): the causal scaled-dot-product graphs that cuDNN's runtime fusion
// compiles into one flash-attention kernel each way (its "SDPA_FWD" / "SDPA_BWD"
// patterns), built with the backend API (cudnn_graph.h; no cudnn-frontend here):
//
//   forward:  S = scale * q k^T, masked causal (row >= column), softmax with its
//             statistics lse = max + log(sum exp) (natural log, as our kernels
//             write it), out = P v
//   backward: delta = rowsum(dO * out); P = exp(scale q k^T - lse) masked;
//             dv = P^T dO; dS = P * (dO v^T - delta) * scale; dk = dS^T q;
//             dq = dS k (summed in an f32 accumulator with atomics: not bitwise
//             reproducible, as PyTorch's cuDNN and flash backwards)
//
// The graphs are the ones PyTorch 2.11's cudnn-frontend 1.18 builds for
// scaled_dot_product_attention(is_causal=True) on cuDNN 9.19 (read from cuDNN's
// API log on an H200), node for node and tensor for tensor. lse means the same
// here as in our kernels, so either forward pairs with either backward.
//
// What cuDNN takes here: bf16 / f16, D in {64, 128}, T_q == T_k > 1, causal, no
// dropout or score terms, every stride but D's a multiple of 8 elements and
// the pointers 16-byte aligned (the fused qkv projection's views are), on a
// cuDNN the frontend would use for it (CudnnSdpaVersionDecline). Plans
// are built once per shape, strides and thread (the handle is per device and
// thread, as cuBLASLt's), and a shape cuDNN has no plan for is remembered.
// Only --config=cuda builds link cuDNN; the emulation (--config=cuda_emu) has
// none, so CudnnAttentionBuilt() is false there and every call returns false.
#ifndef TENSOR_CUDA_ATTENTION_CUDNN_H_
#define TENSOR_CUDA_ATTENTION_CUDNN_H_

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Whether this build links cuDNN's attention (false under the emulation).
bool CudnnAttentionBuilt();

// The loaded cuDNN's version as cudnnGetVersion() gives it (91900 for
// 9.19.0); 0 in a build without cuDNN.
int64_t CudnnRuntimeVersion();

// Why the cuDNN library loaded at run time (`version` as cudnnGetVersion()
// gives it: 91900 for 9.19.0) cannot run these graphs for sequences of length
// t, as cudnn-frontend declines them; "" when it can. 9.10.0 and 9.10.1 have
// known SDPA bugs; no version takes t = 1 backward (s_q = s_kv = 1); and up to
// 9.15 the backward needs a padding mask (these graphs have none) when t is
// not a multiple of 128. CudnnAttentionEligible declines for all three.
inline std::string CudnnSdpaVersionDecline(int64_t version, int64_t t) {
  const std::string v = std::to_string(version / 10000) + "." +
                        std::to_string(version / 100 % 100) + "." + std::to_string(version % 100);
  if (version == 91000 || version == 91001) {
    return "cuDNN " + v + " (known SDPA bugs: 9.10.2 or newer)";
  }
  if (t == 1) return "T 1 (cuDNN's SDPA backward takes no s_q = s_kv = 1)";
  if (version <= 91500 && t % 128 != 0) {
    return "T " + std::to_string(t) + " not a multiple of 128 on cuDNN " + v +
           " (up to 9.15 its backward needs a padding mask there)";
  }
  return "";
}

// Whether the tensors fit what cuDNN takes here (above); *why names what
// does not. No cuDNN call but CudnnRuntimeVersion().
bool CudnnAttentionEligible(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                            std::string* why);

// The forward on q's device and ComputeStream(): out (B, H, T, D) (unit stride
// in D, other strides multiples of 8) and lse (B, H, T) f32 contiguous, as
// FlashAttentionForward takes them. Returns false, writing nothing, where
// cuDNN cannot take the tensors or has no plan for them (*why says which);
// inputs are checked by the caller (FlashAttentionForward).
bool CudnnAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                           bool causal, const Tensor& out, const Tensor& lse, std::string* why);

// The backward: dq, dk, dv like q, k, v (strided as FlashAttentionBackward
// allows, multiples of 8). Allocates delta (B, H, T) f32, the (B, H, T, D) f32
// dq accumulator and cuDNN's workspace. False as the forward.
bool CudnnAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, float scale, bool causal,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            std::string* why);

// The forward's and backward's tensor and operation descriptors for these
// tensors, each made and finalized by cuDNN on the host (no device, handle,
// operation graph or plan): "" when all finalize, else which one failed and
// cuDNN's words. What a build without a GPU can check of the graphs.
std::string CudnnAttentionCheckDescriptors(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& grad_out,
                                           const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ATTENTION_CUDNN_H_
