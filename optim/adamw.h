// AdamW (decoupled weight decay), exactly as torch.optim.AdamW (amsgrad off):
//   t += 1
//   p = p * (1 - lr * weight_decay)             (only inside decay_ranges)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: "exp_avg" (m), "exp_avg_sq" (v) and "step" (t).
#ifndef OPTIM_ADAMW_H_
#define OPTIM_ADAMW_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizer.h"

namespace optim {

// Defaults are PyTorch's.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  // Needs lr >= 0, 0 <= beta1 < 1, 0 <= beta2 < 1, eps >= 0,
  // weight_decay >= 0, all finite.
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(const AdamWOptions& options);

  const char* name() const override { return "adamw"; }
  std::string Settings() const override;
  std::vector<std::string> BufferNames() const override { return {"exp_avg", "exp_avg_sq"}; }
  const AdamWOptions& options() const { return options_; }

 protected:
  void Update(const ParamRef& ref, ParamState& state) override;
  // GPU params: every decay segment of every param of a device in one
  // launch per 32 segments (tensor::cuda::AdamWStepMany); CPU params: Update.
  void UpdateAll(const std::vector<Updating>& params) override;
  // GPU params: the update's kernel writes the bf16 / f16 copy as it stores
  // the param (2 bytes more a element written, where a cast afterwards reads
  // the param's 4 again and writes the 2).
  bool WritesLowPrecisionCopy(const ParamRef& ref) const override {
    return ref.param.device().is_cuda();
  }

 private:
  explicit AdamW(const AdamWOptions& options) : Optimizer(options.lr), options_(options) {}
  AdamWOptions options_;
};

}  // namespace optim

#endif  // OPTIM_ADAMW_H_
