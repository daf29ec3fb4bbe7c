// MixedPrecisionPolicy presets and validation.
#include "precision/policy.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "precision/dtype_support.h"

namespace precision {

using tensor::Dtype;

MixedPrecisionPolicy MixedPrecisionPolicy::Fp32() { return MixedPrecisionPolicy(); }

MixedPrecisionPolicy MixedPrecisionPolicy::Bf16() {
  MixedPrecisionPolicy p;
  p.param_dtype = Dtype::kBF16;
  p.reduce_dtype = Dtype::kBF16;
  return p;
}

MixedPrecisionPolicy MixedPrecisionPolicy::Fp16() {
  MixedPrecisionPolicy p;
  p.param_dtype = Dtype::kF16;
  p.reduce_dtype = Dtype::kF16;
  return p;
}

absl::StatusOr<MixedPrecisionPolicy> MixedPrecisionPolicy::FromName(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "fp32" || n == "f32" || n == "float32") return Fp32();
  if (n == "bf16" || n == "bfloat16") return Bf16();
  if (n == "fp16" || n == "f16" || n == "float16") return Fp16();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "'; expected fp32, bf16 or fp16"));
}

bool MixedPrecisionPolicy::KeepsFp32(absl::string_view module_class) const {
  return std::find(fp32_module_classes.begin(), fp32_module_classes.end(), module_class) !=
         fp32_module_classes.end();
}

bool MixedPrecisionPolicy::NeedsLossScaling() const {
  return param_dtype == Dtype::kF16 || reduce_dtype == Dtype::kF16;
}

absl::Status MixedPrecisionPolicy::Validate(tensor::Device device) const {
  if (buffer_dtype != Dtype::kF32) {
    return absl::UnimplementedError(absl::StrCat(
        "mixed precision policy: buffer_dtype=", tensor::DtypeName(buffer_dtype),
        ": casting buffers is not implemented; buffers stay f32 (BatchNorm's running "
        "statistics, the only buffers of the nn layers, are kept f32 in any case)"));
  }
  const std::pair<const char*, Dtype> fields[] = {
      {"param_dtype", param_dtype}, {"reduce_dtype", reduce_dtype}};
  for (const auto& [field, dtype] : fields) {
    absl::Status s = CheckComputeDtype(dtype, device);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mixed precision policy: ", field, "=", tensor::DtypeName(dtype), ": ",
                       s.message()));
    }
  }
  return absl::OkStatus();
}

std::string MixedPrecisionPolicy::ToString() const {
  return absl::StrCat("param=", tensor::DtypeName(param_dtype),
                      " reduce=", tensor::DtypeName(reduce_dtype),
                      " buffer=", tensor::DtypeName(buffer_dtype), " fp32_modules=[",
                      absl::StrJoin(fp32_module_classes, ","), "]");
}

}  // namespace precision
