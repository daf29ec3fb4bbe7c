// T5 generation: encode once, then one decoder step per new token; greedy or
// sampled rows, or beam search.
#include "models/t5/generate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace t5 {
namespace {

using tensor::Tensor;
using Rows = std::vector<std::vector<int64_t>>;

// The next-token logits of rows of decoder inputs, one step at a time: with
// the key/value cache the decoder runs on each row's last token, without it
// on the whole sequence so far.
class DecoderSteps : public train::NextTokens {
 public:
  // encoded (R, S, d) and mask (R, S) or undefined: one per row.
  DecoderSteps(T5Model& model, Tensor encoded, Tensor mask, const GenerateOptions& options)
      : model_(model),
        encoded_(std::move(encoded)),
        mask_(std::move(mask)),
        kv_cache_(options.kv_cache) {
    cache_.capacity = options.max_new_tokens;  // step n feeds decoder position n
  }

  // sequences: R rows of equal length t (decoder_start_id, then the tokens so
  // far) whose first t - 1 positions the earlier steps fed -> (R, V) f32.
  std::vector<float> Logits(const Rows& sequences) override {
    const int64_t R = static_cast<int64_t>(sequences.size());
    const int64_t t = static_cast<int64_t>(sequences[0].size());
    const int64_t fed = kv_cache_ ? t - 1 : 0;  // positions the decoder already holds
    std::vector<int64_t> ids;                   // (R, t - fed) row-major
    for (const std::vector<int64_t>& row : sequences)
      ids.insert(ids.end(), row.begin() + fed, row.end());
    const Tensor input = Tensor::FromData<int64_t>(ids, {R, t - fed}).To(encoded_.device());
    const Tensor logits = kv_cache_
                              ? model_.DecodeStep(encoded_, mask_, input, cache_)  // (R, 1, V)
                              : model_.DecodeLogits(encoded_, mask_, input);       // (R, t, V)
    return logits.Narrow(1, logits.dim(1) - 1, 1)
        .To(tensor::Device::Cpu())
        .To(tensor::Dtype::kF32)
        .Contiguous()
        .ToVector<float>();
  }

  // Row i continues what row rows[i] held (beam search's reordering).
  void SelectRows(const std::vector<int64_t>& rows) override {
    if (kv_cache_) cache_.SelectRows(rows);
  }

 private:
  T5Model& model_;
  const Tensor encoded_;
  const Tensor mask_;
  const bool kv_cache_;
  DecoderCache cache_;
};

// `t` (B, ...) with each row repeated k times in place: (B k, ...).
Tensor RepeatRows(const Tensor& t, int64_t k) {
  if (!t.defined() || k == 1) return t;
  tensor::Shape shape = t.shape();
  const int64_t B = shape[0];
  shape[0] = B * k;
  Tensor out = Tensor::Empty(shape, t.dtype(), t.device());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < k; ++j) out.Narrow(0, b * k + j, 1).CopyFrom(t.Narrow(0, b, 1));
  }
  return out;
}

}  // namespace

absl::Status GenerateOptions::Validate(int64_t vocab_size) const {
  if (decoder_start_id < 0 || decoder_start_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoder_start_id=", decoder_start_id, " is not an id of the vocabulary of ", vocab_size));
  }
  return train::Decoding::Validate(vocab_size);
}

absl::StatusOr<Rows> Generate(T5Model& model, const Tensor& encoder_inputs,
                              const Tensor& encoder_mask, const GenerateOptions& options) {
  const int64_t V = model.config().vocab_size;
  absl::Status valid = options.Validate(V);
  if (!valid.ok()) return valid;
  const int64_t B = encoder_inputs.dim(0);
  model.Train(false);
  const Tensor encoded = model.Encode(encoder_inputs, encoder_mask);  // (B, S, d)
  const Rows prefixes(B, std::vector<int64_t>{options.decoder_start_id});
  if (!options.beams()) {
    DecoderSteps steps(model, encoded, encoder_mask, options);
    return train::SampleRows(steps, prefixes, V, options);
  }
  // Every beam a row of its own: (B K, S, d), (B K, S).
  DecoderSteps steps(model, RepeatRows(encoded, options.num_beams),
                     RepeatRows(encoder_mask, options.num_beams), options);
  return train::BeamSearch(steps, prefixes, V, options);
}

}  // namespace t5
