// Shape ops: argument checks, then copies of rows of bytes between a whole
// tensor and its pieces along one dimension (parallel over the thread pool),
// which serves every dtype alike.
#include "tensor/ops/shape_ops.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/ops/check.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace {

int NormalizeDim(const char* op, const Shape& shape, int dim) {
  const int d = dim < 0 ? dim + shape.rank() : dim;
  OP_CHECK(d >= 0 && d < shape.rank(), op, "dim ", dim, " out of range for shape ",
           shape.ToString(), " (rank ", shape.rank(), ")");
  return d;
}

// Copies between contiguous `whole`, seen as (outer, whole.dim(d), inner),
// and contiguous pieces (outer, sizes[i], inner) that tile it along d: into
// whole when to_whole, else out of it. Undefined pieces are skipped.
void CopyPieces(const Tensor& whole, absl::Span<const Tensor> pieces,
                absl::Span<const int64_t> sizes, int d, bool to_whole) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= whole.dim(i);
  for (int i = d + 1; i < whole.rank(); ++i) inner *= whole.dim(i);
  const int64_t row_bytes = whole.dim(d) * inner * whole.element_size();
  if (outer == 0 || row_bytes == 0) return;
  char* base = static_cast<char*>(whole.raw_data());
  ParallelFor(outer, std::max<int64_t>(1, (int64_t{1} << 16) / row_bytes),
              [&](int64_t b, int64_t e) {
                for (int64_t o = b; o < e; ++o) {
                  char* row = base + o * row_bytes;
                  for (size_t i = 0; i < pieces.size(); ++i) {
                    const int64_t bytes = sizes[i] * inner * whole.element_size();
                    if (pieces[i].defined() && bytes > 0) {
                      char* piece = static_cast<char*>(pieces[i].raw_data()) + o * bytes;
                      if (to_whole) {
                        std::memcpy(row, piece, bytes);
                      } else {
                        std::memcpy(piece, row, bytes);
                      }
                    }
                    row += bytes;
                  }
                }
              });
}

// Whether every size is >= 0 and they add up to `whole` (no sum overflows).
bool SizesAddUpTo(absl::Span<const int64_t> sizes, int64_t whole) {
  int64_t left = whole;
  for (int64_t s : sizes) {
    if (s < 0 || s > left) return false;
    left -= s;
  }
  return left == 0;
}

// Cuts x along dim into contiguous copies of `sizes`.
std::vector<Tensor> SplitImpl(const char* op, const Tensor& x, absl::Span<const int64_t> sizes,
                              int dim) {
  CheckCpu(op, {&x});
  const int d = NormalizeDim(op, x.shape(), dim);
  OP_CHECK(SizesAddUpTo(sizes, x.dim(d)), op, "sizes (", absl::StrJoin(sizes, ","),
           ") must be >= 0 and add up to dim ", dim, " of ", Describe("x", x), ", which is ",
           x.dim(d));
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[d] = s;
    pieces.push_back(Tensor::Empty(shape, x.dtype()));
  }
  CopyPieces(x.Contiguous(), pieces, sizes, d, /*to_whole=*/false);
  return pieces;
}

}  // namespace

Tensor Cast(const Tensor& x, Dtype dtype) {
  OP_CHECK(x.defined(), "cast", "got an undefined tensor");
  return x.To(dtype);  // CUDA tensors: the backend's strided cast kernel
}

Tensor CastBackward(const Tensor& grad_out, Dtype input_dtype) {
  OP_CHECK(grad_out.defined(), "cast_backward", "got an undefined tensor");
  return grad_out.To(input_dtype);
}

