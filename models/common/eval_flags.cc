// The train binaries' evaluation flags (eval_flags.h).
#include "models/common/eval_flags.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, eval_data, "",
          "held-out data to evaluate the loss on (what --data takes: a nanoGPT val.bin, a text "
          "file, shipped, random; T5: with the training data's vocabulary); empty: no "
          "evaluation");
ABSL_FLAG(double, val_fraction, 0.0,
          "hold out the last fraction of --data's tokens for evaluation (training reads the "
          "rest; instead of --eval_data); 0: none");
// Unset by default, so that one given without --eval_data or --val_fraction
// (nothing to evaluate) is an error rather than ignored.
ABSL_FLAG(std::optional<int64_t>, eval_every, std::nullopt,
          "evaluate every N steps and after the last; 0 (unset): after the last. Needs "
          "--eval_data or --val_fraction");
ABSL_FLAG(std::optional<int64_t>, eval_batches, std::nullopt,
          "global batches per evaluation (the same ones every time; no dropout); unset: 4. "
          "Needs --eval_data or --val_fraction");

namespace train {

EvalFlags EvalFlagsFromCommandLine() {
  EvalFlags flags;
  flags.data = absl::GetFlag(FLAGS_eval_data);
  flags.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  const std::optional<int64_t> every = absl::GetFlag(FLAGS_eval_every);
  const std::optional<int64_t> batches = absl::GetFlag(FLAGS_eval_batches);
  flags.every = every.value_or(flags.every);
  flags.batches = batches.value_or(flags.batches);
  flags.every_given = every.has_value();
  flags.batches_given = batches.has_value();
  return flags;
}

}  // namespace train
