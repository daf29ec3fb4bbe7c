#include "models/t5/generate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace t5 {

using tensor::Tensor;

absl::Status GreedyOptions::Validate(int64_t vocab_size) const {
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
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> GreedyDecode(T5Model& model,
                                                               const Tensor& encoder_inputs,
                                                               const Tensor& encoder_mask,
                                                               const GreedyOptions& options) {
  const int64_t V = model.config().vocab_size;
  absl::Status valid = options.Validate(V);
  if (!valid.ok()) return valid;
  const int64_t B = encoder_inputs.dim(0);
  const tensor::Device device = encoder_inputs.device();
  model.Train(false);
  const Tensor encoded = model.Encode(encoder_inputs, encoder_mask);  // (B, S, d)
  // Every row's decoder inputs so far: decoder_start_id, then its tokens (a
  // finished row repeats its eos_id, which no later output reads).
  std::vector<int64_t> inputs(B, options.decoder_start_id);  // (B, t), row-major
  std::vector<std::vector<int64_t>> out(B);
  std::vector<bool> done(B, false);
  for (int64_t t = 1; t <= options.max_new_tokens; ++t) {
    const Tensor ids = Tensor::FromData<int64_t>(inputs, {B, t}).To(device);  // (B, t)
    const Tensor logits = model.DecodeLogits(encoded, encoder_mask, ids);     // (B, t, V)
    const std::vector<float> last =  // (B, V): the next token's logits
        logits.Narrow(1, t - 1, 1)
            .To(tensor::Device::Cpu())
            .To(tensor::Dtype::kF32)
            .Contiguous()
            .ToVector<float>();
    std::vector<int64_t> next(B);
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = last.data() + b * V;
      int64_t best = 0;
      for (int64_t v = 1; v < V; ++v) {
        if (row[v] > row[best]) best = v;
      }
      if (done[b]) {
        next[b] = options.eos_id;
      } else {
        next[b] = best;
        out[b].push_back(best);
        done[b] = best == options.eos_id;
      }
      all_done = all_done && done[b];
    }
    if (all_done) break;
    std::vector<int64_t> grown;  // (B, t + 1)
    grown.reserve(B * (t + 1));
    for (int64_t b = 0; b < B; ++b) {
      grown.insert(grown.end(), inputs.begin() + b * t, inputs.begin() + (b + 1) * t);
      grown.push_back(next[b]);
    }
    inputs = std::move(grown);
  }
  return out;
}

}  // namespace t5
