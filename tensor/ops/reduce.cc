// Reductions: argument checks, (outer, reduce, inner) views of the input, and
// calls into the kernels of the tensors' device: tensor/cpu/reduce.h, or
// tensor/cuda/reduce.h (same signatures) for tensors on a CUDA device.
#include "tensor/ops/reduce.h"

#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cpu/reduce.h"
#include "tensor/cuda/reduce.h"
#include "tensor/ops/check.h"

namespace tensor {
namespace {

// The kernels of the data's device (the op layer checked that all share it).
void SumDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, double scale,
            bool accumulate, const Tensor& out) {
  if (x.device().is_cuda()) return cuda::SumDim(x, outer, reduce, inner, scale, accumulate, out);
  cpu::SumDim(x, outer, reduce, inner, scale, accumulate, out);
}

void MaxDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, const Tensor& values,
            const Tensor& indices) {
  if (x.device().is_cuda()) return cuda::MaxDim(x, outer, reduce, inner, values, indices);
  cpu::MaxDim(x, outer, reduce, inner, values, indices);
}

void BroadcastDim(const Tensor& grad_out, int64_t outer, int64_t reduce, int64_t inner,
                  double scale, const Tensor& grad_in) {
  if (grad_in.device().is_cuda()) {
    return cuda::BroadcastDim(grad_out, outer, reduce, inner, scale, grad_in);
  }
  cpu::BroadcastDim(grad_out, outer, reduce, inner, scale, grad_in);
}

void ScatterDim(const Tensor& grad_out, const Tensor& indices, int64_t outer, int64_t reduce,
                int64_t inner, const Tensor& grad_in) {
  if (grad_in.device().is_cuda()) {
    return cuda::ScatterDim(grad_out, indices, outer, reduce, inner, grad_in);
  }
  cpu::ScatterDim(grad_out, indices, outer, reduce, inner, grad_in);
}

// x seen as (outer, reduce, inner) around one dimension.
struct Blocks {
  int64_t outer = 1;
  int64_t reduce = 1;
  int64_t inner = 1;
};

Blocks BlocksAround(const Shape& shape, int d) {
  Blocks b;
  for (int i = 0; i < d; ++i) b.outer *= shape[i];
  b.reduce = shape[d];
  for (int i = d + 1; i < shape.rank(); ++i) b.inner *= shape[i];
  return b;
}

int NormalizeDim(const char* op, const Shape& shape, int dim) {
  const int d = dim < 0 ? dim + shape.rank() : dim;
  OP_CHECK(d >= 0 && d < shape.rank(), op, "dim ", dim, " out of range for shape ",
           shape.ToString(), " (rank ", shape.rank(), ")");
  return d;
}

