// Learning-rate schedules and their parser.
#include "optim/lr_schedule.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace optim {

namespace {

constexpr double kPi = 3.14159265358979323846;

// The shortest decimal form of v that reads back as v.
std::string Num(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("lr schedule: ", what));
}

}  // namespace

std::string ConstantLr::ToString() const { return absl::StrCat("constant:lr=", Num(lr_)); }

absl::StatusOr<std::unique_ptr<WarmupCosine>> WarmupCosine::Create(double max_lr, double min_lr,
                                                                   int64_t warmup_steps,
                                                                   int64_t total_steps) {
  if (!std::isfinite(max_lr) || !std::isfinite(min_lr) || min_lr < 0 || min_lr > max_lr) {
    return Invalid(absl::StrCat("cosine needs 0 <= min_lr <= max_lr, got min_lr=", Num(min_lr),
                                " max_lr=", Num(max_lr)));
  }
  if (warmup_steps < 0 || total_steps < warmup_steps) {
    return Invalid(absl::StrCat("cosine needs 0 <= warmup_steps <= total_steps, got warmup_steps=",
                                warmup_steps, " total_steps=", total_steps));
  }
  return std::unique_ptr<WarmupCosine>(new WarmupCosine(max_lr, min_lr, warmup_steps, total_steps));
}

double WarmupCosine::LrAt(int64_t step) const {
  if (step < 0) step = 0;
  if (step < warmup_steps_) {
    return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_;
  const double ratio =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(kPi * ratio));
}

std::string WarmupCosine::ToString() const {
  return absl::StrCat("cosine:max_lr=", Num(max_lr_), ",min_lr=", Num(min_lr_),
                      ",warmup_steps=", warmup_steps_, ",total_steps=", total_steps_);
}

absl::StatusOr<std::unique_ptr<LrSchedule>> MakeLrSchedule(const LrScheduleOptions& o) {
  if (o.kind == "constant") {
    if (!std::isfinite(o.lr) || o.lr < 0) {
      return Invalid(absl::StrCat("constant needs a finite lr >= 0, got lr=", Num(o.lr)));
    }
    return std::unique_ptr<LrSchedule>(new ConstantLr(o.lr));
  }
  if (o.kind == "cosine") {
    auto s = WarmupCosine::Create(o.max_lr, o.min_lr, o.warmup_steps, o.total_steps);
    if (!s.ok()) return s.status();
    return std::unique_ptr<LrSchedule>(std::move(*s));
  }
  return Invalid(absl::StrCat("unknown kind '", o.kind, "' (expected constant or cosine)"));
}

absl::StatusOr<LrSpec> ParseLrSpec(absl::string_view spec) {
  const std::vector<absl::string_view> kind_args = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  LrSpec parsed;
  LrScheduleOptions& o = parsed.options;
  o.kind = std::string(absl::StripAsciiWhitespace(kind_args[0]));
  std::set<std::string> allowed;
  if (o.kind == "constant") {
    allowed = {"lr"};
  } else if (o.kind == "cosine") {
    allowed = {"max_lr", "min_lr", "warmup_steps", "total_steps"};
  } else {
    return Invalid(
        absl::StrCat("unknown kind '", o.kind, "' in '", spec, "' (expected constant or cosine)"));
  }
  std::set<std::string>& seen = parsed.keys;
  // "KIND:" gives no key, as "KIND" does.
  if (kind_args.size() == 2 && !absl::StripAsciiWhitespace(kind_args[1]).empty()) {
    for (absl::string_view item : absl::StrSplit(kind_args[1], ',')) {
      const std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      const std::string key(absl::StripAsciiWhitespace(kv[0]));
      if (kv.size() != 2) {
        return Invalid(absl::StrCat("expected key=value, got '", item, "' in '", spec, "'"));
      }
      const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
      if (allowed.count(key) == 0) {
        return Invalid(absl::StrCat("unknown key '", key, "' for ", o.kind, " in '", spec,
                                    "' (its keys: ", absl::StrJoin(allowed, ", "), ")"));
      }
      if (!seen.insert(key).second) {
        return Invalid(absl::StrCat("key '", key, "' given twice in '", spec, "'"));
      }
      bool ok;
      if (key == "warmup_steps" || key == "total_steps") {
        int64_t* field = key == "warmup_steps" ? &o.warmup_steps : &o.total_steps;
        ok = absl::SimpleAtoi(value, field);
      } else {
        double* field = key == "lr" ? &o.lr : key == "max_lr" ? &o.max_lr : &o.min_lr;
        ok = absl::SimpleAtod(value, field) && std::isfinite(*field);
      }
      if (!ok) {
        return Invalid(absl::StrCat("bad value '", value, "' for ", key, " in '", spec, "'"));
      }
      // A rate below 0 is wrong whatever else the spec lacks: said first.
      if ((key == "lr" || key == "max_lr" || key == "min_lr") &&
          (key == "lr" ? o.lr : key == "max_lr" ? o.max_lr : o.min_lr) < 0) {
        return Invalid(absl::StrCat(key, "=", value, " must be >= 0 in '", spec, "'"));
      }
    }
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<LrSchedule>> ParseLrSchedule(absl::string_view spec) {
  absl::StatusOr<LrSpec> parsed = ParseLrSpec(spec);
  if (!parsed.ok()) return parsed.status();
  const std::vector<std::string> required =
      parsed->options.kind == "constant" ? std::vector<std::string>{"lr"}
                                         : std::vector<std::string>{"max_lr", "total_steps"};
  for (const std::string& key : required) {
    if (parsed->keys.count(key) == 0) {
      return Invalid(absl::StrCat(parsed->options.kind, " needs ", key, "=..., missing in '",
                                  spec, "'"));
    }
  }
  return MakeLrSchedule(parsed->options);
}

}  // namespace optim
