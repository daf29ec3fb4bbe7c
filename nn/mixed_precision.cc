// Mixed-precision casts of module parameters.
#include "nn/mixed_precision.h"

#include <set>
#include <vector>

#include "nn/fp32_modules.h"
#include "tensor/memory_ledger.h"

namespace nn {

MixedPrecision::MixedPrecision(Module& root, precision::MixedPrecisionPolicy policy)
    : policy_(std::move(policy)) {
  if (!policy_.IsMixed()) return;
  const std::set<const Parameter*> kept = KeptFp32Parameters(root, policy_.fp32_module_classes);
  for (auto& [prefix, module] : root.NamedModules()) {
    for (auto& [name, p] : module->LocalParameters()) {
      const bool keep = kept.count(p) > 0;
      OP_CHECK(p->value.defined() && p->value.dtype() == tensor::Dtype::kF32, "mixed_precision",
               "parameter ", prefix, prefix.empty() ? "" : ".", name,
               " must be materialized in f32 before mixed precision is applied");
      if (keep) {
        ++num_kept_fp32_;
      } else {
        by_master_.emplace(p->value.raw_data(), entries_.size());
        entries_.push_back({p, p->value});
      }
    }
  }
}

void MixedPrecision::CastForCompute() {
  // The compute copies live for one step, like FSDP's unsharded parameters.
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  std::vector<tensor::Tensor> masters;
  std::vector<size_t> cast;  // entries_ indices of `masters`
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.handed_out) {
      e.param->value = e.kept;  // written by the optimizer's step
    } else {
      masters.push_back(e.master);
      cast.push_back(i);
    }
    e.kept = tensor::Tensor();
    e.handed_out = false;
  }
  // On a GPU a launch per 64 parameters, not one each.
  std::vector<tensor::Tensor> compute = tensor::CastAll(masters, policy_.param_dtype);
  for (size_t k = 0; k < cast.size(); ++k) entries_[cast[k]].param->value = compute[k];
}

void MixedPrecision::Restore(bool keep_copies) {
  for (Entry& e : entries_) {
    const bool cast = e.param->value.defined() && e.param->value.raw_data() != e.master.raw_data();
    e.kept = keep_copies && cast ? e.param->value : tensor::Tensor();
    e.handed_out = false;
    e.param->value = e.master;
  }
}

void MixedPrecision::RestoreMasters() { Restore(/*keep_copies=*/false); }

void MixedPrecision::RestoreMastersKeepingCopies() { Restore(/*keep_copies=*/true); }

tensor::Tensor MixedPrecision::ComputeCopyToWrite(const tensor::Tensor& master) {
  if (!master.defined()) return tensor::Tensor();
  auto [first, last] = by_master_.equal_range(master.raw_data());
  for (auto it = first; it != last; ++it) {
    Entry& e = entries_[it->second];
    // A parameter shared by two modules has two entries; the restore kept
    // the copy in the first.
    if (!e.kept.defined() || e.master.shape() != master.shape()) continue;
    e.handed_out = true;
    return e.kept;
  }
  return tensor::Tensor();
}

}  // namespace nn
