// T5 generation: encode once, then one decoder step per new token.
#include "models/t5/generate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace t5 {

using tensor::Tensor;

absl::Status GenerateOptions::Validate(int64_t vocab_size) const {
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens=", max_new_tokens, " must be >= 0"));
  }
  if (decoder_start_id < 0 || decoder_start_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoder_start_id=", decoder_start_id, " is not an id of the vocabulary of ", vocab_size));
  }
  if (eos_id < -1 || eos_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eos_id=", eos_id, " is not an id of the vocabulary of ", vocab_size, " (nor -1)"));
  }
  return train::Sampling::Validate();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(T5Model& model,
                                                           const Tensor& encoder_inputs,
                                                           const Tensor& encoder_mask,
                                                           const GenerateOptions& options) {
  const int64_t V = model.config().vocab_size;
  absl::Status valid = options.Validate(V);
  if (!valid.ok()) return valid;
  const int64_t B = encoder_inputs.dim(0);
  const tensor::Device device = encoder_inputs.device();
  model.Train(false);
  const Tensor encoded = model.Encode(encoder_inputs, encoder_mask);  // (B, S, d)
  DecoderCache cache;
  cache.capacity = options.max_new_tokens;  // step n feeds decoder position n
  // Every row's decoder inputs so far: decoder_start_id, then its tokens (a
  // finished row repeats its eos_id, which no later output reads).
  std::vector<int64_t> inputs(B, options.decoder_start_id);  // (B, t), row-major
  std::vector<int64_t> next(B, options.decoder_start_id);    // (B, 1): the last of each row
  std::vector<std::vector<int64_t>> out(B);
  std::vector<bool> done(B, false);
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const int64_t t = n + 1;  // decoder positions after this step
    Tensor logits;            // (B, 1 or t, V): the last position's are the next token's
    if (options.kv_cache) {
      const Tensor ids = Tensor::FromData<int64_t>(next, {B, 1}).To(device);  // (B, 1)
      logits = model.DecodeStep(encoded, encoder_mask, ids, cache);           // (B, 1, V)
    } else {
      const Tensor ids = Tensor::FromData<int64_t>(inputs, {B, t}).To(device);  // (B, t)
      logits = model.DecodeLogits(encoded, encoder_mask, ids);                  // (B, t, V)
    }
    const std::vector<float> last =  // (B, V)
        logits.Narrow(1, logits.dim(1) - 1, 1)
            .To(tensor::Device::Cpu())
            .To(tensor::Dtype::kF32)
            .Contiguous()
            .ToVector<float>();
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) {
        next[b] = options.eos_id;
        continue;
      }
      absl::StatusOr<int64_t> token =
          train::SampleFromLogits(absl::MakeConstSpan(last.data() + b * V, V), options,
                                  train::DrawUniform(options.seed, b, n));
      if (!token.ok()) {
        return absl::InternalError(
            absl::StrCat("row ", b, ", new token ", n, ": ", token.status().message()));
      }
      next[b] = *token;
      out[b].push_back(*token);
      done[b] = *token == options.eos_id;
      all_done = all_done && done[b];
    }
    if (all_done) break;
    if (!options.kv_cache) {
      std::vector<int64_t> grown;  // (B, t + 1)
      grown.reserve(B * (t + 1));
      for (int64_t b = 0; b < B; ++b) {
        grown.insert(grown.end(), inputs.begin() + b * t, inputs.begin() + (b + 1) * t);
        grown.push_back(next[b]);
      }
      inputs = std::move(grown);
    }
  }
  return out;
}

}  // namespace t5
