// Per-step log lines and JSON-lines metrics of the train binaries: one
// step's figures (StepMetrics, StepResult), the refusal of a gradient norm
// that is not finite, the step line, the metrics file, the reporter that
// prints and writes each step, and a monotonic step timer.
#ifndef MODELS_COMMON_STEP_REPORT_H_
#define MODELS_COMMON_STEP_REPORT_H_

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/device.h"
#include "tensor/memory_ledger.h"

namespace train {

// One step's figures.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double ms = 0;
  double tokens_per_s = 0;
  double grad_norm = 0;
  double mfu = 0;  // model FLOPs utilization in [0, 1]; 0: not measured (no known peak)
  double loss_scale = 0;  // the scale of the step's backward; 0: no loss scaling
  bool skipped = false;   // inf/nan gradients at loss_scale: the step was not applied
};

// What the rest of a training step after the micro-batches' forward and
// backward reports (DataParallelModel::FinishTrainingStep,
// train::FinishOneProcessStep).
struct StepResult {
  double loss = 0;       // the step's loss (averaged over the ranks)
  double grad_norm = 0;  // before clipping; 0 when not clipped or the step was skipped
  bool skipped = false;  // loss scaling found inf/nan gradients: no optimizer step
};

// The gradient norm before clipping at `step` (the step lines' count, from
// 1, as the message says it): one that is not finite
// (an inf or NaN gradient with a finite loss, which loss scaling, when on,
// would have caught first) is an InternalError naming the step, returned
// before the optimizer step, so that the weights, and any checkpoint saved
// after, stay finite (PyTorch's clip_grad_norm_(error_if_nonfinite=True)).
absl::Status CheckGradNorm(double norm, int64_t step);

// "step 10 | loss 2.3456 | lr 3.0e-04 | 123.4 ms | 16600 tok/s | peak MiB params 1.2 ..."
// ("| 16600 tok/s | MFU 45.1% |" when m.mfu > 0). Memory: the ledger's peaks
// on `device` ("peak MiB on cuda:0:" when not the CPU).
std::string FormatStep(const StepMetrics& m, const tensor::MemoryLedger& ledger,
                       tensor::Device device = tensor::Device::Cpu());

// Appends one JSON object per line: the step metrics and the ledger's JSON.
class MetricsWriter {
 public:
  // An empty path writes nothing.
  static absl::StatusOr<std::unique_ptr<MetricsWriter>> Open(const std::string& path);
  absl::Status Write(const StepMetrics& m, const tensor::MemoryLedger& ledger);
  // {"step":6,"eval_loss":2.345678,"eval_ms":12.3}: an evaluation after `step`
  // steps (no "loss" key, so readers of the training losses skip it).
  absl::Status WriteEval(int64_t step, double eval_loss, double ms);
  // Resuming after `step` steps: removes the records of later steps, which a
  // run that stopped after its last checkpoint wrote and the resumed run
  // writes again (TensorBoard's purge_step), so the file holds each step
  // once. Lines without a leading "step" stay. The file is rewritten durably.
  absl::Status DropAfter(int64_t step);

 private:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {}
  // Appends one line and flushes it; Unavailable when the file cannot take it.
  absl::Status WriteLine(const std::string& json);
  std::string path_;
  std::ofstream out_;
};

// Reports each step of a train loop: prints the step line (FormatStep) on the
// first step, every log_every-th and the last, appends the metrics, and keeps
// the mean over the steps after the first (which includes one-time set-up).
class StepReporter {
 public:
  // Steps first_step+1 .. last_step (1-based) will be reported; each moves
  // tokens_per_step tokens; `metrics` may write nothing (empty path). The
  // step lines show the peak memory on `device` (where the model computes).
  StepReporter(const tensor::MemoryLedger& ledger, MetricsWriter& metrics, int64_t first_step,
               int64_t last_step, int64_t log_every, double tokens_per_step,
               tensor::Device device = tensor::Device::Cpu());
  // Model FLOPs utilization on the step lines, the metrics and the summary:
  // each step does flops_per_step model FLOPs (every rank's tokens) against
  // a peak of peak_flops FLOP/s (models/common/mfu.h). Off while either is 0.
  void SetMfu(double flops_per_step, double peak_flops);
  // m.step is 1-based; m.tokens_per_s (and m.mfu) are computed here from m.ms.
  absl::Status Report(StepMetrics m);
  // The same for the step that ended `step_done` (1-based) with `result`, at
  // learning rate `lr`, in `ms`, its backward at `loss_scale` (0: no scaling).
  absl::Status Report(int64_t step_done, const StepResult& result, double lr, double ms,
                      double loss_scale = 0);
  // Times evaluate() (collective under data parallelism: every rank calls it)
  // and, when `log`, reports its loss after step_done steps: prints "eval
  // after step 6 | loss 2.3457 | 12.3 ms" and appends MetricsWriter::WriteEval's
  // line.
  absl::Status TimedEval(int64_t step_done, bool log,
                         const std::function<absl::StatusOr<double>()>& evaluate);
  // "mean 12.3 ms/step, 4567 tokens/s<tokens_note> over N steps (after the first)",
  // printed when any step after the first was reported (", MFU 45.1%" before
  // " over" when measured).
  void PrintSummary(absl::string_view tokens_note = "") const;

 private:
  absl::Status ReportEval(int64_t step, double eval_loss, double ms);

  const tensor::MemoryLedger& ledger_;
  MetricsWriter& metrics_;
  const int64_t first_step_;
  const int64_t last_step_;
  const int64_t log_every_;
  const double tokens_per_step_;
  const tensor::Device device_;
  double flops_per_step_ = 0;
  double peak_flops_ = 0;
  double total_ms_ = 0;
  int64_t timed_steps_ = 0;
};

class StepTimer {
 public:
  void Start() { start_ = std::chrono::steady_clock::now(); }
  double ElapsedMs() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace train

#endif  // MODELS_COMMON_STEP_REPORT_H_
