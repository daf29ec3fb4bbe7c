// Ops that move or convert elements without arithmetic, with their backward
// passes: dtype casts, concatenation and splitting along a dimension (each
// the other's backward), contiguous copies of views and the backward of a
// Narrow view. They work for every dtype (f32, f16, bf16, i32, i64, u8).
#ifndef TENSOR_OPS_SHAPE_OPS_H_
#define TENSOR_OPS_SHAPE_OPS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace tensor {

// x converted to `dtype` (x itself when it already has it; see Tensor::To).
Tensor Cast(const Tensor& x, Dtype dtype);
// The gradient of Cast: grad_out cast back to the input's dtype.
Tensor CastBackward(const Tensor& grad_out, Dtype input_dtype);

// tensors (one dtype, one rank, equal sizes except along dim) joined along
// dim into a new contiguous tensor: (.., n0, ..) + (.., n1, ..) -> (.., n0+n1, ..).
Tensor Concat(absl::Span<const Tensor> tensors, int dim);
// The gradient of Concat: grad_out split back into pieces of `sizes` along dim.
std::vector<Tensor> ConcatBackward(const Tensor& grad_out, absl::Span<const int64_t> sizes,
                                   int dim);

// x cut along dim into new contiguous tensors of sizes[0], sizes[1], ... (the
// sizes must add up to x.dim(dim)). For views without a copy use Tensor::Narrow.
std::vector<Tensor> Split(const Tensor& x, absl::Span<const int64_t> sizes, int dim);
// The gradient of Split: the pieces' gradients concatenated along dim. An
// undefined gradient (a piece that was not used) counts as zeros; its size
// along dim is taken from `sizes`, the other dims from input_shape.
Tensor SplitBackward(absl::Span<const Tensor> grads, const Shape& input_shape,
                     absl::Span<const int64_t> sizes, int dim);

// A new contiguous copy of x (always copies, even when x is contiguous). Its
// gradient is the identity: grad_out flows to x unchanged.
Tensor ContiguousCopy(const Tensor& x);

// The gradient of x.Narrow(dim, start, length) for x of input_shape: zeros
// with grad_out placed at [start, start + length) along dim.
Tensor NarrowBackward(const Tensor& grad_out, const Shape& input_shape, int dim, int64_t start);

}  // namespace tensor

#endif  // TENSOR_OPS_SHAPE_OPS_H_
