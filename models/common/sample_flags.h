// The sampling-schedule flags both train binaries take (--sample_every,
// --sample_gather), defined once here; link this library to get them. What
// a sample is stays each binary's (minGPT: a prompt continued; T5: a
// span-corrupted example filled in).
#ifndef MODELS_COMMON_SAMPLE_FLAGS_H_
#define MODELS_COMMON_SAMPLE_FLAGS_H_

#include "absl/status/statusor.h"
#include "models/common/data_parallel.h"

namespace train {

// The flags' values, after absl::ParseCommandLine, checked
// (SampleSchedule::Parse).
absl::StatusOr<SampleSchedule> SampleScheduleFromCommandLine();

}  // namespace train

#endif  // MODELS_COMMON_SAMPLE_FLAGS_H_
