// Language-model batches for next-token prediction: (inputs, targets) as i64
// CPU tensors of shape (B, T) with targets[b, t] = inputs[b, t + 1] of the same
// window (each row is T + 1 consecutive tokens of the source).
//
//   auto source = data::ByteTextSource::OpenDefault(/*seed=*/1);
//   auto loader = data::LmLoader::Create(std::move(*source), {/*batch_size=*/8, rank, world},
//                                        /*seq_len=*/256);
//   data::LmBatch batch = loader->Next();   // step 0, then 1, ...
//
// Batch(step) is a pure function of the step, so Next() after Restore(state)
// continues exactly where the saved run was.
#ifndef MODELS_DATA_LM_LOADER_H_
#define MODELS_DATA_LM_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data/loader_state.h"
#include "models/data/token_source.h"
#include "tensor/tensor.h"

namespace data {

struct LmBatch {
  int64_t step = 0;
  tensor::Tensor inputs;   // (B, T) i64
  tensor::Tensor targets;  // (B, T) i64, inputs shifted left by one
};

class LmLoader {
 public:
  // InvalidArgument for a bad layout (DataParallel::Validate), seq_len < 1, or a
  // source shorter than seq_len + 1 tokens (naming the source).
  static absl::StatusOr<LmLoader> Create(std::shared_ptr<const TokenSource> source,
                                         DataParallel layout, int64_t seq_len);

  // This rank's batch at `step`: rows [r*B, (r+1)*B) of the global batch,
  // or with K micro-batches (DataParallel::micro_batches) K*B rows,
  // micro-batch m at rows [m*B, (m+1)*B) (see loader_state.h).
  LmBatch Batch(int64_t step) const;
  // Batch(step()) then advances the step.
  LmBatch Next();

  int64_t step() const { return step_; }
  LoaderState state() const { return {step_, Config()}; }
  // Continues from a saved state; InvalidArgument if it was saved under another
  // configuration (source, seed, global batch, seq_len).
  absl::Status Restore(const LoaderState& state);

  const TokenSource& source() const { return *source_; }
  const DataParallel& layout() const { return layout_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return source_->vocab_size(); }

 private:
  LmLoader(std::shared_ptr<const TokenSource> source, DataParallel layout, int64_t seq_len)
      : source_(std::move(source)), layout_(layout), seq_len_(seq_len) {}
  std::string Config() const;

  std::shared_ptr<const TokenSource> source_;
  DataParallel layout_;
  int64_t seq_len_;
  int64_t step_ = 0;
};

}  // namespace data

#endif  // MODELS_DATA_LM_LOADER_H_
