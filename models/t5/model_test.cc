// T5Model: names and counts agree with config.h, finite-difference gradients
// of every parameter of a tiny T5 (tied v1.0 and untied gated v1.1; shared
// embedding and relative biases included), the encoder padding mask hides
// padded positions, activation checkpointing is exact with dropout on, and
// AdamW overfits a fixed batch.
#include "models/t5/model.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/checkpoint.h"
#include "nn/freeze.h"
#include "nn/module_testing.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace t5 {
namespace {

using tensor::testing::AllClose;
using tensor::testing::NumericalGradient;

T5Config Tiny() {
  T5Config c;
  c.name = "tiny";
  c.vocab_size = 13;
  c.d_model = 8;
  c.num_heads = 2;
  c.d_kv = 4;
  c.d_ff = 16;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.0f;
  return c;
}

Tensor Ids(std::vector<int64_t> v, int64_t B, int64_t T) {
  return Tensor::FromData<int64_t>(v, {B, T});
}

// A padded batch as data::Seq2SeqBatch holds it: B = 2, S = 6, T = 5; row 1's
// encoder input has 2 padding positions, row 1's targets one ignored position.
struct Batch {
  Tensor encoder_inputs = Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 2, 0, 0}, 2, 6);
  Tensor encoder_mask = Ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2, 6);
  Tensor decoder_inputs = Ids({0, 11, 6, 2, 10, 0, 12, 3, 3, 0}, 2, 5);
  Tensor decoder_targets = Ids({11, 6, 2, 10, 1, 12, 3, 3, 7, -100}, 2, 5);
};

double ForwardBackward(T5Model& m, const Batch& b) {
  return m.ForwardBackward(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, b.decoder_targets);
}
double Loss(T5Model& m, const Batch& b) {
  return m.Loss(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, b.decoder_targets);
}

void ExpectNamesAndCountsMatch(const T5Config& c) {
  T5Model model(c);
  auto params = model.NamedParameters();
  const std::vector<ParamShape> shapes = ParameterShapes(c);
  ASSERT_EQ(params.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(params[i].first, shapes[i].name);
    EXPECT_EQ(params[i].second->shape.dims(),
              tensor::Dims(shapes[i].shape.begin(), shapes[i].shape.end()))
        << shapes[i].name;
  }
  EXPECT_EQ(model.NumParameters(), CountParameters(c).total);
}

// Counts the backward passes of the modules it is installed on.
class BackwardCounter : public nn::ModuleHooks {
 public:
  void PostBackward(nn::Module& m) override { ++counts[&m]; }
  std::map<nn::Module*, int> counts;
};

// Fine-tuning with frozen parameters: the backward stops where nothing below
// trains (a frozen encoder with the shared embedding frozen runs none; the
// decoder's frozen lower blocks run none unless the encoder trains, which
// their cross-attention gradients feed), and every trainable gradient is, to
// the bit, the one of the unfrozen model.
TEST(T5ModelTest, BackwardStopsWhereNothingBelowTrains) {
  const Batch b;
  T5Model reference(Tiny());
  reference.Materialize(5);
  const double loss = ForwardBackward(reference, b);
  struct Case {
    std::vector<std::string> freeze;
    std::vector<int> encoder_blocks, decoder_blocks;  // backwards per block
  };
  for (const Case& k : std::vector<Case>{
           {{"shared", "encoder"}, {0, 0}, {1, 1}},
           {{"shared", "encoder", "decoder.block.0"}, {0, 0}, {0, 1}},
           {{"shared", "decoder.block.0"}, {1, 1}, {1, 1}},
           {{"shared", "encoder.block.0"}, {0, 1}, {1, 1}},
           {{"encoder.block.0", "decoder.block.0"}, {1, 1}, {1, 1}},
       }) {
    SCOPED_TRACE(k.freeze.back());
    T5Model model(Tiny());
    ASSERT_TRUE(nn::FreezeParameters(model, k.freeze).ok());
    model.Materialize(5);
    BackwardCounter counter;
    for (T5Stack* stack : {model.encoder(), model.decoder()}) {
      for (size_t l = 0; l < 2; ++l) stack->block(l)->set_hooks(&counter);
    }
    EXPECT_EQ(ForwardBackward(model, b), loss);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(counter.counts[model.encoder()->block(l)], k.encoder_blocks[l]) << "encoder " << l;
      EXPECT_EQ(counter.counts[model.decoder()->block(l)], k.decoder_blocks[l]) << "decoder " << l;
    }
    nn::testing::ExpectTrainableGradsAndNoneFrozen(model, reference);
  }
}

