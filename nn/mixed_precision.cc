// Mixed-precision casts of module parameters.
#include "nn/mixed_precision.h"

#include <vector>

#include "tensor/memory_ledger.h"

namespace nn {

MixedPrecision::MixedPrecision(Module& root, precision::MixedPrecisionPolicy policy)
    : policy_(std::move(policy)) {
  if (!policy_.IsMixed()) return;
  for (auto& [prefix, module] : root.NamedModules()) {
    const bool keep = policy_.KeepsFp32(module->class_name());
    for (auto& [name, p] : module->LocalParameters()) {
      OP_CHECK(p->value.defined() && p->value.dtype() == tensor::Dtype::kF32, "mixed_precision",
               "parameter ", prefix, prefix.empty() ? "" : ".", name,
               " must be materialized in f32 before mixed precision is applied");
      if (keep) {
        ++num_kept_fp32_;
      } else {
        entries_.push_back({p, p->value});
      }
    }
  }
}

void MixedPrecision::CastForCompute() {
  // The compute copies live for one step, like FSDP's unsharded parameters.
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  std::vector<tensor::Tensor> masters;
  masters.reserve(entries_.size());
  for (const Entry& e : entries_) masters.push_back(e.master);
  // On a GPU a launch per 64 parameters, not one each.
  std::vector<tensor::Tensor> compute = tensor::CastAll(masters, policy_.param_dtype);
  for (size_t i = 0; i < entries_.size(); ++i) entries_[i].param->value = compute[i];
}

void MixedPrecision::RestoreMasters() {
  for (Entry& e : entries_) e.param->value = e.master;
}

}  // namespace nn
