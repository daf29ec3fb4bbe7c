// Mixed precision for a module trained in one process (FSDP does the same per
// unit on its flat parameters): fp32 master weights, low-precision compute
// copies for the forward and backward, fp32 gradients.
//
// A step reads top to bottom:
//   mp.CastForCompute();      // p.value = bf16 copy of the master (fp32 module classes keep fp32)
//   model.ForwardBackward();  // layers compute in bf16; gradients land fp32 in p.grad
//   mp.RestoreMasters();      // p.value = the fp32 master again
//   optimizer.Step(...);      // updates the masters
//
// Or, with the optimizer writing the next step's copies as it updates the
// masters (as DeepSpeed's optimizers write the fp16 params; AdamW on a GPU
// does it in its update's pass, saving the cast's read of every master):
//   mp.RestoreMastersKeepingCopies();
//   ref.low_precision_copy = mp.ComputeCopyToWrite(ref.param);  // each ref
//   optimizer.Step(refs);     // masters and their copies
//   mp.CastForCompute();      // next step: the written copies, no cast
#ifndef NN_MIXED_PRECISION_H_
#define NN_MIXED_PRECISION_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "nn/module.h"
#include "precision/policy.h"

namespace nn {

class MixedPrecision {
 public:
  // Applies `policy` to every parameter of `root` whose owning module's class
  // is not kept fp32 by the policy. Parameters must be materialized fp32.
  MixedPrecision(Module& root, precision::MixedPrecisionPolicy policy);

  const precision::MixedPrecisionPolicy& policy() const { return policy_; }
  // Sets each managed parameter's value to a param_dtype copy of its master:
  // the copy handed out by ComputeCopyToWrite since the last call, else a
  // fresh cast (batched: a launch per 64 parameters on a GPU).
  void CastForCompute();
  // Sets each managed parameter's value back to its fp32 master; the compute
  // copies are dropped (freed once nothing else holds them).
  void RestoreMasters();
  // As RestoreMasters, but keeps this step's compute copies for
  // ComputeCopyToWrite (until the next CastForCompute).
  void RestoreMastersKeepingCopies();
  // The kept compute copy of the parameter whose master is `master` (the
  // same tensor: an optim::ParamRef's param after the restore), for an
  // optimizer to overwrite with the updated master's cast
  // (optim::ParamRef::low_precision_copy). The next CastForCompute then uses
  // it as is. Undefined when `master` is no managed parameter's or no copy
  // was kept. The copy holds the master's cast when handed out, so it stays
  // right if the optimizer skips the parameter; nothing else may change the
  // master before the next CastForCompute.
  tensor::Tensor ComputeCopyToWrite(const tensor::Tensor& master);
  // Number of parameters computed in low precision, and kept fp32.
  int num_cast() const { return static_cast<int>(entries_.size()); }
  int num_kept_fp32() const { return num_kept_fp32_; }

 private:
  struct Entry {
    Parameter* param;
    Tensor master;          // fp32
    Tensor kept;            // this step's compute copy (RestoreMastersKeepingCopies), or none
    bool handed_out = false;  // kept went to ComputeCopyToWrite: the next compute copy
  };
  void Restore(bool keep_copies);
  precision::MixedPrecisionPolicy policy_;
  std::vector<Entry> entries_;
  // entries_ indices by their master's data (ComputeCopyToWrite's lookup).
  std::unordered_multimap<const void*, size_t> by_master_;
  int num_kept_fp32_ = 0;
};

}  // namespace nn

#endif  // NN_MIXED_PRECISION_H_
