// A short T5 pretraining run: a tiny T5 trained with AdamW for 40 steps on
// span-corrupted bytes of the shipped text (data::SpanCorruptionLoader over
// data::ByteTextSource::OpenDefault, vocabulary 256 bytes + sentinels) must
// lower the loss on held-out batches (eval mode) from about 6.1 to below 3.6.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "models/data/byte_text.h"
#include "models/data/span_corruption.h"
#include "models/t5/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"

namespace t5 {
namespace {

double EvalLoss(T5Model& model, const data::SpanCorruptionLoader& loader) {
  model.Train(false);
  double sum = 0;
  constexpr int kBatches = 4;
  for (int i = 0; i < kBatches; ++i) {
    // Steps far from the training steps: different text windows and noise.
    const data::Seq2SeqBatch b = loader.Batch(100000 + i);
    sum += model.Loss(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, b.decoder_targets);
  }
  model.Train(true);
  return sum / kBatches;
}

TEST(T5TrainTest, SpanCorruptionLossFallsOnByteText) {
  auto text = data::ByteTextSource::OpenDefault(/*seed=*/1);
  ASSERT_TRUE(text.ok()) << text.status();
  data::SpanCorruptionOptions options;
  options.encoder_length = 48;
  options.num_sentinels = 16;
  options.seed = 2;
  auto loader = data::SpanCorruptionLoader::Create(std::move(*text), {8, 0, 1}, options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ(loader->vocab_size(), 256 + 16);

  T5Config c;
  c.name = "t5-byte-tiny";
  c.vocab_size = loader->vocab_size();
  c.d_model = 32;
  c.num_heads = 4;
  c.d_kv = 8;
  c.d_ff = 64;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 16;
  c.relative_attention_max_distance = 64;
  c.dropout_rate = 0.1f;
  T5Model model(c);
  model.Materialize(7);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  adamw.weight_decay = 0.01;
  auto opt = optim::AdamW::Create(adamw);
  ASSERT_TRUE(opt.ok()) << opt.status();

  const double before = EvalLoss(model, *loader);
  std::vector<double> losses;
  for (int step = 0; step < 40; ++step) {
    const data::Seq2SeqBatch b = loader->Next();
    model.ZeroGrad();
    losses.push_back(model.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs,
                                           b.decoder_targets));
    std::vector<optim::ParamRef> refs = optim::FromModule(model);
    (*opt)->Step(refs);
    if (step % 10 == 0 || step == 39) std::printf("step %d loss %.4f\n", step, losses.back());
  }
  const double after = EvalLoss(model, *loader);
  std::printf("held-out loss %.4f -> %.4f\n", before, after);
  for (double l : losses) ASSERT_TRUE(std::isfinite(l));
  // At init the logits are ~N(0, 1) over 272 ids: about log(272) + 0.5 = 6.1.
  // 40 steps reach about 3.05 (roughly the byte unigram entropy of the text).
  EXPECT_GT(before, 5.5);
  EXPECT_LT(after, 3.6) << "held-out loss went from " << before << " to " << after;
  EXPECT_LT(after, before - 2.0);
}

}  // namespace
}  // namespace t5
