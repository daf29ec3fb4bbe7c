// Cross-entropy kernels. Per row: max, sum of exp(x - max) (8-wide vectors,
// tensor/cpu/vec8.h), log-sum-exp and the row's loss; the backward
// recomputes the softmax from the logits and the saved log-sum-exp instead of
// keeping a probability copy (the vocabulary makes that a large tensor).
#include "tensor/cpu/loss.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

enum class Mode { kForward, kBackward, kBoth };

// Runs `mode` over all rows; returns the loss sum (0 for kBackward).
template <Mode kMode, typename T, typename I>
double Rows(const T* logits, const I* targets, int64_t ignore_index, float* lse,
            float grad_scale, T* grad, int64_t rows, int64_t v) {
  constexpr bool kForward = kMode != Mode::kBackward;
  constexpr bool kBackward = kMode != Mode::kForward;
  std::vector<double> row_loss(kForward ? rows : 0, 0.0);  // (N)
  ParallelFor(rows, vec::RowGrain(v), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : v);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = static_cast<int64_t>(targets[r]);
      if (t == ignore_index) {
        if constexpr (kForward) lse[r] = 0.0f;
        if constexpr (kBackward) vec::ZeroRow(grad + r * v, v);
        continue;
      }
      if constexpr (kForward) {
        // The softmax is exp(x - shift) / sum, shift the row's max.
        float shift;
        const float* x = vec::RowAsFloatScaledMax(logits + r * v, v, scratch.data(), 1.0f, &shift);
        const float x_target = x[t];  // read before kBoth's terms overwrite an f32 row
        // kBoth: the terms exp(x - shift) are kept, so each exp is computed
        // once, in the gradient's row as float (the scratch copy; for f32 the
        // row itself, which the gradient overwrites anyway).
        float* terms = nullptr;
        float sum;
        if constexpr (kBackward) {
          terms =
              std::is_same_v<T, float> ? reinterpret_cast<float*>(grad + r * v) : scratch.data();
          sum = vec::RowExpSum(x, 1.0f, shift, terms, v);
        } else {
          sum = vec::RowExpSumOnly(x, 1.0f, shift, v);
        }
        const float log_sum = std::log(sum);
        lse[r] = shift + log_sum;
        // (max - x_t) + log(sum): keeps the precision that max + log(sum) would
        // round away when the logits are large.
        row_loss[r] = static_cast<double>(shift - x_target) + static_cast<double>(log_sum);
        if constexpr (kBackward) {
          T* out = grad + r * v;  // (V)
          const float term_target = terms[t];
          const float scale = grad_scale / sum;
          vec::StoreRowScaled(terms, scale, out, v);
          // The target's entry again, minus the one-hot term, rounded once.
          out[t] = FromFloat<T>(term_target * scale - grad_scale);
        }
      } else {
        // From the saved lse: grad = exp(x - lse) * grad_scale, minus it at the target.
        const float* x = vec::RowAsFloat(logits + r * v, v, scratch.data());
        T* out = grad + r * v;  // (V), may be the logits row
        const vec::F8 sh = vec::Splat(lse[r]), gs = vec::Splat(grad_scale);
        auto prob_times_scale = [&](vec::F8 xv) { return vec::Exp(xv - sh) * gs; };
        const float x_target = x[t];  // read before an in-place f32 row is overwritten
        vec::ForEachBlock(v, [&](int64_t i, auto k) {
          vec::StoreAs(out + i, prob_times_scale(vec::LoadAs(x + i, k)), k);
        });
        // The target's entry again, minus the one-hot term, rounded once.
        out[t] = FromFloat<T>(prob_times_scale(vec::Splat(x_target))[0] - grad_scale);
      }
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;
  return total;
}

template <Mode kMode>
double Run(const char* op, const Tensor& logits, const Tensor& targets, int64_t ignore_index,
           const Tensor& lse, float grad_scale, const Tensor& grad) {
  const int64_t v = logits.dim(-1);
  const int64_t rows = v == 0 ? 0 : logits.numel() / v;
  double total = 0;
  DispatchFloating(op, logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    DispatchIndex(op, targets.dtype(), [&](auto* itag) {
      using I = std::remove_pointer_t<decltype(itag)>;
      total = Rows<kMode>(logits.data<T>(), targets.data<I>(), ignore_index, lse.data<float>(),
                          grad_scale, grad.defined() ? grad.data<T>() : nullptr, rows, v);
    });
  });
  return total;
}

}  // namespace

double CrossEntropyForward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           const Tensor& lse) {
  return Run<Mode::kForward>("cross_entropy", logits, targets, ignore_index, lse, 0.0f,
                             Tensor());
}

void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                          int64_t ignore_index, float grad_scale, const Tensor& grad_logits) {
  Run<Mode::kBackward>("cross_entropy_backward", logits, targets, ignore_index, lse, grad_scale,
                       grad_logits);
}

double CrossEntropyForwardBackwardInPlace(const Tensor& logits, const Tensor& targets,
                                          int64_t ignore_index, float grad_scale,
                                          const Tensor& lse) {
  return Run<Mode::kBoth>("cross_entropy", logits, targets, ignore_index, lse, grad_scale,
                          logits);
}

}  // namespace cpu
}  // namespace tensor
