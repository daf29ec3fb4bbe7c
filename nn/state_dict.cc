// Module state dicts.
#include "nn/state_dict.h"

#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nn {

tensor::NamedTensors StateDict(Module& module, const std::string& prefix) {
  tensor::NamedTensors out;
  for (auto& [name, p] : module.NamedParameters()) {
    out.emplace_back(prefix + name, p->value.To(tensor::Device::Cpu()).To(tensor::Dtype::kF32));
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    out.emplace_back(prefix + name, b->To(tensor::Device::Cpu()));
  }
  return out;
}

namespace {

struct Target {
  std::string name;
  Tensor* dst;       // the parameter value or buffer to fill
  Parameter* param;  // the parameter; nullptr for a buffer
  tensor::Shape shape;
  const Tensor* src;
};

// Pairs every parameter and buffer of `module` with its entry of `state`,
// checking names, shapes and dtypes as LoadStateDict documents.
absl::StatusOr<std::vector<Target>> MatchStateDict(Module& module,
                                                   const tensor::NamedTensors& state,
                                                   const std::string& prefix) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("state dict names '", name, "' twice"));
    }
  }
  std::vector<Target> targets;
  for (auto& [name, p] : module.NamedParameters()) {
    targets.push_back({prefix + name, &p->value, p, p->shape, nullptr});
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    targets.push_back({prefix + name, b, nullptr, b->shape(), nullptr});
  }
  std::vector<std::string> missing;
  for (Target& t : targets) {
    auto it = given.find(t.name);
    if (it == given.end()) {
      missing.push_back(t.name);
      continue;
    }
    t.src = it->second;
    given.erase(it);
    if (t.src->shape() != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat("state dict entry '", t.name, "' has shape ",
                                                     t.src->shape().ToString(),
                                                     ", the model expects ", t.shape.ToString()));
    }
    if (!tensor::IsFloatingPoint(t.src->dtype()) && t.dst->defined() &&
        tensor::IsFloatingPoint(t.dst->dtype())) {
      return absl::InvalidArgumentError(absl::StrCat("state dict entry '", t.name, "' has dtype ",
                                                     tensor::DtypeName(t.src->dtype()),
                                                     ", expected a floating dtype"));
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict lacks ", missing.size(), " entries: ",
                     absl::StrJoin(missing.begin(),
                                   missing.begin() + std::min<size_t>(missing.size(), 5), ", "),
                     missing.size() > 5 ? ", ..." : ""));
  }
  if (!given.empty()) {
    std::vector<std::string> unknown;
    for (const auto& [name, t] : given) unknown.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat("state dict has entries the model lacks: ",
                                                   absl::StrJoin(unknown, ", ")));
  }
  return targets;
}

}  // namespace

absl::Status LoadStateDict(Module& module, const tensor::NamedTensors& state,
                           const std::string& prefix) {
  absl::StatusOr<std::vector<Target>> targets = MatchStateDict(module, state, prefix);
  if (!targets.ok()) return targets.status();
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  for (Target& t : *targets) {
    if (!t.dst->defined()) {
      *t.dst = Tensor::Empty(t.shape, tensor::Dtype::kF32);
    }
    Tensor src = t.src->To(t.dst->dtype());
    if (t.dst->device().is_cpu()) {
      t.dst->CopyFrom(src);
    } else {
      t.dst->CopyFrom(src.To(t.dst->device()));
    }
  }
  return absl::OkStatus();
}

absl::Status InitFromStateDict(Module& module, const tensor::NamedTensors& state,
                               const std::string& prefix) {
  absl::StatusOr<std::vector<Target>> targets = MatchStateDict(module, state, prefix);
  if (!targets.ok()) return targets.status();
  for (Target& t : *targets) {
    if (t.param == nullptr) continue;
    if (t.param->value.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter '", t.name,
                       "' already has values: initialize from a state dict before "
                       "materializing or sharding"));
    }
  }
  for (Target& t : *targets) {
    if (t.param != nullptr) {
      const Tensor& src = *t.src;
      t.param->init = InitSpec::From(src.device().is_cpu() && src.dtype() == tensor::Dtype::kF32
                                         ? src.Contiguous()
                                         : src.To(tensor::Device::Cpu()).To(tensor::Dtype::kF32));
    } else {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
      if (!t.dst->defined()) *t.dst = Tensor::Empty(t.shape, t.src->dtype());
      t.dst->CopyFrom(t.src->To(t.dst->dtype()).To(t.dst->device()));
    }
  }
  return absl::OkStatus();
}

void ReleaseInitValues(Module& module) {
  for (auto& [name, p] : module.NamedParameters()) {
    if (p->init.kind == InitSpec::Kind::kFrom) p->init.from = Tensor();
  }
}

}  // namespace nn
