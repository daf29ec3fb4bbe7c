// Per-step log lines and JSON-lines metrics of the train binaries.
#include "models/common/step_report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/durable_file.h"

namespace train {

absl::Status CheckGradNorm(double norm, int64_t step) {
  if (std::isfinite(norm)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "the gradient norm is ", norm, " at step ", step,
      " (the loss was finite); the step was not applied; lower --lr or check the data"));
}

std::string FormatStep(const StepMetrics& m, const tensor::MemoryLedger& ledger,
                       tensor::Device device) {
  constexpr double kMiB = 1024.0 * 1024.0;
  using tensor::MemoryCategory;
  auto peak = [&](MemoryCategory c) { return ledger.Stats(device, c).peak / kMiB; };
  const std::string where = device.is_cpu() ? "" : " on " + device.ToString();
  const std::string mfu = m.mfu > 0 ? absl::StrFormat(" | MFU %.1f%%", 100 * m.mfu) : "";
  return absl::StrFormat(
      "step %5d | loss %.4f | lr %.2e | %7.1f ms | %8.0f tok/s%s | peak MiB%s: params %.1f grads "
      "%.1f optim %.1f act %.1f comm %.1f tmp %.1f total %.1f",
      m.step, m.loss, m.lr, m.ms, m.tokens_per_s, mfu, where, peak(MemoryCategory::kParameters),
      peak(MemoryCategory::kGradients), peak(MemoryCategory::kOptimizerState),
      peak(MemoryCategory::kActivations), peak(MemoryCategory::kCommunication),
      peak(MemoryCategory::kTemporaries), ledger.Total(device).peak / kMiB);
}

absl::StatusOr<std::unique_ptr<MetricsWriter>> MetricsWriter::Open(const std::string& path) {
  std::unique_ptr<MetricsWriter> w(new MetricsWriter(path));
  if (path.empty()) return w;
  w->out_.open(path, std::ios::app);
  if (!w->out_) {
    return absl::UnavailableError(
        absl::StrCat("cannot open '", path, "' for append: ", std::strerror(errno)));
  }
  return w;
}

absl::Status MetricsWriter::Write(const StepMetrics& m, const tensor::MemoryLedger& ledger) {
  if (path_.empty()) return absl::OkStatus();  // before formatting the ledger
  std::string extras = m.mfu > 0 ? absl::StrFormat("\"mfu\":%.4f,", m.mfu) : "";
  if (m.loss_scale > 0) {
    absl::StrAppend(&extras, absl::StrFormat("\"loss_scale\":%.17g,", m.loss_scale),
                    m.skipped ? "\"skipped\":true," : "");
  }
  return WriteLine(absl::StrFormat(
      "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
      "\"grad_norm\":%.6g,%s\"memory\":%s}",
      m.step, m.loss, m.lr, m.ms, m.tokens_per_s, m.grad_norm, extras, ledger.ToJson()));
}

absl::Status MetricsWriter::WriteEval(int64_t step, double eval_loss, double ms) {
  if (path_.empty()) return absl::OkStatus();
  return WriteLine(
      absl::StrFormat("{\"step\":%d,\"eval_loss\":%.6f,\"eval_ms\":%.3f}", step, eval_loss, ms));
}

absl::Status MetricsWriter::DropAfter(int64_t step) {
  if (path_.empty()) return absl::OkStatus();
  out_.close();
  std::string kept;
  {
    std::ifstream in(path_);
    std::string line;
    constexpr absl::string_view kStep = "{\"step\":";
    while (std::getline(in, line)) {
      int64_t line_step = 0;
      if (absl::StartsWith(line, kStep)) {
        const absl::string_view rest = absl::string_view(line).substr(kStep.size());
        if (absl::SimpleAtoi(rest.substr(0, rest.find_first_of(",}")), &line_step) &&
            line_step > step) {
          continue;
        }
      }
      absl::StrAppend(&kept, line, "\n");
    }
  }
  absl::Status s = tensor::WriteFileDurably(path_, kept);
  out_.open(path_, std::ios::app);
  if (s.ok() && !out_) {
    s = absl::UnavailableError(
        absl::StrCat("cannot open '", path_, "' for append: ", std::strerror(errno)));
  }
  return s;
}

