// Global-norm gradient clipping.
#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "tensor/cuda/optim_step.h"
#include "tensor/ops/check.h"
#include "tensor/thread_pool.h"

namespace optim {

using tensor::Tensor;

namespace {

// Elements summed by one block; block sums are added in block order.
constexpr int64_t kBlock = 1 << 13;

void CheckGrad(const char* op, const Tensor& g) {
  if (!g.device().is_cuda()) tensor::CheckCpu(op, {&g});
  OP_CHECK(g.dtype() == tensor::Dtype::kF32, op, tensor::Describe("gradient", g), " must be f32");
  OP_CHECK(g.is_contiguous(), op, tensor::Describe("gradient", g), " must be contiguous");
}

double SumSquares(const float* p, int64_t n) {
  // Four independent accumulators: shorter dependency chains, same order every run.
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      const double x = p[i + j];
      acc[j] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = p[i];
    acc[0] += x * x;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace

double GradNormSquared(absl::Span<const Tensor> grads) {
  double total = 0;
  // GPU gradients, by device: a launch per 64 and one read back per device.
  std::map<int, std::vector<Tensor>> on_gpu;
  std::vector<double> partial;
  for (const Tensor& g : grads) {
    CheckGrad("grad_norm", g);
    const int64_t n = g.numel();
    if (n == 0) continue;
    if (g.device().is_cuda()) {
      on_gpu[g.device().index].push_back(g);
      continue;
    }
    const float* p = g.data<float>();
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    partial.assign(blocks, 0.0);
    tensor::ParallelFor(blocks, 4, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t begin = b * kBlock;
        partial[b] = SumSquares(p + begin, std::min(n, begin + kBlock) - begin);
      }
    });
    for (double s : partial) total += s;
  }
  for (const auto& [device, device_grads] : on_gpu) {
    total += tensor::cuda::GradSumSquares(device_grads);
  }
  return total;
}

void ScaleGrads(absl::Span<Tensor> grads, float factor) {
  for (const Tensor& g : grads) CheckGrad("scale_grads", g);
  std::map<int, std::vector<Tensor>> on_gpu;  // by device: a few launches each
  for (Tensor& g : grads) {
    if (g.device().is_cuda()) {
      on_gpu[g.device().index].push_back(g);
      continue;
    }
    float* p = g.data<float>();
    tensor::ParallelFor(g.numel(), 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] *= factor;
    });
  }
  for (const auto& [device, device_grads] : on_gpu) {
    tensor::cuda::ScaleGrads(device_grads, factor);
  }
}

double ClipGradNorm(const std::vector<ParamRef>& params, double max_norm,
                    const std::function<double(double)>& all_reduce_sum) {
  OP_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm",
           "max_norm must be finite and > 0, got ", max_norm);
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const ParamRef& ref : params) {
    OP_CHECK(ref.grad.defined(), "clip_grad_norm", "parameter '", ref.name, "' has no gradient");
    grads.push_back(ref.grad);
  }
  double squared = GradNormSquared(grads);
  if (all_reduce_sum) squared = all_reduce_sum(squared);
  const double total = std::sqrt(squared);
  const double coef = max_norm / (total + 1e-6);
  if (std::isfinite(total) && coef < 1.0)
    ScaleGrads(absl::MakeSpan(grads), static_cast<float>(coef));
  return total;
}

}  // namespace optim
