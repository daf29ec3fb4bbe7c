// SGD: option checks and the fused update loop.
#include "optim/sgd.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/optim_step.h"

namespace optim {

absl::StatusOr<std::unique_ptr<SGD>> SGD::Create(const SgdOptions& o) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("[sgd] invalid options: ", what, " (lr=", o.lr, " momentum=", o.momentum,
                     " dampening=", o.dampening, " nesterov=", o.nesterov ? "true" : "false",
                     " weight_decay=", o.weight_decay, ")"));
  };
  if (!std::isfinite(o.lr) || o.lr < 0) {
    return bad(absl::StrCat("lr must be finite and >= 0, got ", o.lr));
  }
  if (!std::isfinite(o.momentum) || o.momentum < 0) {
    return bad(absl::StrCat("momentum must be finite and >= 0, got ", o.momentum));
  }
  if (!std::isfinite(o.dampening)) {
    return bad(absl::StrCat("dampening must be finite, got ", o.dampening));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return bad(absl::StrCat("weight_decay must be finite and >= 0, got ", o.weight_decay));
  }
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    return bad("nesterov momentum requires momentum > 0 and dampening == 0");
  }
  return std::unique_ptr<SGD>(new SGD(o));
}

std::string SGD::Settings() const {
  const SgdOptions& o = options_;
  return absl::StrCat("sgd(momentum=", o.momentum, ",dampening=", o.dampening,
                      ",nesterov=", o.nesterov ? "true" : "false",
                      ",weight_decay=", o.weight_decay, ")");
}

std::vector<std::string> SGD::BufferNames() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

namespace {

struct SgdScalars {
  float lr;
  float weight_decay;
  float momentum;
  float one_minus_dampening;
};

// One fused pass over elements [0, n); the flags are loop invariants made
// template arguments so that each variant is a straight, vectorizable loop.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void SgdKernel(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
               const SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (kDecay) d = d + s.weight_decay * p[i];
    if (kMomentum) {
      const float b = kFirst ? d : buf[i] * s.momentum + s.one_minus_dampening * d;
      buf[i] = b;
      d = kNesterov ? d + s.momentum * b : b;
    }
    p[i] = p[i] - s.lr * d;
  }
}

using KernelFn = void (*)(float*, const float*, float*, int64_t, SgdScalars);

template <bool kDecay>
KernelFn PickKernel(bool momentum, bool first, bool nesterov) {
  if (!momentum) return &SgdKernel<kDecay, false, false, false>;
  if (first) {
    return nesterov ? &SgdKernel<kDecay, true, true, true> : &SgdKernel<kDecay, true, true, false>;
  }
  return nesterov ? &SgdKernel<kDecay, true, false, true> : &SgdKernel<kDecay, true, false, false>;
}

}  // namespace

void SGD::UpdateAll(const std::vector<Updating>& params) {
  const bool momentum = options_.momentum != 0;
  // No decay at all when weight_decay == 0 (as PyTorch, which then skips the add).
  const bool any_decay = options_.weight_decay != 0;
  const tensor::cuda::SgdScalars cs{
      static_cast<float>(lr()), static_cast<float>(options_.weight_decay),
      static_cast<float>(options_.momentum), static_cast<float>(1.0 - options_.dampening)};
  // GPU params by device: one list of segments each.
  std::map<int, std::vector<tensor::cuda::SgdSegment>> on_gpu;
  for (const Updating& u : params) {
    const ParamRef& ref = *u.ref;
    if (!ref.param.device().is_cuda()) {
      Update(ref, *u.state);
      continue;
    }
    std::vector<tensor::cuda::SgdSegment>& segments = on_gpu[ref.param.device().index];
    const tensor::Tensor buf = momentum ? u.state->buffers[0] : tensor::Tensor();
    ForEachDecaySegment(ref, [&](int64_t b, int64_t e, bool d) {
      tensor::cuda::SgdFlags flags;
      flags.decay = d && any_decay;
      flags.momentum = momentum;
      flags.first = u.state->step == 1;
      flags.nesterov = options_.nesterov;
      segments.push_back({ref.param, ref.grad, buf, b, e, cs, flags, ref.low_precision_copy});
    });
  }
  for (const auto& [device, segments] : on_gpu) tensor::cuda::SgdStepMany(segments);
}

void SGD::Update(const ParamRef& ref, ParamState& state) {
  if (ref.param.device().is_cuda()) {
    UpdateAll({{&ref, &state}});
    return;
  }
  const bool momentum = options_.momentum != 0;
  const bool first = state.step == 1;
  const SgdScalars s{static_cast<float>(lr()), static_cast<float>(options_.weight_decay),
                     static_cast<float>(options_.momentum),
                     static_cast<float>(1.0 - options_.dampening)};
  // No decay at all when weight_decay == 0 (as PyTorch, which then skips the add).
  const bool any_decay = options_.weight_decay != 0;
  const KernelFn plain = PickKernel<false>(momentum, first, options_.nesterov);
  const KernelFn decayed = PickKernel<true>(momentum, first, options_.nesterov);
  float* p = ref.param.data<float>();
  const float* g = ref.grad.data<float>();
  float* buf = momentum ? state.buffers[0].data<float>() : nullptr;
  ForEachSegment(ref, [&](int64_t b, int64_t e, bool decay) {
    (decay && any_decay ? decayed : plain)(p + b, g + b, buf == nullptr ? nullptr : buf + b, e - b,
                                           s);
  });
}

}  // namespace optim
