// FlatParameter: one FSDP unit's parameters, in registration order, flattened
// and concatenated, right-padded to a multiple of the number of shards and
// split into equal shards. This rank owns one shard as an fp32 tensor (memory
// category kParameters) and an fp32 sharded gradient (kGradients); the full
// ("unsharded") flat parameter exists only transiently, and each Parameter's
// `value` / `grad` are then views (Narrow + View) into the unsharded buffers.
//
// Frozen parameters (requires_grad false, set before FlatParameter is built)
// get no gradient view: their elements of the gradient stay zero, and the
// optimizer skips them (shard_frozen_ranges). A unit whose parameters are all
// frozen has no gradient shard at all (trains() false).
//
// Layout for numel elements over N shards: padded = ceil(numel / N) * N,
// shard_numel = padded / N, shard r = elements [r * shard_numel, (r+1) * shard_numel)
// of the padded flat buffer. The padding is zero.
#ifndef DIST_FLAT_PARAM_H_
#define DIST_FLAT_PARAM_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/parameter.h"
#include "optim/param_ref.h"
#include "tensor/tensor.h"

namespace dist {

class FlatParameter {
 public:
  struct Entry {
    std::string name;  // full name relative to the root module
    nn::Parameter* param = nullptr;
    int64_t offset = 0;  // in the flat buffer
    int64_t numel = 0;
    bool frozen = false;  // requires_grad false when the FlatParameter was built
  };

  // `params`: (full name, parameter) in registration order. num_shards >= 1,
  // shard in [0, num_shards).
  FlatParameter(std::vector<std::pair<std::string, nn::Parameter*>> params, int num_shards,
                int shard);
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  // Allocates and fills this rank's shard (and a zero sharded gradient). For
  // each parameter overlapping the shard: if the parameter already has a value
  // (a materialized model), the overlap is copied from it; otherwise it is
  // initialized by nn::InitSlice(init, seed, full name, ...), which gives the
  // values a single-process Materialize(seed) gives, bit for bit. Parameter
  // values are then dropped (undefined): no full unit is ever allocated here.
  // The shard is filled on the host, then moved to `device` (with the
  // gradient shard); `pinned`: both in page-locked host memory (device must
  // be the CPU; CPU offload, where they travel to and from a GPU).
  void InitShard(uint64_t seed, tensor::Device device = tensor::Device::Cpu(),
                 bool pinned = false);

  const std::vector<Entry>& entries() const { return entries_; }
  int num_shards() const { return num_shards_; }
  int shard_index() const { return shard_index_; }
  int64_t numel() const { return numel_; }                // without padding
  int64_t padded_numel() const { return shard_numel_ * num_shards_; }
  int64_t shard_numel() const { return shard_numel_; }
  // [begin, end) of this rank's shard in the flat buffer.
  int64_t shard_begin() const { return shard_numel_ * shard_index_; }
  int64_t shard_end() const { return shard_begin() + shard_numel_; }

  // fp32 (shard_numel), contiguous, on the device given to InitShard.
  const tensor::Tensor& shard() const { return shard_; }
  const tensor::Tensor& grad_shard() const { return grad_shard_; }
  // Weight-decay ranges of the shard (elements of decayed parameters).
  const optim::ElementRanges& shard_decay_ranges() const { return shard_decay_; }
  // Elements of frozen parameters in the shard (in shard coordinates).
  const optim::ElementRanges& shard_frozen_ranges() const { return shard_frozen_; }
  // Whether any parameter trains (requires_grad). False: no gradient shard
  // (grad_shard() undefined), no gradient views, nothing to reduce or step.
  bool trains() const { return trains_; }
  // Throws tensor::OpError naming a parameter whose requires_grad changed
  // since construction (the layout of gradients and frozen ranges follows it).
  void CheckFrozenUnchanged() const;

  // Points every parameter's value at its view of `flat` (padded_numel elements).
  void SetValueViews(const tensor::Tensor& flat);
  void ClearValues();
  // Zeroes the elements of a flat gradient (fp32, padded_numel) that no
  // gradient view covers: the padding and frozen parameters' elements. With
  // SetGradViews(..., /*unwritten=*/true) a flat gradient made without a
  // memset of the whole is then zero wherever no backward writes.
  void ZeroUncoveredGrad(const tensor::Tensor& flat_grad) const;
  // Points every trainable parameter's grad at its view of `flat_grad` (fp32,
  // padded_numel); frozen ones keep none. `unwritten`: flat_grad's views hold
  // no values yet (memory just allocated): each is marked Parameter::grad_unwritten,
  // so the backward's first gradient writes it instead of adding to it.
  void SetGradViews(const tensor::Tensor& flat_grad, bool unwritten = false);
  // Zeroes the views still unwritten (parameters the backward did not reach)
  // and clears their marks.
  void ZeroUnwrittenGrads();
  void ClearGrads();
  // The first trainable parameter that holds a gradient now, "" when none
  // does: between its unit's backwards none may (its gradient is a view of
  // the unit's flat gradient only while the unit's backward runs).
  std::string FirstWithGrad() const;

  // The sharded gradient dropped (PyTorch's zero_grad(set_to_none=True)):
  // the buffer stays (optimizers hold it) but is marked unwritten instead of
  // zeroed; the next reduced gradient is written into it, not added.
  // ZeroGradShard zeroes it in place and clears the mark; ...IfUnwritten only
  // when marked (a step that no reduce reached: zeros, as before).
  void DropGradShard();
  void ZeroGradShard();
  void ZeroGradShardIfUnwritten();
  bool grad_shard_unwritten() const { return grad_shard_unwritten_; }
  // grad_shard += reduced (shard_numel elements, any float dtype, on
  // grad_shard's device), or grad_shard = reduced when it is unwritten (one
  // pass, no memset or read of the old values); clears the mark.
  void AccumulateGradShard(const tensor::Tensor& reduced);

 private:
  std::vector<Entry> entries_;
  int num_shards_;
  int shard_index_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  tensor::Tensor shard_;
  tensor::Tensor grad_shard_;
  optim::ElementRanges shard_decay_;
  optim::ElementRanges shard_frozen_;
  // Of the whole flat buffer: frozen parameters' elements and the padding,
  // adjacent ones merged (ZeroUncoveredGrad).
  optim::ElementRanges uncovered_grad_;
  bool trains_ = false;
  bool grad_shard_unwritten_ = false;
};

}  // namespace dist

#endif  // DIST_FLAT_PARAM_H_
