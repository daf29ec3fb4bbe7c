// Reductions and their backward passes: sum, mean and max over one dimension
// (keepdim as in PyTorch) or over all elements; ReduceToShape, the backward of
// broadcasting; sums of squares and the global L2 norm for gradient clipping.
//
// Sums accumulate in double in blocks whose size depends only on the shape,
// added in a fixed order, so long sums are accurate and results do not depend
// on the thread count. Floating dtypes only; outputs have the input's dtype.
// Inputs may be strided views (they are made contiguous first).
#ifndef TENSOR_OPS_REDUCE_H_
#define TENSOR_OPS_REDUCE_H_

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace tensor {

// ---- Over one dimension (negative dims count from the end) ----
// x (d0..dn) -> (d0..dn without dim), or with dim kept as 1 when keepdim.
Tensor Sum(const Tensor& x, int dim, bool keepdim = false);
Tensor Mean(const Tensor& x, int dim, bool keepdim = false);

struct MaxResult {
  Tensor values;   // the maxima, x's dtype
  Tensor indices;  // i64, same shape: the first index of the max (NaN counts as largest)
};
MaxResult MaxWithIndices(const Tensor& x, int dim, bool keepdim = false);
Tensor Max(const Tensor& x, int dim, bool keepdim = false);

// Backward passes: grad_out has the forward output's shape; the result has
// input_shape and grad_out's dtype.
Tensor SumBackward(const Tensor& grad_out, const Shape& input_shape, int dim, bool keepdim = false);
Tensor MeanBackward(const Tensor& grad_out, const Shape& input_shape, int dim,
                    bool keepdim = false);
// The gradient goes to the argmax (indices from MaxWithIndices); 0 elsewhere.
Tensor MaxBackward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape, int dim,
                   bool keepdim = false);

// ---- Over all elements: results have shape () ----
Tensor SumAll(const Tensor& x);
Tensor MeanAll(const Tensor& x);
// values: the max, indices: its flat (row-major) index, first on ties.
MaxResult MaxAllWithIndex(const Tensor& x);
Tensor MaxAll(const Tensor& x);

Tensor SumAllBackward(const Tensor& grad_out, const Shape& input_shape);
Tensor MeanAllBackward(const Tensor& grad_out, const Shape& input_shape);
Tensor MaxAllBackward(const Tensor& grad_out, const Tensor& index, const Shape& input_shape);

// ---- Undoing a broadcast ----
// Sums x over the dims along which `shape` was broadcast to x's shape (leading
// dims that shape lacks, and dims where shape has 1): the gradient of a
// broadcast operand. Returns x itself when shape equals x's shape.
Tensor ReduceToShape(const Tensor& x, const Shape& shape);
// The same into a contiguous `out` of that shape, added to it when accumulate.
// out may be f32 while x is bf16/f16.
void ReduceToShapeInto(const Tensor& x, const Tensor& out, bool accumulate);

// ---- Norms ----
// sum(x^2) over all elements, in double.
double SumSquares(const Tensor& x);
// sqrt of the sum of SumSquares over `tensors` (the global gradient norm);
// inf or NaN when an element is.
double L2Norm(absl::Span<const Tensor> tensors);

}  // namespace tensor

#endif  // TENSOR_OPS_REDUCE_H_
