// Generation with a trained T5, as Hugging Face's generate: greedy by default
// (do_sample=False), sampled (temperature, top-k, top-p; train::Sampling), or
// beam search (num_beams > 1). The encoder runs once; then, starting from
// decoder_start_id, each step gives every row's next-token logits and appends
// its token. With the key/value cache (the default) a step runs the decoder
// over the one new position (T5Model::DecodeStep; beam search reorders the
// cache's rows as beams move, DecoderCache::SelectRows); without it, over
// every position so far (T5Model::DecodeLogits: step t costs t positions).
// A row that produced eos_id stops there.
#ifndef MODELS_T5_GENERATE_H_
#define MODELS_T5_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/common/decoding.h"
#include "models/t5/model.h"
#include "tensor/tensor.h"

namespace t5 {

// How to decode (train::Decoding: max_new_tokens, eos_id, sampling, beams;
// greedy by default here), and T5's own: the decoder's first input, and the
// key/value cache. Row b's n-th new token is drawn with
// train::DrawUniform(seed, b, n). repetition_penalty and no_repeat_ngram_size
// look at each row's decoder inputs (decoder_start_id first), on the logits,
// or on the log-probabilities in beam search (as Hugging Face).
struct GenerateOptions : train::Decoding {
  GenerateOptions() { temperature = 0.0; }

  int64_t decoder_start_id = 0;  // T5's: the pad id
  // Keep the decoder's keys and values between steps; false: each step runs
  // the decoder over the whole sequence (the same tokens, up to rounding).
  bool kv_cache = true;

  // InvalidArgument naming the field unless decoder_start_id is an id below
  // vocab_size and train::Decoding::Validate passes.
  absl::Status Validate(int64_t vocab_size) const;
};

// Each row's new tokens (without decoder_start_id; ending with eos_id when it
// was produced); with beams, each example's num_return_sequences best
// hypotheses (row b n + j: example b's j-th best). encoder_inputs and encoder_mask (B, S)
// as T5Model::ForwardBackward takes them (the mask may be undefined), on the model's device, whose
// parameters are whole. The model runs in eval mode and is left in it.
absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(T5Model& model,
                                                           const tensor::Tensor& encoder_inputs,
                                                           const tensor::Tensor& encoder_mask,
                                                           const GenerateOptions& options);

}  // namespace t5

#endif  // MODELS_T5_GENERATE_H_
