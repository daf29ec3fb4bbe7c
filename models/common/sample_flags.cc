// The train binaries' sampling-schedule flags (sample_flags.h).
#include "models/common/sample_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(int64_t, sample_every, 0,
          "print a sample every N steps and after the last (minGPT: --sample_tokens tokens "
          "continuing --sample_prompt, temperature 0.8 and top-k 200, seeded by --seed and the "
          "step, as minGPT's chargpt; T5: the greedy fill-in of one fixed span-corrupted "
          "example under its inputs and targets); 0: never");
ABSL_FLAG(std::string, sample_gather, "model",
          "FSDP strategies: how a sample holds the parameters: model (every unit gathered "
          "once for the whole sample: the memory of the unsharded model) or unit (the root "
          "held, each decoding step gathers and frees the other units one by one, as a "
          "training forward: an all-gather of them per token)");

namespace train {

absl::StatusOr<SampleSchedule> SampleScheduleFromCommandLine() {
  return SampleSchedule::Parse(absl::GetFlag(FLAGS_sample_every),
                               absl::GetFlag(FLAGS_sample_gather));
}

}  // namespace train