TEST(T5ModelTest, NamesAndCountsMatchTheConfig) {
  ExpectNamesAndCountsMatch(Tiny());
  ExpectNamesAndCountsMatch(AsV1_1(Tiny()));
  T5Config uneven = Tiny();
  uneven.num_layers = 3;
  uneven.num_decoder_layers = 1;
  uneven.d_kv = 5;
  ExpectNamesAndCountsMatch(uneven);
  // t5-small, unmaterialized: nothing is allocated.
  T5Model small(*Preset("t5-small"));
  EXPECT_EQ(small.NumParameters(), 60506624);
  EXPECT_EQ(small.encoder()->block(1)->class_name(), "T5Block");
  EXPECT_EQ(small.decoder()->block(5)->class_name(), "T5Block");
  EXPECT_EQ(small.lm_head(), nullptr);
  EXPECT_TRUE(small.encoder()->block(0)->has_relative_bias());
  EXPECT_FALSE(small.decoder()->block(1)->has_relative_bias());
}

void ExpectGradientsMatchFiniteDifferences(const T5Config& c, uint64_t seed) {
  T5Model model(c);
  model.Materialize(seed);
  const Batch b;
  const double loss = ForwardBackward(model, b);
  EXPECT_NEAR(loss, Loss(model, b), 1e-6);
  EXPECT_GT(loss, 1.0);
  EXPECT_LT(loss, 6.0);
  int checked = 0;
  for (auto& [name, p] : model.NamedParameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    const Tensor numeric =
        NumericalGradient([&](const Tensor&) { return Loss(model, b); }, p->value, 1e-3);
    // The loss comes from an f32 forward: its rounding (~1e-6 absolute at loss ~3)
    // puts a noise floor of ~5e-4 under central differences with eps 1e-3, which
    // a 1-ulp change in GELU's exp was enough to cross at 3e-4.
    EXPECT_TRUE(AllClose(p->grad, numeric, 1e-3, 2e-2)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(ParameterShapes(c).size()));
}

TEST(T5ModelTest, GradientsOfTheWholeModelMatchFiniteDifferences) {
  ExpectGradientsMatchFiniteDifferences(Tiny(), 3);
}

TEST(T5ModelTest, GradientsOfTheGatedUntiedModelMatchFiniteDifferences) {
  ExpectGradientsMatchFiniteDifferences(AsV1_1(Tiny()), 4);
}

// shared.weight's gradient is the sum of three uses: the tied projection,
// the decoder lookup and the encoder lookup. An id that only the encoder sees
// gets a gradient row from the encoder lookup alone (plus the projection,
// which touches every row); an id nobody looks up gets the projection's only.
TEST(T5ModelTest, SharedEmbeddingCollectsEveryUse) {
  T5Model model(Tiny());
  model.Materialize(5);
  const Batch b;
  ForwardBackward(model, b);
  const Tensor tied = model.shared()->weight()->grad;
  // The same loss with an untied copy of the projection: its gradient moves to lm_head.
  T5Config untied_config = Tiny();
  untied_config.tie_word_embeddings = false;
  T5Model untied(untied_config);
  untied.Materialize(5);
  for (auto& [name, p] : untied.NamedParameters()) {
    if (name == "lm_head.weight") {
      // (x * d^-0.5) @ W^T == x @ (W * d^-0.5)^T
      p->value = tensor::Scale(model.shared()->weight()->value, 1.0 / std::sqrt(8.0));
    }
  }
  for (auto& [name, p] : model.NamedParameters()) {
    for (auto& [name2, p2] : untied.NamedParameters()) {
      if (name == name2) p2->value = p->value;
    }
  }
  EXPECT_NEAR(Loss(model, b), Loss(untied, b), 1e-5);
  ForwardBackward(untied, b);
  const Tensor lookups = untied.shared()->weight()->grad;  // encoder + decoder lookups
  const Tensor projection = tensor::Scale(untied.lm_head()->weight()->grad, 1.0 / std::sqrt(8.0));
  EXPECT_TRUE(AllClose(tied, tensor::Add(lookups, projection), 1e-5, 1e-4));
  // Id 6 is only in a decoder input, id 9 only in an encoder input: both rows
  // get lookup gradients; id 0 is padding at masked encoder positions and the
  // decoder start token.
  const std::vector<float> g = lookups.ToVector<float>();
  auto row_norm = [&](int id) {
    double s = 0;
    for (int i = 0; i < 8; ++i) s += g[id * 8 + i] * g[id * 8 + i];
    return std::sqrt(s);
  };
  EXPECT_GT(row_norm(6), 1e-4);
  EXPECT_GT(row_norm(9), 1e-4);
}

// Padded encoder positions change nothing: neither the loss nor any gradient.
TEST(T5ModelTest, PaddedEncoderPositionsDoNotChangeTheLoss) {
  T5Model model(Tiny());
  model.Materialize(6);
  Batch b;
  const double loss = Loss(model, b);
  Batch other_padding = b;
  other_padding.encoder_inputs = Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 2, 11, 6}, 2, 6);
  EXPECT_DOUBLE_EQ(Loss(model, other_padding), loss);
  // Control: an unmasked position, or the same position without the mask, does change it.
  Batch unmasked_change = b;
  unmasked_change.encoder_inputs = Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 6, 0, 0}, 2, 6);
  EXPECT_GT(std::abs(Loss(model, unmasked_change) - loss), 1e-4);
  Batch no_mask = other_padding;
  no_mask.encoder_mask = Ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2, 6);
  EXPECT_GT(std::abs(Loss(model, no_mask) - loss), 1e-4);
  // An undefined mask means no padding.
  Batch undefined_mask = no_mask;
  undefined_mask.encoder_mask = Tensor();
  EXPECT_DOUBLE_EQ(Loss(model, undefined_mask), Loss(model, no_mask));
  // Gradients agree too, except the embedding rows of the swapped padding ids.
  auto grads = [&](const Batch& batch) {
    model.ZeroGrad();
    ForwardBackward(model, batch);
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : model.NamedParameters()) {
      if (name != "shared.weight") out.push_back(p->grad.ToVector<float>());
    }
    return out;
  };
  EXPECT_EQ(grads(b), grads(other_padding));
}

