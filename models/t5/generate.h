// Greedy decoding with a trained T5 (Hugging Face's generate with
// num_beams=1, do_sample=False): the encoder runs once; then, starting from
// decoder_start_id, each step runs the decoder over the tokens so far
// (T5Model::DecodeLogits; no key/value cache, so step t costs a forward of t
// positions) and appends each row's most likely next token (the lowest id
// among equals). A row that produced eos_id stops there.
#ifndef MODELS_T5_GENERATE_H_
#define MODELS_T5_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/t5/model.h"
#include "tensor/tensor.h"

namespace t5 {

struct GreedyOptions {
  int64_t max_new_tokens = 32;
  int64_t decoder_start_id = 0;  // T5's: the pad id
  int64_t eos_id = -1;           // -1: every row runs max_new_tokens
  // InvalidArgument naming the field unless max_new_tokens >= 0 and the ids are
  // below vocab_size (decoder_start_id >= 0, eos_id >= -1).
  absl::Status Validate(int64_t vocab_size) const;
};

// Each row's new tokens (without decoder_start_id; ending with eos_id when it
// was produced). encoder_inputs and encoder_mask (B, S) as
// T5Model::ForwardBackward takes them (the mask may be undefined), on the
// model's device. The model runs in eval mode and is left in it.
absl::StatusOr<std::vector<std::vector<int64_t>>> GreedyDecode(T5Model& model,
                                                               const tensor::Tensor& encoder_inputs,
                                                               const tensor::Tensor& encoder_mask,
                                                               const GreedyOptions& options);

}  // namespace t5

#endif  // MODELS_T5_GENERATE_H_
