// The T5 train binary's start-up lines and samples (train_report.h).
#include "models/t5/train_report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "models/data/byte_text.h"
#include "models/t5/generate.h"
#include "tensor/thread_pool.h"

namespace t5 {
namespace {

// At most `max_chars` of a rendered example, for the start-up sample lines.
std::string Clip(std::string s, size_t max_chars) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  }
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace

void PrintStartup(const T5Config& config, const data::TokenSource& source,
                  const data::SpanCorruptionOptions& span, const data::SpanCorruptionLoader& loader,
                  const std::string& ranks, int64_t B, int64_t tokens_per_step,
                  const std::string& scheme, bool show_text) {
  const ParamCount count = CountParameters(config);
  const data::SpanCorruptor& corruptor = loader.corruptor();
  const int64_t S = span.encoder_length;
  const int64_t T_dec = corruptor.decoder_length();
  std::printf("model %s: %.2fM parameters (%.2fM without embeddings)\n", config.ToString().c_str(),
              count.total / 1e6, count.non_embedding / 1e6);
  std::printf(
      "data: span corruption of %s | vocab %lld + %lld sentinels | %lld raw tokens -> "
      "encoder %lld, decoder %lld (%lld noise tokens in %lld spans)\n",
      source.Describe().c_str(), static_cast<long long>(source.vocab_size()),
      static_cast<long long>(span.num_sentinels), static_cast<long long>(corruptor.raw_length()),
      static_cast<long long>(S), static_cast<long long>(T_dec),
      static_cast<long long>(corruptor.counts().num_noise),
      static_cast<long long>(corruptor.counts().num_spans));
  std::printf(
      "batch %s%lld x (%lld encoder + %lld decoder) = %lld tokens/step (tok/s counts encoder + "
      "decoder tokens) | %s | %d threads\n",
      ranks.c_str(), static_cast<long long>(B), static_cast<long long>(S),
      static_cast<long long>(T_dec), static_cast<long long>(tokens_per_step), scheme.c_str(),
      tensor::DefaultThreadPool().num_threads());
  if (show_text) {
    // Row 0 of the first step, decoded, so the objective is visible: the
    // example --sample_every fills in, also on a resumed run.
    const data::Seq2SeqBatch sample = loader.Batch(0);
    const int64_t* enc = sample.encoder_inputs.data<int64_t>();
    const int64_t* tgt = sample.decoder_targets.data<int64_t>();
    std::printf(
        "sample inputs:  %s\n",
        Clip(corruptor.Render(absl::MakeConstSpan(enc, S), data::DecodeBytes), 160).c_str());
    std::printf(
        "sample targets: %s\n",
        Clip(corruptor.Render(absl::MakeConstSpan(tgt, T_dec), data::DecodeBytes), 160).c_str());
  }
  std::fflush(stdout);
}

absl::StatusOr<std::string> Sampler::Draw(T5Model& model, int64_t step_done,
                                        tensor::Device device) const {
  GenerateOptions options;
  options.max_new_tokens = static_cast<int64_t>(
      std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t >= 0; }));
  options.eos_id = eos_id;
  absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
      Generate(model, encoder_inputs.To(device), encoder_mask.To(device), options);
  if (!rows.ok()) return rows.status();
  using Decode = std::function<std::string(absl::Span<const int64_t>)>;
  const Decode decode = text ? Decode(data::DecodeBytes) : [](absl::Span<const int64_t> ids) {
    return absl::StrCat(" ", absl::StrJoin(ids, " "), " ");
  };
  auto show = [&](absl::Span<const int64_t> ids) {
    return Clip(corruptor->Render(ids, decode), 160);
  };
  return absl::StrCat("sample at step ", step_done,
                      ":\n  inputs:  ", show(encoder_inputs.ToVector<int64_t>()),
                      "\n  targets: ", show(targets), "\n  model:   ", show((*rows)[0]), "\n");
}

absl::StatusOr<Sampler> MakeSampler(std::shared_ptr<const data::TokenSource> source,
                                    const data::SpanCorruptionOptions& span,
                                    const train::SampleSchedule& schedule, bool text) {
  Sampler s;
  s.schedule = schedule;
  if (s.schedule.every == 0) return s;
  s.text = text;
  absl::StatusOr<data::SpanCorruptionLoader> one =
      data::SpanCorruptionLoader::Create(std::move(source), {1, 0, 1, 1}, span);
  if (!one.ok()) return one.status();
  const data::Seq2SeqBatch batch = one->Batch(0);  // (1, S), (1, T_dec)
  s.corruptor.emplace(one->corruptor());
  s.encoder_inputs = batch.encoder_inputs;
  s.encoder_mask = batch.encoder_mask;
  s.targets = batch.decoder_targets.ToVector<int64_t>();
  s.eos_id = span.eos_id;
  return s;
}

}  // namespace t5
