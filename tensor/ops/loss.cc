// Cross-entropy ops: shape and target checks, the mean over counted targets,
// then the CPU kernels in tensor/cpu/loss.h. Tensors on a GPU go to the CUDA
// kernels (tensor/cuda/loss.h), which check the targets and reduce the loss on
// the device and report the count and the first bad target back.
#include "tensor/ops/loss.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/loss.h"
#include "tensor/cuda/loss.h"
#include "tensor/ops/check.h"

namespace tensor {
namespace {

// The multi-index of flat position p in `shape`, as "[i,j]".
std::string PositionString(int64_t p, const Shape& shape) {
  std::vector<int64_t> index(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    index[d] = shape[d] == 0 ? 0 : p % shape[d];
    p = shape[d] == 0 ? 0 : p / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(index, ","), "]");
}

// The error for the first target outside [0, V) (and not ignore_index), at
// flat position p.
[[noreturn]] void ThrowBadTarget(const char* op, int64_t v, int64_t p, const Tensor& logits,
                                 const Tensor& targets, int64_t ignore_index) {
  ThrowOpError(op, "target ", v, " at position ", PositionString(p, targets.shape()),
               " of targets ", targets.shape().ToString(), " is out of range for ", logits.dim(-1),
               " classes (logits ", logits.shape().ToString(), ", ignore_index ", ignore_index,
               ")");
}

// logits floating (..., V) with V > 0 and targets (...), on devices already checked.
void CheckShapes(const char* op, const Tensor& logits, const Tensor& targets) {
  CheckFloating(op, logits);
  OP_CHECK(logits.rank() >= 1 && logits.dim(-1) > 0, op,
           "logits need a non-empty class dimension; got ", Describe("logits", logits));
  const Shape rows(absl::MakeConstSpan(logits.shape().dims()).subspan(0, logits.rank() - 1));
  OP_CHECK(targets.shape() == rows, op, "targets ", targets.shape().ToString(),
           " do not match logits ", logits.shape().ToString(), ": expected targets ",
           rows.ToString());
}

// Checks logits and targets (contiguous); returns the number of targets that
// are not ignore_index. Throws on the first target outside [0, V).
int64_t CheckAndCount(const char* op, const Tensor& logits, const Tensor& targets,
                      int64_t ignore_index) {
  CheckCpu(op, {&logits, &targets});
  CheckShapes(op, logits, targets);
  const int64_t classes = logits.dim(-1);
  int64_t count = 0;
  DispatchIndex(op, targets.dtype(), [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    const I* t = targets.data<I>();
    for (int64_t p = 0; p < targets.numel(); ++p) {
      const int64_t v = static_cast<int64_t>(t[p]);
      if (v == ignore_index) continue;
      if (v < 0 || v >= classes) ThrowBadTarget(op, v, p, logits, targets, ignore_index);
      ++count;
    }
  });
  return count;
}

void CheckGradLoss(const char* op, float grad_loss) {
  OP_CHECK(std::isfinite(grad_loss), op, "grad_loss must be finite; got ", grad_loss);
}

// (grad_loss / count), or 0 when every target is ignored.
float GradScale(float grad_loss, int64_t count) {
  return count == 0 ? 0.0f : static_cast<float>(static_cast<double>(grad_loss) / count);
}

Tensor MeanLoss(double total, int64_t count) {
  return Tensor::Full(Shape(), count == 0 ? 0.0 : total / count);
}

// ---- CUDA ----

// logits on a CUDA device; targets defined on the same one.
bool OnCuda(const char* op, const Tensor& logits, const Tensor& targets) {
  if (!logits.defined() || !logits.device().is_cuda()) return false;
  OP_CHECK(targets.defined(), op, "got an undefined tensor");
  OP_CHECK(targets.device() == logits.device(), op, "targets ", targets.shape().ToString(),
           " are on ", targets.device().ToString(), " but logits ", logits.shape().ToString(),
           " are on ", logits.device().ToString());
  return true;
}

// Throws what the CPU check would have thrown for the device's findings.
void CheckCudaTargets(const char* op, const cuda::CrossEntropyStats& stats, const Tensor& logits,
                      const Tensor& targets, int64_t ignore_index) {
  if (stats.first_bad >= 0) {
    ThrowBadTarget(op, stats.bad_target, stats.first_bad, logits, targets, ignore_index);
  }
}

// The forward result of a CUDA call: lse and loss on the device.
CrossEntropyResult CudaResult(const cuda::CrossEntropyStats& stats, const Tensor& lse,
                              const Tensor& loss, int64_t ignore_index) {
  CrossEntropyResult out;
  out.loss = loss;
  out.lse = lse;
  out.count = stats.count;
  out.ignore_index = ignore_index;
  return out;
}

// What the CUDA kernels read: logits as they are when they are stacked rows
// (contiguous, or a row-padded view such as an aligned LM head's), else a
// contiguous copy.
Tensor AsRows(const Tensor& logits) {
  return logits.RowStride() >= 0 ? logits : logits.Contiguous();
}

}  // namespace

CrossEntropyResult CrossEntropy(const Tensor& logits, const Tensor& targets,
                                int64_t ignore_index) {
  const char* op = "cross_entropy";
  if (OnCuda(op, logits, targets)) {
    CheckShapes(op, logits, targets);
    const Tensor lse = Tensor::Empty(targets.shape(), Dtype::kF32, logits.device());
    const Tensor loss = Tensor::Empty(Shape(), Dtype::kF32, logits.device());
    const cuda::CrossEntropyStats stats = cuda::CrossEntropyForward(
        AsRows(logits), targets.Contiguous(), ignore_index, lse, loss);
    CheckCudaTargets(op, stats, logits, targets, ignore_index);
    return CudaResult(stats, lse, loss, ignore_index);
  }
  const Tensor targets_c = targets.Contiguous();
  CrossEntropyResult out;
  out.count = CheckAndCount(op, logits, targets_c, ignore_index);
  out.ignore_index = ignore_index;
  out.lse = Tensor::Empty(targets.shape());
  const double total = cpu::CrossEntropyForward(logits.Contiguous(), targets_c, ignore_index,
                                                out.lse);
  out.loss = MeanLoss(total, out.count);
  return out;
}

Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                            const CrossEntropyResult& forward, float grad_loss) {
  const char* op = "cross_entropy_backward";
  CheckGradLoss(op, grad_loss);
  if (OnCuda(op, logits, targets)) {
    CheckShapes(op, logits, targets);
    OP_CHECK(forward.lse.defined() && forward.lse.device() == logits.device() &&
                 forward.lse.shape() == targets.shape() && forward.lse.dtype() == Dtype::kF32,
             op, "the forward's ", Describe("lse", forward.lse), " does not match targets ",
             targets.shape().ToString(), " on ", logits.device().ToString());
    Tensor grad = Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
    const cuda::CrossEntropyStats stats =
        cuda::CrossEntropyBackward(AsRows(logits), targets.Contiguous(),
                                   forward.lse.Contiguous(), forward.ignore_index, grad_loss, grad);
    CheckCudaTargets(op, stats, logits, targets, forward.ignore_index);
    OP_CHECK(stats.count == forward.count, op, "targets ", targets.shape().ToString(), " have ",
             stats.count, " non-ignored entries but the forward counted ", forward.count,
             "; pass the forward's targets and result");
    return grad;
  }
  const Tensor targets_c = targets.Contiguous();
  const int64_t count = CheckAndCount(op, logits, targets_c, forward.ignore_index);
  CheckCpu(op, {&forward.lse});
  OP_CHECK(forward.lse.shape() == targets.shape() && forward.lse.dtype() == Dtype::kF32, op,
           "the forward's ", Describe("lse", forward.lse), " does not match targets ",
           targets.shape().ToString());
  OP_CHECK(count == forward.count, op, "targets ", targets.shape().ToString(), " have ", count,
           " non-ignored entries but the forward counted ", forward.count,
           "; pass the forward's targets and result");
  Tensor grad = Tensor::Empty(logits.shape(), logits.dtype());
  cpu::CrossEntropyBackward(logits.Contiguous(), targets_c, forward.lse.Contiguous(),
                            forward.ignore_index, GradScale(grad_loss, count), grad);
  return grad;
}

