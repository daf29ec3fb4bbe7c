// Building and checking ParamRefs.
#include "optim/param_ref.h"

#include <algorithm>
#include <unordered_set>

#include "tensor/ops/check.h"

namespace optim {

using tensor::Tensor;

ParamRef MakeParamRef(std::string name, Tensor param, Tensor grad, bool decay) {
  ParamRef ref{std::move(name), std::move(param), std::move(grad), {}};
  if (decay && ref.param.defined() && ref.param.numel() > 0) {
    ref.decay_ranges.emplace_back(0, ref.param.numel());
  }
  return ref;
}

std::vector<ParamRef> FromModule(nn::Module& module) {
  std::vector<ParamRef> refs;
  for (auto& [name, p] : module.NamedParameters()) {
    if (!p->requires_grad) continue;
    // Stepping on FSDP's views would change nothing it keeps (the shards);
    // on ZeRO-1's, gradients averaged in this rank's slices only.
    OP_CHECK(p->held_by.empty(), "FromModule", "parameter '", name, "' is held by ", p->held_by,
             ", whose optimizer steps on this rank's shards, not on the module's parameters "
             "(FSDP: FullyShardedModel::ParamRefs(); ZeRO-1: Zero1::Step())");
    if (!p->value.defined() || !p->grad.defined()) continue;
    refs.push_back(MakeParamRef(name, p->value, p->grad, p->weight_decay));
  }
  return refs;
}

ElementRanges SliceRanges(const ElementRanges& ranges, int64_t begin, int64_t end) {
  ElementRanges out;
  for (const auto& [b, e] : ranges) {
    const int64_t lo = std::max(b, begin);
    const int64_t hi = std::min(e, end);
    if (lo < hi) out.emplace_back(lo - begin, hi - begin);
  }
  return out;
}

namespace {

void CheckOne(const char* op, const ParamRef& ref) {
  const std::string& n = ref.name;
  OP_CHECK(ref.param.defined(), op, "parameter '", n, "' is undefined");
  OP_CHECK(ref.grad.defined(), op, "parameter '", n, "' has no gradient");
  OP_CHECK(ref.param.device() == ref.grad.device(), op, "parameter '", n,
           "': param and grad must be on one device (param on ", ref.param.device().ToString(),
           ", grad on ", ref.grad.device().ToString(), ")");
  OP_CHECK(ref.param.dtype() == tensor::Dtype::kF32 && ref.grad.dtype() == tensor::Dtype::kF32, op,
           "parameter '", n, "': param and grad must be f32, got ",
           tensor::Describe("param", ref.param), " and ", tensor::Describe("grad", ref.grad));
  OP_CHECK(ref.param.shape() == ref.grad.shape(), op, "parameter '", n,
           "': ", tensor::Describe("param", ref.param), " and ", tensor::Describe("grad", ref.grad),
           " differ in shape");
  OP_CHECK(ref.param.is_contiguous() && ref.grad.is_contiguous(), op, "parameter '", n,
           "': param and grad must be contiguous");
  if (const Tensor& low = ref.low_precision_copy; low.defined()) {
    OP_CHECK((low.dtype() == tensor::Dtype::kBF16 || low.dtype() == tensor::Dtype::kF16) &&
                 low.shape() == ref.param.shape() && low.device() == ref.param.device() &&
                 low.is_contiguous(),
             op, "parameter '", n, "': the low-precision copy must be bf16 or f16, contiguous, ",
             "of the param's shape and device: ", tensor::Describe("param", ref.param), " on ",
             ref.param.device().ToString(), ", ", tensor::Describe("copy", low), " on ",
             low.device().ToString(), low.is_contiguous() ? "" : " (not contiguous)");
  }
  for (const auto* ranges : {&ref.decay_ranges, &ref.frozen_ranges}) {
    int64_t last_end = 0;
    for (const auto& [b, e] : *ranges) {
      OP_CHECK(b >= last_end && b < e && e <= ref.param.numel(), op, "parameter '", n, "': ",
               ranges == &ref.decay_ranges ? "decay" : "frozen", " range [", b, ", ", e,
               ") is empty, out of order, overlapping or outside [0, ", ref.param.numel(), ")");
      last_end = e;
    }
  }
}

}  // namespace

void CheckParamRefs(const char* op, const std::vector<ParamRef>& refs) {
  std::unordered_set<std::string> names;
  for (const ParamRef& ref : refs) {
    CheckOne(op, ref);
    OP_CHECK(names.insert(ref.name).second, op, "parameter name '", ref.name, "' appears twice");
  }
}

}  // namespace optim