Tensor Concat(absl::Span<const Tensor> tensors, int dim) {
  const char* op = "concat";
  OP_CHECK(!tensors.empty(), op, "needs at least one tensor");
  for (const Tensor& t : tensors) CheckCpu(op, {&t});
  const Tensor& first = tensors[0];
  const int d = NormalizeDim(op, first.shape(), dim);
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    OP_CHECK(t.dtype() == first.dtype(), op, "tensor ", i, " has dtype ", DtypeName(t.dtype()),
             " but tensor 0 has ", DtypeName(first.dtype()));
    bool match = t.rank() == first.rank();
    for (int k = 0; match && k < t.rank(); ++k) match = k == d || t.dim(k) == first.dim(k);
    OP_CHECK(match, op, "shapes ", first.shape().ToString(), " (tensor 0) and ",
             t.shape().ToString(), " (tensor ", i, ") must match except along dim ", dim);
    shape[d] += t.dim(d);
  }
  std::vector<Tensor> pieces;
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) {
    pieces.push_back(t.Contiguous());
    sizes.push_back(t.dim(d));
  }
  Tensor out = Tensor::Empty(shape, first.dtype());
  CopyPieces(out, pieces, sizes, d, /*to_whole=*/true);
  return out;
}

std::vector<Tensor> ConcatBackward(const Tensor& grad_out, absl::Span<const int64_t> sizes,
                                   int dim) {
  return SplitImpl("concat_backward", grad_out, sizes, dim);
}

std::vector<Tensor> Split(const Tensor& x, absl::Span<const int64_t> sizes, int dim) {
  return SplitImpl("split", x, sizes, dim);
}

Tensor SplitBackward(absl::Span<const Tensor> grads, const Shape& input_shape,
                     absl::Span<const int64_t> sizes, int dim) {
  const char* op = "split_backward";
  OP_CHECK(grads.size() == sizes.size(), op, "got ", grads.size(), " gradients for ", sizes.size(),
           " pieces");
  const int d = NormalizeDim(op, input_shape, dim);
  const Tensor* any = nullptr;
  bool all_defined = true;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      all_defined = false;
      continue;
    }
    CheckCpu(op, {&grads[i]});
    if (any == nullptr) any = &grads[i];
    Shape expected = input_shape;
    expected[d] = sizes[i];
    OP_CHECK(grads[i].shape() == expected, op, "gradient ", i, " has shape ",
             grads[i].shape().ToString(), ", expected ", expected.ToString());
    OP_CHECK(grads[i].dtype() == any->dtype(), op, "gradient ", i, " has dtype ",
             DtypeName(grads[i].dtype()), ", others have ", DtypeName(any->dtype()));
  }
  OP_CHECK(any != nullptr, op, "every gradient is undefined, so the dtype is unknown");
  OP_CHECK(SizesAddUpTo(sizes, input_shape[d]), op, "sizes (", absl::StrJoin(sizes, ","),
           ") must be >= 0 and add up to dim ", dim, " of ", input_shape.ToString());
  std::vector<Tensor> pieces;
  for (const Tensor& g : grads) pieces.push_back(g.defined() ? g.Contiguous() : Tensor());
  Tensor out = all_defined ? Tensor::Empty(input_shape, any->dtype())
                           : Tensor::Zeros(input_shape, any->dtype());
  CopyPieces(out, pieces, sizes, d, /*to_whole=*/true);
  return out;
}

Tensor ContiguousCopy(const Tensor& x) {
  CheckCpu("contiguous_copy", {&x});
  return x.Clone();
}

Tensor NarrowBackward(const Tensor& grad_out, const Shape& input_shape, int dim, int64_t start) {
  const char* op = "narrow_backward";
  CheckCpu(op, {&grad_out});
  const int d = NormalizeDim(op, input_shape, dim);
  Shape expected = input_shape;
  expected[d] = grad_out.rank() == input_shape.rank() ? grad_out.dim(d) : -1;
  // grad_out's length <= size - start: start + length could overflow.
  OP_CHECK(grad_out.shape() == expected && start >= 0 && start <= input_shape[d] &&
               grad_out.dim(d) <= input_shape[d] - start,
           op, "grad_out ", grad_out.shape().ToString(), " at offset ", start, " along dim ", dim,
           " does not fit in ", input_shape.ToString());
  Tensor grad_in = Tensor::Zeros(input_shape, grad_out.dtype());
  if (grad_out.numel() > 0) CopyStrided(grad_out, grad_in.Narrow(d, start, grad_out.dim(d)));
  return grad_in;
}

}  // namespace tensor