TEST(T5ModelTest, CheckpointedBlocksGiveTheSameGradients) {
  T5Config c = Tiny();
  c.dropout_rate = 0.1f;
  auto grads = [&](bool checkpoint) {
    T5Model model(c);
    model.Materialize(4);
    nn::SeedRandomSources(model, 5);
    if (checkpoint) {
      for (T5Stack* stack : {model.encoder(), model.decoder()}) {
        for (size_t l = 0; l < stack->blocks()->size(); ++l) {
          stack->blocks()->set_checkpointed(l, true);
        }
      }
    }
    const double loss = ForwardBackward(model, Batch());
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : model.NamedParameters()) out.push_back(p->grad.ToVector<float>());
    return std::make_pair(loss, out);
  };
  const auto plain = grads(false);
  const auto checkpointed = grads(true);
  EXPECT_EQ(plain.first, checkpointed.first);
  EXPECT_EQ(plain.second, checkpointed.second);
  // Dropout is really on: another seed gives another loss.
  T5Model model(c);
  model.Materialize(4);
  nn::SeedRandomSources(model, 6);
  EXPECT_NE(ForwardBackward(model, Batch()), plain.first);
}

TEST(T5ModelTest, AdamWOverfitsAFixedBatch) {
  T5Config c = Tiny();
  c.d_model = 16;
  c.d_ff = 32;
  T5Model model(c);
  model.Materialize(6);
  optim::AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.0;
  auto opt = optim::AdamW::Create(options);
  ASSERT_TRUE(opt.ok());
  const Batch b;
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    model.ZeroGrad();
    last = ForwardBackward(model, b);
    if (step == 0) first = last;
    std::vector<optim::ParamRef> refs = optim::FromModule(model);
    (*opt)->Step(refs);
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.05) << "loss went from " << first << " to " << last;
}

TEST(T5ModelTest, BadInputsAreClearErrors) {
  T5Config bad = Tiny();
  bad.relative_attention_num_buckets = 5;
  try {
    T5Model model(bad);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[t5] t5 config tiny("), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("relative_attention_num_buckets must be even"),
              std::string::npos)
        << e.what();
  }
  T5Model model(Tiny());
  model.Materialize(1);
  const Batch b;
  try {
    model.Loss(b.encoder_inputs, b.encoder_mask, b.decoder_inputs, Ids({1, 2, 3, 4}, 2, 2));
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[t5] decoder_targets (2,2) must be i32/i64 and match decoder_inputs (2,5)");
  }
  try {
    model.Loss(b.encoder_inputs, Ids({1, 1, 1}, 1, 3), b.decoder_inputs, b.decoder_targets);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[t5] encoder_mask (1,3) does not match encoder_inputs (2,6)");
  }
}

}  // namespace
}  // namespace t5