CrossEntropyResult CrossEntropyForwardBackwardInPlace(const Tensor& logits,
                                                      const Tensor& targets, float grad_loss,
                                                      int64_t ignore_index) {
  const char* op = "cross_entropy";
  CheckGradLoss(op, grad_loss);
  OP_CHECK(logits.defined() && logits.RowStride() >= 0, op,
           "logits must be contiguous (or a row-padded view of a contiguous buffer) to be "
           "overwritten with their gradient; got ",
           Describe("logits", logits));
  if (OnCuda(op, logits, targets)) {
    CheckShapes(op, logits, targets);
    const Tensor lse = Tensor::Empty(targets.shape(), Dtype::kF32, logits.device());
    const Tensor loss = Tensor::Empty(Shape(), Dtype::kF32, logits.device());
    const cuda::CrossEntropyStats stats = cuda::CrossEntropyForwardBackwardInPlace(
        logits, targets.Contiguous(), ignore_index, grad_loss, lse, loss);
    CheckCudaTargets(op, stats, logits, targets, ignore_index);  // logits left untouched then
    return CudaResult(stats, lse, loss, ignore_index);
  }
  const Tensor targets_c = targets.Contiguous();
  CrossEntropyResult out;
  out.count = CheckAndCount(op, logits, targets_c, ignore_index);
  out.ignore_index = ignore_index;
  out.lse = Tensor::Empty(targets.shape());
  // The CPU kernel takes contiguous rows: a row-padded view goes through a copy.
  const Tensor rows = logits.Contiguous();
  const double total = cpu::CrossEntropyForwardBackwardInPlace(
      rows, targets_c, ignore_index, GradScale(grad_loss, out.count), out.lse);
  if (!rows.SharesStorageWith(logits)) {
    Tensor dst = logits;  // a handle on the caller's storage
    dst.CopyFrom(rows);
  }
  out.loss = MeanLoss(total, out.count);
  return out;
}

}  // namespace tensor
