// Module state dicts.
#include "nn/state_dict.h"

#include <map>

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

absl::Status LoadStateDict(Module& module, const tensor::NamedTensors& state,
                           const std::string& prefix) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("state dict names '", name, "' twice"));
    }
  }
  struct Target {
    std::string name;
    Tensor* dst;  // the parameter value or buffer to fill
    tensor::Shape shape;
    const Tensor* src;
  };
  std::vector<Target> targets;
  for (auto& [name, p] : module.NamedParameters()) {
    targets.push_back({prefix + name, &p->value, p->shape, nullptr});
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    targets.push_back({prefix + name, b, b->shape(), nullptr});
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
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  for (Target& t : targets) {
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

}  // namespace nn
