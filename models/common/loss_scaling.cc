// Loss scaling in the train binaries (loss_scaling.h).
#include "models/common/loss_scaling.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace train {

namespace {
// The largest fixed loss scale taken: 2^64. fp32 overflows at 2^128, and the
// scale multiplies the loss and the gradients (PyTorch's GradScaler starts at
// 2^16). A dynamic scale may start higher: it halves until steps are finite.
constexpr double kMaxScale = 18446744073709551616.0;
// The smallest: unscaling multiplies by 1/scale in fp32 (it overflows below
// 2^-128); a scale below 1 is rare, and below 2^-64 a mistake.
constexpr double kMinScale = 1.0 / 18446744073709551616.0;
// A dynamic scale's first: one that halves into fp32's range (2^128) with
// room to spare before kMaxSkippedInARow skipped steps stop the run.
constexpr double kMaxInitScale = 1427247692705959881058285969449495136382746624.0;  // 2^150
}  // namespace

absl::StatusOr<LossScaling> LossScaling::FromFlags(const std::string& spec,
                                                   std::optional<double> init_flag,
                                                   bool needs_scaling) {
  LossScaling s;
  const std::string mode = spec == "auto" ? (needs_scaling ? "dynamic" : "none") : spec;
  // --init_loss_scale given to a mode that would ignore it.
  auto init_ignored = [&]() -> absl::Status {
    if (!init_flag.has_value()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "--init_loss_scale=", *init_flag, " is the first scale of --loss_scale=dynamic, and ",
        spec == "auto" ? "--loss_scale=auto means none without fp16"
                       : absl::StrCat("--loss_scale=", spec, " is not dynamic"),
        ": add --loss_scale=dynamic or drop --init_loss_scale"));
  };
  if (mode == "none") {
    if (needs_scaling) {
      return absl::InvalidArgumentError(
          "--loss_scale=none with --precision=fp16: fp16 gradients underflow without loss "
          "scaling; use --loss_scale=dynamic (the default) or a fixed scale");
    }
    absl::Status ignored = init_ignored();
    if (!ignored.ok()) return ignored;
    return s;
  }
  s.enabled_ = true;
  if (mode == "dynamic") {
    const double init_scale = init_flag.value_or(precision::LossScalerOptions().init_scale);
    if (!(init_scale > 0) || !std::isfinite(init_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--init_loss_scale=", init_scale, " must be a positive finite number"));
    }
    if (init_scale < kMinScale) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_loss_scale=", init_scale, " is below 2^-64: unscaling multiplies the gradients "
          "by its inverse, which overflows fp32 below 2^-128 (every step skipped); start at 2^16 "
          "(the default)"));
    }
    // fp16 gradients overflow at 2^16: from 2^64, 48 halvings reach it.
    const bool fp16 = needs_scaling;
    if (init_scale > (fp16 ? kMaxScale : kMaxInitScale)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_loss_scale=", init_scale, " is above ", fp16 ? "2^64" : "2^150",
          ": the scale halves once per skipped step and the run stops after ",
          kMaxSkippedInARow, " in a row, which from there would not bring it inside ",
          fp16 ? "fp16's range (2^16)" : "fp32's range (2^128) with room to spare",
          "; start at 2^16 (the default)"));
    }
    precision::LossScalerOptions o;
    o.init_scale = init_scale;
    absl::StatusOr<precision::DynamicLossScaler> d = precision::DynamicLossScaler::Create(o);
    if (!d.ok()) return d.status();
    s.dynamic_ = *d;
    s.max_start_scale_ = fp16 ? kMaxScale : kMaxInitScale;
    return s;
  }
  double fixed = 0;
  if (!absl::SimpleAtod(mode, &fixed) || !(fixed > 0) || !std::isfinite(fixed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss_scale='", spec, "' is not auto, none, dynamic or a positive finite number"));
  }
  if (fixed < kMinScale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss_scale='", spec, "' is below 2^-64: unscaling multiplies the gradients by its "
        "inverse, which overflows fp32 below 2^-128 (every step skipped as inf/nan)"));
  }
  if (fixed > kMaxScale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss_scale='", spec, "' is above 2^64: the scaled loss and gradients would overflow "
        "(every step skipped as inf/nan)"));
  }
  absl::Status ignored = init_ignored();
  if (!ignored.ok()) return ignored;
  s.fixed_ = fixed;
  return s;
}

double LossScaling::scale() const {
  if (!enabled_) return 1.0;
  return dynamic_ ? dynamic_->scale() : fixed_;
}

bool LossScaling::Update(bool found_non_finite) {
  const bool apply = dynamic_ ? dynamic_->Update(found_non_finite) : !found_non_finite;
  if (!apply) ++skipped_;
  return apply;
}

