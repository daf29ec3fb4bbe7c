// Mixed-precision casts of module parameters.
#include "nn/mixed_precision.h"

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
  for (Entry& e : entries_) e.param->value = e.master.To(policy_.param_dtype);
}

void MixedPrecision::RestoreMasters() {
  for (Entry& e : entries_) e.param->value = e.master;
}

}  // namespace nn
