// Dynamic loss scaler and the non-finite checks it relies on.
#include "precision/loss_scaler.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/optim_step.h"
#include "tensor/ops/check.h"
#include "tensor/thread_pool.h"

namespace precision {

using tensor::Tensor;

absl::StatusOr<DynamicLossScaler> DynamicLossScaler::Create(LossScalerOptions o) {
  if (!(o.init_scale > 0) || !std::isfinite(o.init_scale) || !(o.growth_factor > 1) ||
      !std::isfinite(o.growth_factor) || !(o.backoff_factor > 0) || !(o.backoff_factor < 1) ||
      o.growth_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler options: need a finite init_scale > 0, a finite growth_factor > 1, "
        "0 < backoff_factor < 1, growth_interval >= 1; got init_scale=", o.init_scale,
        " growth_factor=", o.growth_factor, " backoff_factor=", o.backoff_factor,
        " growth_interval=", o.growth_interval));
  }
  return DynamicLossScaler(o);
}

bool DynamicLossScaler::Update(bool found_non_finite) {
  if (found_non_finite) {
    scale_ *= options_.backoff_factor;
    good_steps_ = 0;
    ++skipped_steps_;
    return false;
  }
  if (++good_steps_ >= options_.growth_interval) {
    // Not past fp32's largest (2^128 is inf there, as PyTorch's fp32 scale
    // stops): the scale multiplies the loss in fp32.
    const double grown = scale_ * options_.growth_factor;
    if (grown <= std::numeric_limits<float>::max()) scale_ = grown;
    good_steps_ = 0;
  }
  return true;
}

absl::Status DynamicLossScaler::SetState(const State& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale) || state.good_steps < 0 ||
      state.skipped_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler state: need a finite scale > 0 and step counts >= 0; got scale=",
        state.scale, " good_steps=", state.good_steps, " skipped_steps=", state.skipped_steps));
  }
  scale_ = state.scale;
  good_steps_ = state.good_steps;
  skipped_steps_ = state.skipped_steps;
  return absl::OkStatus();
}

namespace {

// Runs fn(T* data, n) over chunks of a contiguous floating CPU tensor; ORs the results.
template <typename Fn>
bool AnyOverChunks(const char* op, const Tensor& t, Fn fn) {
  tensor::CheckCpu(op, {&t});
  OP_CHECK(t.is_contiguous(), op, "tensor ", t.shape().ToString(), " must be contiguous");
  std::atomic<bool> any{false};
  tensor::DispatchFloating(op, t.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = static_cast<T*>(t.raw_data());
    tensor::ParallelFor(t.numel(), 1 << 15, [&](int64_t b, int64_t e) {
      if (fn(p + b, e - b)) any.store(true, std::memory_order_relaxed);
    });
  });
  return any.load();
}

}  // namespace

bool HasNonFinite(const Tensor& t) {
  return AnyOverChunks("has_non_finite", t.Contiguous(), [](auto* p, int64_t n) {
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(tensor::ToFloat(p[i]));
    return bad;
  });
}

bool ScaleAndCheckNonFinite(Tensor& grad, float factor) {
  return ScaleAndCheckNonFinite(absl::MakeSpan(&grad, 1), factor);
}

bool ScaleAndCheckNonFinite(absl::Span<Tensor> grads, float factor) {
  bool found = false;
  // f32 GPU gradients, by device: scaled and checked in place, one host wait
  // per device.
  std::map<int, std::vector<Tensor>> on_gpu;
  for (Tensor& grad : grads) {
    if (grad.device().is_cuda() && grad.dtype() == tensor::Dtype::kF32 && grad.is_contiguous()) {
      on_gpu[grad.device().index].push_back(grad);
    } else if (!grad.device().is_cpu()) {  // other GPU gradients go through a host copy
      Tensor host = grad.To(tensor::Device::Cpu());
      found |= ScaleAndCheckNonFinite(host, factor);
      grad.CopyFrom(host);
    } else {
      found |= AnyOverChunks("scale_and_check", grad, [factor](auto* p, int64_t n) {
        using T = std::remove_pointer_t<decltype(p)>;
        bool bad = false;
        for (int64_t i = 0; i < n; ++i) {
          // Checked as stored: an f16 result past 65504 is inf only once narrowed.
          p[i] = tensor::FromFloat<T>(tensor::ToFloat(p[i]) * factor);
          bad |= !std::isfinite(tensor::ToFloat(p[i]));
        }
        return bad;
      });
    }
  }
  for (const auto& [device, device_grads] : on_gpu) {
    found |= tensor::cuda::ScaleGradsAndCheckNonFinite(device_grads, factor);
  }
  return found;
}

}  // namespace precision
