// Mixed precision for a module trained in one process (FSDP does the same per
// unit on its flat parameters): fp32 master weights, low-precision compute
// copies for the forward and backward, fp32 gradients.
//
// A step reads top to bottom:
//   mp.CastForCompute();      // p.value = bf16 copy of the master (fp32 module classes keep fp32)
//   model.ForwardBackward();  // layers compute in bf16; gradients land fp32 in p.grad
//   mp.RestoreMasters();      // p.value = the fp32 master again
//   optimizer.Step(...);      // updates the masters
#ifndef NN_MIXED_PRECISION_H_
#define NN_MIXED_PRECISION_H_

#include <string>
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
  // Sets each managed parameter's value to a param_dtype copy of its master.
  void CastForCompute();
  // Sets each managed parameter's value back to its fp32 master.
  void RestoreMasters();
  // Number of parameters computed in low precision, and kept fp32.
  int num_cast() const { return static_cast<int>(entries_.size()); }
  int num_kept_fp32() const { return num_kept_fp32_; }

 private:
  struct Entry {
    Parameter* param;
    Tensor master;  // fp32
  };
  precision::MixedPrecisionPolicy policy_;
  std::vector<Entry> entries_;
  int num_kept_fp32_ = 0;
};

}  // namespace nn

#endif  // NN_MIXED_PRECISION_H_