Shape ReducedShape(const Shape& shape, int d, bool keepdim) {
  Shape out;
  for (int i = 0; i < shape.rank(); ++i) {
    if (i != d) {
      out.push_back(shape[i]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

void CheckInput(const char* op, const Tensor& x) {
  CheckOneDevice(op, {&x});
  CheckFloating(op, x);
}

// Checks that grad_out (and indices, if given) has the shape of the forward
// output of reducing input_shape over dim; returns the normalized dim.
int CheckBackward(const char* op, const Tensor& grad_out, const Tensor* indices,
                  const Shape& input_shape, int dim, bool keepdim) {
  CheckInput(op, grad_out);
  const int d = NormalizeDim(op, input_shape, dim);
  const Shape expected = ReducedShape(input_shape, d, keepdim);
  OP_CHECK(grad_out.shape() == expected, op, "grad_out ", grad_out.shape().ToString(),
           " does not match the output shape ", expected.ToString(), " of reducing ",
           input_shape.ToString(), " over dim ", dim, keepdim ? " (keepdim)" : "");
  if (indices != nullptr) {
    CheckOneDevice(op, {&grad_out, indices});
    OP_CHECK(indices->dtype() == Dtype::kI64 && indices->shape() == expected, op,
             "expected i64 indices of shape ", expected.ToString(), ", got ",
             Describe("indices", *indices));
  }
  return d;
}

Tensor SumOrMean(const char* op, const Tensor& x, int dim, bool keepdim, bool mean) {
  CheckInput(op, x);
  const int d = NormalizeDim(op, x.shape(), dim);
  const Blocks b = BlocksAround(x.shape(), d);
  Tensor out = Tensor::Empty(ReducedShape(x.shape(), d, keepdim), x.dtype(), x.device());
  const double scale = mean ? 1.0 / static_cast<double>(b.reduce) : 1.0;
  SumDim(x.Contiguous(), b.outer, b.reduce, b.inner, scale, false, out);
  return out;
}

// Checks that x's shape can be broadcast from `shape`.
void CheckReducible(const char* op, const Shape& from, const Shape& shape) {
  bool ok = shape.rank() <= from.rank();
  const int lead = from.rank() - shape.rank();
  for (int i = 0; ok && i < shape.rank(); ++i) {
    ok = shape[i] == from[lead + i] || shape[i] == 1;
  }
  OP_CHECK(ok, op, "cannot reduce shape ", from.ToString(), " to ", shape.ToString(),
           ": the target must broadcast to the source (same dims or 1, aligned at the end)");
}

// Sums contiguous x over the dims along which out's shape was broadcast, into
// contiguous out: one SumDim pass per run of adjacent reduced dims, largest
// first, through f32 intermediates.
void ReduceToShapeImpl(const Tensor& x, const Tensor& out, bool accumulate) {
  const Shape& from = x.shape();
  const int lead = from.rank() - out.rank();
  std::vector<std::pair<int64_t, bool>> groups;  // (size, reduced), adjacent dims merged
  for (int d = 0; d < from.rank(); ++d) {
    if (from[d] == 1) continue;
    const bool reduced = d < lead || out.shape()[d - lead] == 1;
    if (!groups.empty() && groups.back().second == reduced) {
      groups.back().first *= from[d];
    } else {
      groups.emplace_back(from[d], reduced);
    }
  }
  Tensor cur = x;
  for (;;) {
    int pick = -1;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      if (groups[g].second && (pick < 0 || groups[g].first > groups[pick].first)) pick = g;
    }
    bool last = true;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      if (g != pick && groups[g].second) last = false;
    }
    int64_t outer = 1, reduce = 1, inner = 1;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      if (pick < 0 || g > pick) {
        inner *= groups[g].first;
      } else if (g < pick) {
        outer *= groups[g].first;
      } else {
        reduce = groups[g].first;
      }
    }
    if (last) {
      SumDim(cur, outer, reduce, inner, 1.0, accumulate, out);
      return;
    }
    Tensor next = Tensor::Empty({outer * inner}, Dtype::kF32, x.device());
    SumDim(cur, outer, reduce, inner, 1.0, false, next);
    cur = next;
    groups[pick].first = 1;
    groups[pick].second = false;
  }
}

}  // namespace

Tensor Sum(const Tensor& x, int dim, bool keepdim) {
  return SumOrMean("sum", x, dim, keepdim, /*mean=*/false);
}

Tensor Mean(const Tensor& x, int dim, bool keepdim) {
  return SumOrMean("mean", x, dim, keepdim, /*mean=*/true);
}

MaxResult MaxWithIndices(const Tensor& x, int dim, bool keepdim) {
  CheckInput("max", x);
  const int d = NormalizeDim("max", x.shape(), dim);
  OP_CHECK(x.dim(d) > 0, "max", "cannot take the max over dim ", dim, " of size 0 of ",
           Describe("x", x));
  const Blocks b = BlocksAround(x.shape(), d);
  const Shape shape = ReducedShape(x.shape(), d, keepdim);
  MaxResult r{Tensor::Empty(shape, x.dtype(), x.device()),
              Tensor::Empty(shape, Dtype::kI64, x.device())};
  MaxDim(x.Contiguous(), b.outer, b.reduce, b.inner, r.values, r.indices);
  return r;
}

Tensor Max(const Tensor& x, int dim, bool keepdim) {
  return MaxWithIndices(x, dim, keepdim).values;
}

Tensor SumBackward(const Tensor& grad_out, const Shape& input_shape, int dim, bool keepdim) {
  const int d = CheckBackward("sum_backward", grad_out, nullptr, input_shape, dim, keepdim);
  const Blocks b = BlocksAround(input_shape, d);
  Tensor grad_in = Tensor::Empty(input_shape, grad_out.dtype(), grad_out.device());
  BroadcastDim(grad_out.Contiguous(), b.outer, b.reduce, b.inner, 1.0, grad_in);
  return grad_in;
}

Tensor MeanBackward(const Tensor& grad_out, const Shape& input_shape, int dim, bool keepdim) {
  const int d = CheckBackward("mean_backward", grad_out, nullptr, input_shape, dim, keepdim);
  const Blocks b = BlocksAround(input_shape, d);
  Tensor grad_in = Tensor::Empty(input_shape, grad_out.dtype(), grad_out.device());
  BroadcastDim(grad_out.Contiguous(), b.outer, b.reduce, b.inner,
               1.0 / static_cast<double>(b.reduce), grad_in);
  return grad_in;
}

