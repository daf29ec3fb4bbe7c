// SGD with momentum, dampening, Nesterov and L2 weight decay, exactly as
// torch.optim.SGD:
//   d = g + weight_decay * p                    (only inside decay_ranges)
//   if momentum != 0:
//     b = d                                     (first step)
//     b = momentum * b + (1 - dampening) * d    (later steps)
//     d = nesterov ? d + momentum * b : b
//   p = p - lr * d
// State: "momentum_buffer" when momentum != 0 (none otherwise), and "step".
#ifndef OPTIM_SGD_H_
#define OPTIM_SGD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizer.h"

namespace optim {

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
};

class SGD : public Optimizer {
 public:
  // Needs lr >= 0, momentum >= 0, weight_decay >= 0, all finite; nesterov
  // needs momentum > 0 and dampening == 0.
  static absl::StatusOr<std::unique_ptr<SGD>> Create(const SgdOptions& options);

  const char* name() const override { return "sgd"; }
  std::string Settings() const override;
  std::vector<std::string> BufferNames() const override;
  const SgdOptions& options() const { return options_; }

 protected:
  void Update(const ParamRef& ref, ParamState& state) override;
  // GPU params: every decay segment of every param of a device in one launch
  // per 32 segments (tensor::cuda::SgdStepMany), which also writes the
  // low-precision copies; CPU params: Update.
  void UpdateAll(const std::vector<Updating>& params) override;
  bool WritesLowPrecisionCopy(const ParamRef& ref) const override {
    return ref.param.device().is_cuda();
  }

 private:
  explicit SGD(const SgdOptions& options) : Optimizer(options.lr), options_(options) {}
  SgdOptions options_;
};

}  // namespace optim

#endif  // OPTIM_SGD_H_
