// Learning-rate schedules: the lr to use at each optimizer step, and parsing
// one from a train flag such as
//   "constant:lr=3e-4"
//   "cosine:max_lr=6e-4,min_lr=6e-5,warmup_steps=700,total_steps=19073"
#ifndef OPTIM_LR_SCHEDULE_H_
#define OPTIM_LR_SCHEDULE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The lr of step `step` (0-based: the first optimizer step is step 0).
  // Negative steps are treated as 0.
  virtual double LrAt(int64_t step) const = 0;
  // The schedule in the form ParseLrSchedule reads.
  virtual std::string ToString() const = 0;
};

class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double LrAt(int64_t step) const override { return lr_; }
  std::string ToString() const override;

 private:
  double lr_;
};

// nanoGPT's schedule (as in Karpathy's build-nanogpt):
//   step < warmup_steps:                max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total_steps: min_lr + (max_lr - min_lr) * 0.5 *
//       (1 + cos(pi * (step - warmup_steps) / (total_steps - warmup_steps)))
//   step >= total_steps:                min_lr
class WarmupCosine : public LrSchedule {
 public:
  // Needs 0 <= min_lr <= max_lr (finite) and 0 <= warmup_steps <= total_steps.
  static absl::StatusOr<std::unique_ptr<WarmupCosine>> Create(double max_lr, double min_lr,
                                                              int64_t warmup_steps,
                                                              int64_t total_steps);
  double LrAt(int64_t step) const override;
  std::string ToString() const override;

 private:
  WarmupCosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
      : max_lr_(max_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {}
  double max_lr_;
  double min_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

struct LrScheduleOptions {
  std::string kind = "constant";  // "constant" or "cosine"
  double lr = 1e-3;               // constant
  double max_lr = 1e-3;           // cosine
  double min_lr = 0.0;            // cosine
  int64_t warmup_steps = 0;       // cosine
  int64_t total_steps = 0;        // cosine
};

// The schedule `options` describe; an error names a bad kind or value.
absl::StatusOr<std::unique_ptr<LrSchedule>> MakeLrSchedule(const LrScheduleOptions& options);

// A spec as written: its kind, the keys it names and their values in
// `options` (the keys it leaves out keep LrScheduleOptions' defaults).
struct LrSpec {
  LrScheduleOptions options;
  std::set<std::string> keys;
};

// Reads "KIND" or "KIND:key=value,key=value" (keys as in LrScheduleOptions;
// constant: lr; cosine: max_lr, min_lr, warmup_steps, total_steps) without
// requiring any key: for a caller that fills in the ones left out (a train
// binary: the rate from --lr, total_steps from --steps). Errors name the bad
// kind, key or value.
absl::StatusOr<LrSpec> ParseLrSpec(absl::string_view spec);

// ParseLrSpec, where constant needs lr and cosine needs max_lr and
// total_steps, then the schedule (MakeLrSchedule).
absl::StatusOr<std::unique_ptr<LrSchedule>> ParseLrSchedule(absl::string_view spec);

}  // namespace optim

#endif  // OPTIM_LR_SCHEDULE_H_
