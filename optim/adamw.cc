// AdamW: option checks and the fused update loop.
#include "optim/adamw.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/optim_step.h"

namespace optim {

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(const AdamWOptions& o) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("[adamw] invalid options: ", what, " (lr=", o.lr, " beta1=", o.beta1,
                     " beta2=", o.beta2, " eps=", o.eps, " weight_decay=", o.weight_decay, ")"));
  };
  if (!std::isfinite(o.lr) || o.lr < 0) {
    return bad(absl::StrCat("lr must be finite and >= 0, got ", o.lr));
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return bad(absl::StrCat("beta1 must be in [0, 1), got ", o.beta1));
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return bad(absl::StrCat("beta2 must be in [0, 1), got ", o.beta2));
  }
  if (!std::isfinite(o.eps) || o.eps < 0) {
    return bad(absl::StrCat("eps must be finite and >= 0, got ", o.eps));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return bad(absl::StrCat("weight_decay must be finite and >= 0, got ", o.weight_decay));
  }
  return std::unique_ptr<AdamW>(new AdamW(o));
}

std::string AdamW::Settings() const {
  const AdamWOptions& o = options_;
  return absl::StrCat("adamw(beta1=", o.beta1, ",beta2=", o.beta2, ",eps=", o.eps,
                      ",weight_decay=", o.weight_decay, ")");
}

namespace {

struct AdamWScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float neg_step_size;          // -lr / (1 - beta1^t)
  float eps;
};

// One fused pass over elements [0, n) in the order of PyTorch's single-tensor
// AdamW: decay, moments, then p += -step_size * m / (sqrt(v) / bc2_sqrt + eps).
template <bool kDecay>
void AdamWKernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamWScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i];
    if (kDecay) pi = pi * s.decay;
    const float gi = g[i];
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + s.neg_step_size * (mi / denom);
  }
}

// The scalars of a step of a param whose state has taken `step` steps.
AdamWScalars ScalarsAt(const AdamWOptions& o, double lr, int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  return AdamWScalars{static_cast<float>(1.0 - lr * o.weight_decay),
                      static_cast<float>(o.beta1),
                      static_cast<float>(1.0 - o.beta1),
                      static_cast<float>(o.beta2),
                      static_cast<float>(1.0 - o.beta2),
                      static_cast<float>(std::sqrt(bias_correction2)),
                      static_cast<float>(-(lr / bias_correction1)),
                      static_cast<float>(o.eps)};
}

}  // namespace

void AdamW::UpdateAll(const std::vector<Updating>& params) {
  const bool any_decay = options_.weight_decay != 0;
  // GPU params by device: one list of segments each.
  std::map<int, std::vector<tensor::cuda::AdamWSegment>> on_gpu;
  for (const Updating& u : params) {
    const ParamRef& ref = *u.ref;
    if (!ref.param.device().is_cuda()) {
      Update(ref, *u.state);
      continue;
    }
    const AdamWScalars s = ScalarsAt(options_, lr(), u.state->step);
    const tensor::cuda::AdamWScalars cs{s.decay,        s.beta1, s.one_minus_beta1,
                                        s.beta2,        s.one_minus_beta2,
                                        s.bias_correction2_sqrt, s.neg_step_size, s.eps};
    std::vector<tensor::cuda::AdamWSegment>& segments = on_gpu[ref.param.device().index];
    ForEachDecaySegment(ref, [&](int64_t b, int64_t e, bool d) {
      segments.push_back({ref.param, ref.grad, u.state->buffers[0], u.state->buffers[1], b, e, cs,
                          d && any_decay, ref.low_precision_copy});
    });
  }
  for (const auto& [device, segments] : on_gpu) tensor::cuda::AdamWStepMany(segments);
}

void AdamW::Update(const ParamRef& ref, ParamState& state) {
  if (ref.param.device().is_cuda()) {
    UpdateAll({{&ref, &state}});
    return;
  }
  const AdamWScalars s = ScalarsAt(options_, lr(), state.step);
  const bool any_decay = options_.weight_decay != 0;
  float* p = ref.param.data<float>();
  const float* g = ref.grad.data<float>();
  float* m = state.buffers[0].data<float>();
  float* v = state.buffers[1].data<float>();
  ForEachSegment(ref, [&](int64_t b, int64_t e, bool decay) {
    if (decay && any_decay) {
      AdamWKernel<true>(p + b, g + b, m + b, v + b, e - b, s);
    } else {
      AdamWKernel<false>(p + b, g + b, m + b, v + b, e - b, s);
    }
  });
}

}  // namespace optim
