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
#include "models/common/sampling.h"
#include "models/t5/model.h"
#include "tensor/tensor.h"

namespace t5 {

// The draws: temperature (0: greedy, the default here), top_k, top_p, seed;
// row b's n-th new token is drawn with train::DrawUniform(seed, b, n).
// repetition_penalty and no_repeat_ngram_size look at each row's decoder
// inputs (decoder_start_id first), on the logits, or on the log-probabilities
// in beam search (as Hugging Face).
struct GenerateOptions : train::Sampling {
  GenerateOptions() { temperature = 0.0; }

  int64_t max_new_tokens = 32;
  int64_t decoder_start_id = 0;  // T5's: the pad id
  int64_t eos_id = -1;           // -1: every row runs max_new_tokens
  // Keep the decoder's keys and values between steps; false: each step runs
  // the decoder over the whole sequence (the same tokens, up to rounding).
  bool kv_cache = true;
  // Beam search: num_beams hypotheses per example, as Hugging Face's
  // BeamSearchScorer: each step keeps the best 2 num_beams continuations of
  // all beams by summed log-probability; an eos among the first num_beams
  // finishes a hypothesis, the rest are the next beams. With temperature > 0
  // (Hugging Face's beam sampling, do_sample with num_beams) each beam's
  // log-probabilities go through temperature, top_k and top_p
  // (train::WarpScores) before they add to its sum, and the 2 num_beams are
  // drawn without replacement from the softmax of every continuation's sum
  // (example b's j-th draw at step n with train::DrawUniform(seed, b,
  // 2 num_beams n + j)), then ranked by sum. A
  // finished hypothesis scores sum / length^length_penalty (length: its new
  // tokens, eos included; > 1 favours longer ones). An example is done once
  // num_beams hypotheses finished and (unless early_stopping) the best running
  // beam, scored at its length now, cannot beat the worst of them; at
  // max_new_tokens the running beams compete too. 1: no beams.
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;

  // InvalidArgument naming the field unless max_new_tokens >= 0, the ids are
  // below vocab_size (decoder_start_id >= 0, eos_id >= -1), num_beams >= 1,
  // length_penalty finite and the sampling is valid
  // (train::Sampling::Validate).
  absl::Status Validate(int64_t vocab_size) const;
};

// Each row's new tokens (without decoder_start_id; ending with eos_id when it
// was produced); with beams, each example's best hypothesis. encoder_inputs and encoder_mask (B, S)
// as T5Model::ForwardBackward takes them (the mask may be undefined), on the model's device, whose
// parameters are whole. The model runs in eval mode and is left in it.
absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(T5Model& model,
                                                           const tensor::Tensor& encoder_inputs,
                                                           const tensor::Tensor& encoder_mask,
                                                           const GenerateOptions& options);

}  // namespace t5

#endif  // MODELS_T5_GENERATE_H_
