// What the T5 train binary prints about its data besides the step lines: the
// start-up lines (the model, the span corruption, the batch, and for byte
// text a decoded example of inputs and targets) and --sample_every's samples,
// the model's greedy fill-in of that example's spans under its inputs and
// targets. Both models/t5/train.cc's one-process and data-parallel paths use
// them.
#ifndef MODELS_T5_TRAIN_REPORT_H_
#define MODELS_T5_TRAIN_REPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/common/data_parallel.h"
#include "models/data/span_corruption.h"
#include "models/data/token_source.h"
#include "models/t5/config.h"
#include "models/t5/model.h"
#include "tensor/tensor.h"

namespace t5 {

// The start-up lines: the model, the data (and a decoded sample of byte
// text), the batch. `ranks` is "" in one process, else "2 ranks (gloo) x ",
// then "4 micro-batches x " with gradient accumulation;
// tokens_per_step counts every rank's; `scheme` names the optimizer, the
// schedule and the precision or strategy; `show_text` adds a decoded example
// (byte text).
void PrintStartup(const T5Config& config, const data::TokenSource& source,
                  const data::SpanCorruptionOptions& span, const data::SpanCorruptionLoader& loader,
                  const std::string& ranks, int64_t B, int64_t tokens_per_step,
                  const std::string& scheme, bool show_text);

// --sample_every's samples: the model's greedy fill-in of the spans of one
// fixed example (row 0 of the data's first batch, which the start-up lines
// show), printed under its inputs and targets: text for byte data, else ids.
struct Sampler {
  train::SampleSchedule schedule;
  std::optional<data::SpanCorruptor> corruptor;
  tensor::Tensor encoder_inputs, encoder_mask;  // (1, S) on the host
  std::vector<int64_t> targets;                 // (T_dec), ignore_index at padding
  int64_t eos_id = -1;
  bool text = false;

  // "sample at step N:" and the three lines, from `model` (eval mode, on
  // `device`): greedy, so every rank of a data-parallel run draws the same.
  absl::StatusOr<std::string> Draw(T5Model& model, int64_t step_done, tensor::Device device) const;
};

// The sampler of `schedule` (--sample_every, --sample_gather) over `source`,
// corrupted as `span` says; `text`: the example shown as bytes, else as ids.
absl::StatusOr<Sampler> MakeSampler(std::shared_ptr<const data::TokenSource> source,
                                    const data::SpanCorruptionOptions& span,
                                    const train::SampleSchedule& schedule, bool text);

}  // namespace t5

#endif  // MODELS_T5_TRAIN_REPORT_H_