absl::StatusOr<bool> LossScaling::FinishStep(
    double scale, int64_t step, bool log,
    const std::function<absl::StatusOr<bool>(double)>& unscale) {
  if (!enabled_) return true;
  absl::StatusOr<bool> found = unscale(1.0 / scale);
  if (!found.ok()) return found.status();
  const bool apply = Update(*found);
  skipped_in_a_row_ = apply ? 0 : skipped_in_a_row_ + 1;
  if (skipped_in_a_row_ >= kMaxSkippedInARow) {
    return absl::InternalError(absl::StrCat(
        "inf/nan gradients in ", skipped_in_a_row_, " steps in a row, the last at step ", step,
        " at loss scale ", scale, ": every one was skipped, so the run is not training; lower "
        "--lr or check the data"));
  }
  if (!apply && log) {
    std::printf("step %lld: inf/nan gradients at loss scale %g: skipped; loss scale %s\n",
                static_cast<long long>(step), scale, Describe().c_str());
  }
  return apply;
}

std::string LossScaling::Describe() const {
  if (!enabled_) return "none";
  if (dynamic_) return absl::StrFormat("dynamic (now %g)", dynamic_->scale());
  return absl::StrFormat("fixed %g", fixed_);
}

void LossScaling::Save(std::map<std::string, std::string>& extra) const {
  if (skipped_in_a_row_ > 0) extra["loss_scale_skipped_in_a_row"] = absl::StrCat(skipped_in_a_row_);
  if (!dynamic_) return;
  const precision::DynamicLossScaler::State st = dynamic_->GetState();
  extra["loss_scale"] = absl::StrFormat("%.17g", st.scale);
  extra["loss_scale_good_steps"] = absl::StrCat(st.good_steps);
}

absl::Status LossScaling::Restore(const std::map<std::string, std::string>& extra) {
  // Steps skipped in a row when it was saved: a resumed run stops where the
  // uninterrupted one would. (Taken once the rest is valid too.)
  int64_t in_a_row = 0;
  if (auto it = extra.find("loss_scale_skipped_in_a_row"); it != extra.end() && enabled_) {
    if (!absl::SimpleAtoi(it->second, &in_a_row) || in_a_row < 0 ||
        in_a_row >= kMaxSkippedInARow) {
      return absl::DataLossError(absl::StrCat("the checkpoint's count of steps skipped in a row ('",
                                              it->second, "') is not valid"));
    }
  }
  auto scale = extra.find("loss_scale");
  if (!dynamic_ || scale == extra.end()) {
    skipped_in_a_row_ = in_a_row;
    return absl::OkStatus();
  }
  precision::DynamicLossScaler::State st = dynamic_->GetState();
  auto good = extra.find("loss_scale_good_steps");
  if (!absl::SimpleAtod(scale->second, &st.scale) || !(st.scale > 0) ||
      !std::isfinite(st.scale) || good == extra.end() ||
      !absl::SimpleAtoi(good->second, &st.good_steps) || st.good_steps < 0) {
    return absl::DataLossError(absl::StrCat("the checkpoint's loss scale state ('",
                                            scale->second, "') is not valid"));
  }
  if (st.scale <= max_start_scale_) {  // else not continued: RestoreNote says so
    absl::Status set = dynamic_->SetState(st);
    if (!set.ok()) return set;
  }
  skipped_in_a_row_ = in_a_row;
  return absl::OkStatus();
}

std::string LossScaling::RestoreNote(const std::map<std::string, std::string>& extra) const {
  auto saved = extra.find("loss_scale");
  double scale = 0;
  if (saved == extra.end() || !absl::SimpleAtod(saved->second, &scale)) return "";
  if (!dynamic_) {
    return absl::StrFormat("the checkpoint's dynamic loss scale (%g) is not continued: this run's "
                           "loss scale is %s",
                           scale, Describe());
  }
  if (scale > max_start_scale_) {
    return absl::StrFormat("the checkpoint's dynamic loss scale (%g) is above %s, where this "
                           "run's precision may start: it starts from the initial %g instead",
                           scale, max_start_scale_ == kMaxScale ? "2^64" : "2^150",
                           dynamic_->scale());
  }
  if (scale == dynamic_->scale()) return "";
  return absl::StrFormat("the dynamic loss scale continues from the checkpoint's %g in place of "
                         "the initial %g (--init_loss_scale applies to a fresh start)",
                         scale, dynamic_->scale());
}

bool UnscaleGradients(const std::vector<optim::ParamRef>& refs, double inv_scale) {
  std::vector<tensor::Tensor> grads;
  grads.reserve(refs.size());
  for (const optim::ParamRef& r : refs) grads.push_back(r.grad);
  return precision::ScaleAndCheckNonFinite(absl::MakeSpan(grads), static_cast<float>(inv_scale));
}

}  // namespace train
