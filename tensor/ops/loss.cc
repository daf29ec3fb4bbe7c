// Cross-entropy ops: shape and target checks, the mean over counted targets,
// then the CPU kernels in tensor/cpu/loss.h.
#include "tensor/ops/loss.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/loss.h"
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

// Checks logits and targets (contiguous); returns the number of targets that
// are not ignore_index. Throws on the first target outside [0, V).
int64_t CheckAndCount(const char* op, const Tensor& logits, const Tensor& targets,
                      int64_t ignore_index) {
  CheckCpu(op, {&logits, &targets});
  CheckFloating(op, logits);
  OP_CHECK(logits.rank() >= 1 && logits.dim(-1) > 0, op,
           "logits need a non-empty class dimension; got ", Describe("logits", logits));
  const Shape rows(absl::MakeConstSpan(logits.shape().dims()).subspan(0, logits.rank() - 1));
  OP_CHECK(targets.shape() == rows, op, "targets ", targets.shape().ToString(),
           " do not match logits ", logits.shape().ToString(), ": expected targets ",
           rows.ToString());
  const int64_t classes = logits.dim(-1);
  int64_t count = 0;
  DispatchIndex(op, targets.dtype(), [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    const I* t = targets.data<I>();
    for (int64_t p = 0; p < targets.numel(); ++p) {
      const int64_t v = static_cast<int64_t>(t[p]);
      if (v == ignore_index) continue;
      if (v < 0 || v >= classes) {
        ThrowOpError(op, "target ", v, " at position ", PositionString(p, targets.shape()),
                     " of targets ", targets.shape().ToString(), " is out of range for ",
                     classes, " classes (logits ", logits.shape().ToString(),
                     ", ignore_index ", ignore_index, ")");
      }
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

}  // namespace

CrossEntropyResult CrossEntropy(const Tensor& logits, const Tensor& targets,
                                int64_t ignore_index) {
  const char* op = "cross_entropy";
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
  const Tensor targets_c = targets.Contiguous();
  const int64_t count = CheckAndCount(op, logits, targets_c, forward.ignore_index);
  CheckCpu(op, {&forward.lse});
  OP_CHECK(forward.lse.shape() == targets.shape() && forward.lse.dtype() == Dtype::kF32, op,
           "the forward's lse ", Describe("lse", forward.lse), " does not match targets ",
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
  OP_CHECK(logits.defined() && logits.is_contiguous(), op,
           "logits must be contiguous to be overwritten with their gradient; got ",
           Describe("logits", logits));
  const Tensor targets_c = targets.Contiguous();
  CrossEntropyResult out;
  out.count = CheckAndCount(op, logits, targets_c, ignore_index);
  out.ignore_index = ignore_index;
  out.lse = Tensor::Empty(targets.shape());
  const double total = cpu::CrossEntropyForwardBackwardInPlace(
      logits, targets_c, ignore_index, GradScale(grad_loss, out.count), out.lse);
  out.loss = MeanLoss(total, out.count);
  return out;
}

}  // namespace tensor
