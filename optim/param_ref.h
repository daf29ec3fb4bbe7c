// ParamRef: what an optimizer updates. A name, an fp32 parameter tensor updated
// in place, its fp32 gradient, and the element ranges where weight decay
// applies. A ref may be a whole parameter or a shard (a view) of an FSDP flat
// buffer, which mixes weights (decayed) with biases and norm weights (not), so
// optimizers never assume they see whole parameters.
#ifndef OPTIM_PARAM_REF_H_
#define OPTIM_PARAM_REF_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace optim {

// [begin, end) element ranges of a tensor, in its flat (row-major) order.
using ElementRanges = std::vector<std::pair<int64_t, int64_t>>;

struct ParamRef {
  // Names the optimizer state ("h.0.attn.c_attn.weight", or a shard's name).
  std::string name;
  // fp32, contiguous, on the CPU or a CUDA device; updated in place.
  tensor::Tensor param;
  // fp32, contiguous, same shape and device as param.
  tensor::Tensor grad;
  // Where weight decay applies: sorted, disjoint, non-empty ranges within
  // [0, param.numel()). Elements outside get no decay.
  ElementRanges decay_ranges;
  // Elements of frozen parameters (nn::Parameter::requires_grad false) inside
  // a flat buffer that also holds trainable ones (an FSDP unit's shard): the
  // optimizer leaves them, and their state, as they are (no update, no weight
  // decay). Sorted, disjoint, non-empty ranges within [0, param.numel()).
  ElementRanges frozen_ranges;
  // Optional: a bf16 or f16 copy of param (same shape and device,
  // contiguous) that the step leaves holding the updated param cast to its
  // dtype (round to nearest even): the compute copy of mixed precision for
  // the next step (nn::MixedPrecision::ComputeCopyToWrite). AdamW on a GPU
  // writes it in its update's pass; other updates cast after theirs. The
  // elements in frozen_ranges may be left alone: the copy must already hold
  // their cast.
  tensor::Tensor low_precision_copy;
};

// A ref over a whole tensor, decayed everywhere (decay = true) or nowhere.
ParamRef MakeParamRef(std::string name, tensor::Tensor param, tensor::Tensor grad, bool decay);

// One ref per parameter of `module`, named as NamedParameters() names it, with
// decay over the whole parameter iff Parameter::weight_decay. Parameters
// without a value or without a gradient, and frozen ones, are skipped. The refs share the
// parameters' tensors (no copy). Throws tensor::OpError naming a trainable
// parameter a wrapper holds (Parameter::held_by: FSDP, ZeRO-1), whose
// optimizer steps on the wrapper's shards instead.
std::vector<ParamRef> FromModule(nn::Module& module);

// The part of `ranges` (sorted, disjoint) inside [begin, end), shifted so that
// `begin` becomes 0: the decay ranges of a slice of a flat buffer.
ElementRanges SliceRanges(const ElementRanges& ranges, int64_t begin, int64_t end);

// Throws tensor::OpError ("[op] ...", naming the ref) unless every ref is
// valid: param and grad defined, fp32, on one device, contiguous and of the
// same shape; decay and frozen ranges sorted, disjoint, non-empty and within
// the parameter; a low-precision copy, if any, bf16 or f16, contiguous, of the
// param's shape and device; names unique among `refs`.
void CheckParamRefs(const char* op, const std::vector<ParamRef>& refs);

}  // namespace optim

#endif  // OPTIM_PARAM_REF_H_
