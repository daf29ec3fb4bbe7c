// The evaluation flags both train binaries take (--eval_data, --val_fraction,
// --eval_every, --eval_batches), defined once here; link this library to get
// them.
#ifndef MODELS_COMMON_EVAL_FLAGS_H_
#define MODELS_COMMON_EVAL_FLAGS_H_

#include "models/common/train_setup.h"

namespace train {

// The flags' values, after absl::ParseCommandLine.
EvalFlags EvalFlagsFromCommandLine();

}  // namespace train

#endif  // MODELS_COMMON_EVAL_FLAGS_H_
