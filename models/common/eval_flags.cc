// The train binaries' evaluation flags (eval_flags.h).
#include "models/common/eval_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, eval_data, "",
          "held-out data to evaluate the loss on (what --data takes: a nanoGPT val.bin, a text "
          "file, shipped, random; T5: with the training data's vocabulary); empty: no "
          "evaluation");
ABSL_FLAG(double, val_fraction, 0.0,
          "hold out the last fraction of --data's tokens for evaluation (training reads the "
          "rest; instead of --eval_data); 0: none");
ABSL_FLAG(int64_t, eval_every, 0, "evaluate every N steps and after the last; 0: after the last");
ABSL_FLAG(int64_t, eval_batches, 4,
          "global batches per evaluation (the same ones every time; no dropout)");

namespace train {

EvalFlags EvalFlagsFromCommandLine() {
  return {absl::GetFlag(FLAGS_eval_data), absl::GetFlag(FLAGS_eval_every),
          absl::GetFlag(FLAGS_eval_batches), absl::GetFlag(FLAGS_val_fraction)};
}

}  // namespace train
