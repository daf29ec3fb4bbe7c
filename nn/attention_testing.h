// Test-only references for the attention layers: plain loops over every
// batch, head, query and key, in double, with none of the layers' views,
// batched GEMMs or in-place tricks.
#ifndef NN_ATTENTION_TESTING_H_
#define NN_ATTENTION_TESTING_H_

#include "tensor/tensor.h"

namespace nn {
namespace testing {

// softmax(scale * q k^T + bias, masked) @ v for q (B, nh, T_q, hs), k (B, nh,
// T_k, hs), v (B, nh, T_k, hs_v), bias undefined or (B or 1, nh, T_q, T_k),
// key_mask undefined or (B, T_k) (0 masks). causal: query i sees keys
// j <= i + T_k - T_q. Rows with no visible key give 0. Returns (B, nh, T_q, hs_v) f32.
tensor::Tensor NaiveAttention(const tensor::Tensor& q, const tensor::Tensor& k,
                              const tensor::Tensor& v, const tensor::Tensor& bias,
                              const tensor::Tensor& key_mask, double scale, bool causal);

// x (..., in) @ w^T (w (out, in)) + b (out, or undefined) -> (..., out) f32.
tensor::Tensor NaiveLinear(const tensor::Tensor& x, const tensor::Tensor& w,
                           const tensor::Tensor& b);

// (B, T, nh * hs) -> (B, nh, T, hs) and back, as contiguous f32 copies.
tensor::Tensor NaiveSplitHeads(const tensor::Tensor& x, int64_t n_heads);
tensor::Tensor NaiveMergeHeads(const tensor::Tensor& x);

}  // namespace testing
}  // namespace nn

#endif  // NN_ATTENTION_TESTING_H_
