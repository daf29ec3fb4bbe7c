// The T5 train binary's start-up lines and samples: the start-up names the
// model, the span corruption and the batch, with a decoded example only for
// byte text; a sampler without a schedule holds no example; a sample shows
// the example's inputs and targets (bytes or ids, sentinels as <extra_id_k>)
// and a tiny model's greedy fill-in, the same on every call.
#include "models/t5/train_report.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/byte_text.h"

namespace t5 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::shared_ptr<const data::TokenSource> Text() {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  return data::ByteTextSource::FromString(text, /*seed=*/1, "fox.txt").value();
}

data::SpanCorruptionOptions Span() {
  data::SpanCorruptionOptions span;
  span.encoder_length = 32;
  span.num_sentinels = 10;
  return span;
}

T5Config Tiny() {
  T5Config c;
  c.name = "tiny";
  c.vocab_size = data::kByteVocabSize + 10;
  c.d_model = 16;
  c.num_heads = 2;
  c.d_kv = 8;
  c.d_ff = 32;
  c.num_layers = 1;
  c.num_decoder_layers = 1;
  return c;
}

train::SampleSchedule Every(int64_t n) { return train::SampleSchedule::Parse(n, "model").value(); }

TEST(T5TrainReportTest, StartupNamesModelDataAndBatchAndDecodesByteText) {
  const auto source = Text();
  const data::SpanCorruptionLoader loader =
      data::SpanCorruptionLoader::Create(source, {2, 0, 1, 1}, Span()).value();
  for (bool show_text : {true, false}) {
    ::testing::internal::CaptureStdout();
    PrintStartup(Tiny(), *source, Span(), loader, "", 2, 1234, "adamw | constant", show_text);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_THAT(out, StartsWith("model "));
    EXPECT_THAT(out, HasSubstr("data: span corruption of"));
    EXPECT_THAT(out, HasSubstr("| vocab 256 + 10 sentinels |"));
    EXPECT_THAT(out, HasSubstr("encoder 32, decoder "));
    EXPECT_THAT(out, HasSubstr("= 1234 tokens/step"));
    EXPECT_THAT(out, HasSubstr("| adamw | constant |"));
    if (show_text) {
      EXPECT_THAT(out, HasSubstr("sample inputs:  "));
      EXPECT_THAT(out, HasSubstr("<extra_id_0>"));
      EXPECT_THAT(out, HasSubstr("sample targets: <extra_id_0>"));
    } else {
      EXPECT_THAT(out, Not(HasSubstr("sample inputs")));
    }
  }
}

TEST(T5TrainReportTest, NoScheduleHoldsNoExample) {
  const Sampler s = MakeSampler(Text(), Span(), Every(0), true).value();
  EXPECT_EQ(s.schedule.every, 0);
  EXPECT_FALSE(s.corruptor.has_value());
  EXPECT_TRUE(s.targets.empty());
}

TEST(T5TrainReportTest, SampleShowsInputsTargetsAndTheModelsFillIn) {
  T5Model model(Tiny());
  model.Materialize(/*seed=*/5);
  model.Train(false);
  for (bool text : {true, false}) {
    SCOPED_TRACE(text ? "text" : "ids");
    const Sampler s = MakeSampler(Text(), Span(), Every(5), text).value();
    ASSERT_TRUE(s.corruptor.has_value());
    ASSERT_EQ(s.encoder_inputs.shape(), tensor::Shape({1, 32}));
    const std::string sample = s.Draw(model, 5, tensor::Device::Cpu()).value();
    EXPECT_THAT(sample, StartsWith("sample at step 5:\n  inputs:  "));
    EXPECT_THAT(sample, HasSubstr("\n  targets: <extra_id_0>"));
    EXPECT_THAT(sample, HasSubstr("\n  model:   "));
    if (text) {
      EXPECT_THAT(sample, HasSubstr("the"));
    } else {
      EXPECT_THAT(sample, HasSubstr(" 116 "));  // 't'
    }
    // Greedy: the same sample every time (every rank draws alike).
    EXPECT_EQ(s.Draw(model, 5, tensor::Device::Cpu()).value(), sample);
  }
}

}  // namespace
}  // namespace t5