absl::Status MetricsWriter::WriteLine(const std::string& json) {
  out_ << json << "\n";
  out_.flush();
  if (!out_) return absl::UnavailableError(absl::StrCat("cannot write to '", path_, "'"));
  return absl::OkStatus();
}

StepReporter::StepReporter(const tensor::MemoryLedger& ledger, MetricsWriter& metrics,
                           int64_t first_step, int64_t last_step, int64_t log_every,
                           double tokens_per_step, tensor::Device device)
    : ledger_(ledger),
      metrics_(metrics),
      first_step_(first_step),
      last_step_(last_step),
      log_every_(std::max<int64_t>(1, log_every)),
      tokens_per_step_(tokens_per_step),
      device_(device) {}

void StepReporter::SetMfu(double flops_per_step, double peak_flops) {
  flops_per_step_ = flops_per_step;
  peak_flops_ = peak_flops;
}

absl::Status StepReporter::Report(StepMetrics m) {
  m.tokens_per_s = tokens_per_step_ / (m.ms / 1000.0);
  if (flops_per_step_ > 0 && peak_flops_ > 0) {
    m.mfu = flops_per_step_ / (m.ms / 1000.0) / peak_flops_;
  }
  if (m.step > first_step_ + 1) {  // the first step includes one-time set-up (primitive creation)
    total_ms_ += m.ms;
    ++timed_steps_;
  }
  if (m.step == first_step_ + 1 || m.step % log_every_ == 0 || m.step == last_step_) {
    std::printf("%s\n", FormatStep(m, ledger_, device_).c_str());
    std::fflush(stdout);
  }
  return metrics_.Write(m, ledger_);
}

absl::Status StepReporter::Report(int64_t step_done, const StepResult& result, double lr,
                                  double ms, double loss_scale) {
  StepMetrics m;
  m.step = step_done;
  m.loss = result.loss;
  m.lr = lr;
  m.ms = ms;
  m.grad_norm = result.grad_norm;
  m.loss_scale = loss_scale;
  m.skipped = result.skipped;
  return Report(m);
}

absl::Status StepReporter::ReportEval(int64_t step, double eval_loss, double ms) {
  std::printf("eval after step %lld | loss %.4f | %.1f ms\n", static_cast<long long>(step),
              eval_loss, ms);
  std::fflush(stdout);
  return metrics_.WriteEval(step, eval_loss, ms);
}

absl::Status StepReporter::TimedEval(int64_t step_done, bool log,
                                     const std::function<absl::StatusOr<double>()>& evaluate) {
  StepTimer timer;
  timer.Start();
  absl::StatusOr<double> eval_loss = evaluate();
  if (!eval_loss.ok()) return eval_loss.status();
  return log ? ReportEval(step_done, *eval_loss, timer.ElapsedMs()) : absl::OkStatus();
}

void StepReporter::PrintSummary(absl::string_view tokens_note) const {
  if (timed_steps_ == 0) return;
  const double seconds = total_ms_ / 1000.0;
  const std::string mfu =
      flops_per_step_ > 0 && peak_flops_ > 0
          ? absl::StrFormat(", MFU %.1f%%",
                            100 * flops_per_step_ * timed_steps_ / seconds / peak_flops_)
          : "";
  std::printf("mean %.1f ms/step, %.0f tokens/s%s%s over %lld steps (after the first)\n",
              total_ms_ / timed_steps_, tokens_per_step_ * timed_steps_ / seconds,
              std::string(tokens_note).c_str(), mfu.c_str(), static_cast<long long>(timed_steps_));
}

}  // namespace train
