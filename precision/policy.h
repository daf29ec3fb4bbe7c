// MixedPrecisionPolicy: which dtypes parameters are computed in, gradients
// reduced in and buffers kept in, and which module classes stay fp32.
//
// Master parameters, gradient shards and optimizer state are always fp32; the
// policy only says what the unsharded compute copies and the communication use.
#ifndef PRECISION_POLICY_H_
#define PRECISION_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace precision {

struct MixedPrecisionPolicy {
  // Dtype of the unsharded parameters the layers compute with.
  tensor::Dtype param_dtype = tensor::Dtype::kF32;
  // Dtype gradients are communicated in (all-reduce / reduce-scatter); they land fp32.
  tensor::Dtype reduce_dtype = tensor::Dtype::kF32;
  // Dtype of buffers outside fp32 modules. Only f32 for now (Validate
  // refuses others): no buffer is cast, as with PyTorch's buffer_dtype=None;
  // the nn layers' only buffers, BatchNorm's running statistics, are kept
  // f32 in any case.
  tensor::Dtype buffer_dtype = tensor::Dtype::kF32;
  // Module classes (nn::Module::class_name()) computed entirely in fp32: a
  // module of one and every module inside it keep fp32 parameters
  // (nn::KeptFp32Parameters), as PyTorch FSDP's _module_classes_to_ignore,
  // and their gradients are reduced in fp32: DDP and ZeRO-1 give them
  // buckets of their own; FSDP makes each such module a unit of its own
  // (dist::WrapPolicy::ForMixedPrecision, as PyTorch nests an fp32 unit),
  // gathered and reduced in fp32, the rest staying in reduce_dtype.
  std::vector<std::string> fp32_module_classes = {"BatchNorm1d"};

  // Everything fp32 (no mixed precision).
  static MixedPrecisionPolicy Fp32();
  // bf16 compute and bf16 gradient reduction; fp32 masters; BatchNorm fp32.
  static MixedPrecisionPolicy Bf16();
  // f16 compute and reduction (needs DynamicLossScaler); BatchNorm fp32.
  static MixedPrecisionPolicy Fp16();
  // "fp32" | "bf16" | "fp16" (also "f32", "f16", "bfloat16", ...).
  static absl::StatusOr<MixedPrecisionPolicy> FromName(absl::string_view name);

  bool IsMixed() const { return param_dtype != tensor::Dtype::kF32; }
  // True for classes listed in fp32_module_classes.
  bool KeepsFp32(absl::string_view module_class) const;
  // Dtype a module of this class computes in.
  tensor::Dtype ComputeDtype(absl::string_view module_class) const {
    return KeepsFp32(module_class) ? tensor::Dtype::kF32 : param_dtype;
  }
  // f16 anywhere in the policy: gradients need the dynamic loss scaler.
  bool NeedsLossScaling() const;
  // Every dtype floating and supported by `device` (see dtype_support.h);
  // Unimplemented for a buffer_dtype other than f32.
  absl::Status Validate(tensor::Device device) const;
  // "param=bf16 reduce=bf16 buffer=f32 fp32_modules=[BatchNorm1d]".
  std::string ToString() const;
};

}  // namespace precision

#endif  // PRECISION_POLICY_H_
