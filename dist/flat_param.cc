// FlatParameter (flat_param.h): flattening, padding and sharding one FSDP unit's
// parameters, and the views into its shard and unsharded buffers.
#include "dist/flat_param.h"

#include <algorithm>

#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"

namespace dist {

FlatParameter::FlatParameter(std::vector<std::pair<std::string, nn::Parameter*>> params,
                             int num_shards, int shard)
    : num_shards_(num_shards), shard_index_(shard) {
  OP_CHECK(num_shards >= 1 && shard >= 0 && shard < num_shards, "FlatParameter", "shard ", shard,
           " of ", num_shards);
  optim::ElementRanges decay, frozen;
  // Appends [begin, end) to `ranges`, merged with the last range when adjacent.
  auto append = [](optim::ElementRanges& ranges, int64_t begin, int64_t end) {
    if (begin == end) return;
    if (!ranges.empty() && ranges.back().second == begin) {
      ranges.back().second = end;
    } else {
      ranges.emplace_back(begin, end);
    }
  };
  for (auto& [name, p] : params) {
    Entry e;
    e.name = name;
    e.param = p;
    e.offset = numel_;
    e.numel = p->numel();
    if (p->weight_decay) append(decay, e.offset, e.offset + e.numel);
    e.frozen = !p->requires_grad;
    if (p->requires_grad) {
      trains_ = true;
    } else {
      append(frozen, e.offset, e.offset + e.numel);
    }
    numel_ += e.numel;
    entries_.push_back(std::move(e));
  }
  shard_numel_ = (numel_ + num_shards - 1) / num_shards;
  if (shard_numel_ == 0) shard_numel_ = 1;  // keep every tensor non-empty
  shard_decay_ = optim::SliceRanges(decay, shard_begin(), shard_end());
  shard_frozen_ = optim::SliceRanges(frozen, shard_begin(), shard_end());
  // What no gradient view covers: the frozen ranges and the padding.
  uncovered_grad_ = frozen;
  append(uncovered_grad_, numel_, padded_numel());
}

void FlatParameter::InitShard(uint64_t seed, tensor::Device device, bool pinned) {
  OP_CHECK(!pinned || device.is_cpu(), "FlatParameter", "pinned shards are host memory, not ",
           device.ToString());
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    shard_ = tensor::Tensor::Zeros({shard_numel_}, tensor::Dtype::kF32);  // on the host
  }
  if (trains_) {  // a unit of frozen parameters has no gradient
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
    if (pinned) {
      grad_shard_ = tensor::Tensor::EmptyPinned({shard_numel_}, tensor::Dtype::kF32);
      tensor::Zero(grad_shard_);
    } else {
      grad_shard_ = tensor::Tensor::Zeros({shard_numel_}, tensor::Dtype::kF32, device);
    }
  }
  const int64_t begin = shard_begin();
  const int64_t end = shard_end();
  for (Entry& e : entries_) {
    const int64_t lo = std::max(begin, e.offset);
    const int64_t hi = std::min(end, e.offset + e.numel);
    if (lo < hi) {
      tensor::Tensor out = shard_.Narrow(0, lo - begin, hi - lo);
      if (e.param->value.defined()) {
        out.CopyFrom(e.param->value.Reshape({e.numel}).Narrow(0, lo - e.offset, hi - lo));
      } else {
        nn::InitSlice(e.param->init, seed, e.name, lo - e.offset, out);
      }
    }
    e.param->value = tensor::Tensor();
    e.param->grad = tensor::Tensor();
  }
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
  if (!device.is_cpu()) {
    shard_ = shard_.To(device);
  } else if (pinned) {
    tensor::Tensor page_locked = tensor::Tensor::EmptyPinned({shard_numel_}, tensor::Dtype::kF32);
    page_locked.CopyFrom(shard_);
    shard_ = page_locked;
  }
}

void FlatParameter::SetValueViews(const tensor::Tensor& flat) {
  OP_CHECK(flat.numel() == padded_numel() && flat.is_contiguous(), "FlatParameter",
           "flat buffer of ", flat.numel(), " elements, expected ", padded_numel());
  for (Entry& e : entries_) e.param->value = flat.Narrow(0, e.offset, e.numel).View(e.param->shape);
}

void FlatParameter::ClearValues() {
  for (Entry& e : entries_) e.param->value = tensor::Tensor();
}

void FlatParameter::ZeroUncoveredGrad(const tensor::Tensor& flat_grad) const {
  OP_CHECK(flat_grad.numel() == padded_numel() && flat_grad.is_contiguous() &&
               flat_grad.dtype() == tensor::Dtype::kF32,
           "FlatParameter", "flat gradient of ", flat_grad.numel(), " elements, expected ",
           padded_numel());
  // Runs of adjacent frozen parameters, and the padding, one memset each.
  for (const auto& [begin, end] : uncovered_grad_) {
    tensor::Zero(flat_grad.Narrow(0, begin, end - begin));
  }
}

void FlatParameter::SetGradViews(const tensor::Tensor& flat_grad, bool unwritten) {
  OP_CHECK(flat_grad.numel() == padded_numel() && flat_grad.is_contiguous() &&
               flat_grad.dtype() == tensor::Dtype::kF32,
           "FlatParameter", "flat gradient of ", flat_grad.numel(), " elements, expected ",
           padded_numel());
  for (Entry& e : entries_) {
    if (!e.frozen) {
      e.param->grad = flat_grad.Narrow(0, e.offset, e.numel).View(e.param->shape);
      e.param->grad_unwritten = unwritten;
    }
  }
}

std::string FlatParameter::FirstWithGrad() const {
  for (const Entry& e : entries_) {
    if (!e.frozen && e.param->grad.defined()) return e.name;
  }
  return "";
}

void FlatParameter::ZeroUnwrittenGrads() {
  for (Entry& e : entries_) e.param->ZeroGradIfUnwritten();
}

void FlatParameter::CheckFrozenUnchanged() const {
  for (const Entry& e : entries_) {
    OP_CHECK(e.frozen == !e.param->requires_grad, "fsdp", "parameter ", e.name, " was ",
             e.frozen ? "unfrozen" : "frozen",
             " (requires_grad) after FullyShard; set requires_grad before wrapping the model");
  }
}

void FlatParameter::ClearGrads() {
  for (Entry& e : entries_) e.param->DropGrad();
}

void FlatParameter::DropGradShard() { grad_shard_unwritten_ = trains_; }

void FlatParameter::ZeroGradShard() {
  if (!trains_) return;
  tensor::Zero(grad_shard_);
  grad_shard_unwritten_ = false;
}

void FlatParameter::ZeroGradShardIfUnwritten() {
  if (grad_shard_unwritten_) ZeroGradShard();
}

void FlatParameter::AccumulateGradShard(const tensor::Tensor& reduced) {
  OP_CHECK(trains_, "fsdp", "a reduced gradient for a unit that does not train");
  if (grad_shard_unwritten_) {
    tensor::Tensor shard = grad_shard_;  // a handle: writes grad_shard_'s storage
    shard.CopyFrom(reduced);
  } else {
    tensor::AddInPlace(grad_shard_, reduced);
  }
  grad_shard_unwritten_ = false;
}

}  // namespace dist