Tensor MaxBackward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape, int dim,
                   bool keepdim) {
  const int d = CheckBackward("max_backward", grad_out, &indices, input_shape, dim, keepdim);
  const Blocks b = BlocksAround(input_shape, d);
  Tensor grad_in = Tensor::Empty(input_shape, grad_out.dtype(), grad_out.device());
  ScatterDim(grad_out.Contiguous(), indices.Contiguous(), b.outer, b.reduce, b.inner, grad_in);
  return grad_in;
}

Tensor SumAll(const Tensor& x) {
  CheckInput("sum", x);
  Tensor out = Tensor::Empty({}, x.dtype(), x.device());
  SumDim(x.Contiguous(), 1, x.numel(), 1, 1.0, false, out);
  return out;
}

Tensor MeanAll(const Tensor& x) {
  CheckInput("mean", x);
  Tensor out = Tensor::Empty({}, x.dtype(), x.device());
  SumDim(x.Contiguous(), 1, x.numel(), 1, 1.0 / static_cast<double>(x.numel()), false, out);
  return out;
}

MaxResult MaxAllWithIndex(const Tensor& x) {
  CheckInput("max", x);
  OP_CHECK(x.numel() > 0, "max", "cannot take the max of an empty tensor ", Describe("x", x));
  MaxResult r{Tensor::Empty({}, x.dtype(), x.device()), Tensor::Empty({}, Dtype::kI64, x.device())};
  MaxDim(x.Contiguous(), 1, x.numel(), 1, r.values, r.indices);
  return r;
}

Tensor MaxAll(const Tensor& x) { return MaxAllWithIndex(x).values; }

namespace {

Tensor AllBackward(const char* op, const Tensor& grad_out, const Shape& input_shape, double scale) {
  CheckInput(op, grad_out);
  OP_CHECK(grad_out.numel() == 1, op, "grad_out ", grad_out.shape().ToString(),
           " must have one element (the output of a reduction over all elements)");
  Tensor grad_in = Tensor::Empty(input_shape, grad_out.dtype(), grad_out.device());
  BroadcastDim(grad_out.Contiguous(), 1, input_shape.numel(), 1, scale, grad_in);
  return grad_in;
}

}  // namespace

Tensor SumAllBackward(const Tensor& grad_out, const Shape& input_shape) {
  return AllBackward("sum_backward", grad_out, input_shape, 1.0);
}

Tensor MeanAllBackward(const Tensor& grad_out, const Shape& input_shape) {
  return AllBackward("mean_backward", grad_out, input_shape,
                     1.0 / static_cast<double>(input_shape.numel()));
}

Tensor MaxAllBackward(const Tensor& grad_out, const Tensor& index, const Shape& input_shape) {
  const char* op = "max_backward";
  CheckInput(op, grad_out);
  CheckOneDevice(op, {&grad_out, &index});
  OP_CHECK(grad_out.numel() == 1 && index.numel() == 1 && index.dtype() == Dtype::kI64, op,
           "expected a one-element grad_out and i64 index, got ", Describe("grad_out", grad_out),
           " and ", Describe("index", index));
  Tensor grad_in = Tensor::Empty(input_shape, grad_out.dtype(), grad_out.device());
  ScatterDim(grad_out.Contiguous(), index.Contiguous(), 1, input_shape.numel(), 1, grad_in);
  return grad_in;
}

Tensor ReduceToShape(const Tensor& x, const Shape& shape) {
  const char* op = "reduce_to_shape";
  CheckInput(op, x);
  CheckReducible(op, x.shape(), shape);
  if (x.shape() == shape) return x;
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  ReduceToShapeImpl(x.Contiguous(), out, /*accumulate=*/false);
  return out;
}

void ReduceToShapeInto(const Tensor& x, const Tensor& out, bool accumulate) {
  const char* op = "reduce_to_shape";
  CheckInput(op, x);
  CheckInput(op, out);
  CheckOneDevice(op, {&x, &out});
  OP_CHECK(out.is_contiguous(), op, "out ", out.shape().ToString(), " must be contiguous");
  OP_CHECK(out.dtype() == x.dtype() || out.dtype() == Dtype::kF32, op, "cannot sum ",
           Describe("x", x), " into ", Describe("out", out), ": out must have x's dtype or be f32");
  CheckReducible(op, x.shape(), out.shape());
  ReduceToShapeImpl(x.Contiguous(), out, accumulate);
}

double SumSquares(const Tensor& x) {
  CheckInput("sum_squares", x);
  if (x.device().is_cuda()) return cuda::SumSquares(x.Contiguous());
  return cpu::SumSquares(x.Contiguous());
}

double L2Norm(absl::Span<const Tensor> tensors) {
  double total = 0;
  for (const Tensor& t : tensors) total += SumSquares(t);
  return std::sqrt(total);
}

}  // namespace tensor
