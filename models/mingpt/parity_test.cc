// Parity with PyTorch: our minGPT against Karpathy's minGPT run by
// tools/mingpt_reference.py (Debian's python3-torch), through the fixture
// testdata/tiny_gpt_reference.safetensors. The fixture's weights are loaded by
// name (LoadStateDict: every name must match exactly, none missing, none
// extra); the loss and the gradient of every parameter on one batch, then the
// losses of three SGD steps (momentum 0.9, weight decay 0.01 on Linear
// weights only, as torch.optim.SGD with two parameter groups) must match.
//
// Tolerance, elementwise: |ours - torch| <= kAtol + kRtol * |torch|, with
// kRtol = 1e-4 and an absolute floor kAtol = 1e-6 for entries near zero
// (gradients here are up to ~0.4; the gradient of each attention key bias is
// exactly 0 in exact arithmetic, and wte rows of unused tokens are 0). The
// reference values were computed in float64 from the f32 weights; PyTorch's
// own float32 run uses at most ~3% of this tolerance (the script prints it).
//
// Regenerate the fixture (one line):
//   /usr/bin/python3 tools/mingpt_reference.py
//       --out models/mingpt/testdata/tiny_gpt_reference.safetensors
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "models/common/parity_testing.h"
#include "models/mingpt/model.h"
#include "nn/state_dict.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/safetensors.h"

namespace mingpt {
namespace {

constexpr char kFixture[] = "models/mingpt/testdata/tiny_gpt_reference.safetensors";
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-6;

using ::train::testing::AsDoubles;
using ::train::testing::Meta;
using ::train::testing::MetaDoubles;
using Fixture = ::train::testing::ParityFixture;

bool IsReferenceEntry(const std::string& name) {
  return name == "idx" || name == "targets" || name == "loss" || name.rfind("grad.", 0) == 0 ||
         name.rfind("sgd_", 0) == 0;
}

Fixture LoadFixture() { return train::testing::LoadParityFixture(kFixture, IsReferenceEntry); }

int64_t MetaInt(const Fixture& f, const std::string& key) {
  int64_t v = 0;
  EXPECT_TRUE(absl::SimpleAtoi(Meta(f, key), &v)) << key;
  return v;
}

double MetaDouble(const Fixture& f, const std::string& key) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(Meta(f, key), &v)) << key;
  return v;
}

GptConfig ConfigOf(const Fixture& f) {
  GptConfig c;
  c.name = "parity";
  c.n_layer = MetaInt(f, "n_layer");
  c.n_head = MetaInt(f, "n_head");
  c.n_embd = MetaInt(f, "n_embd");
  c.vocab_size = MetaInt(f, "vocab_size");
  c.block_size = MetaInt(f, "block_size");
  c.dropout = static_cast<float>(MetaDouble(f, "dropout"));
  return c;
}

void ExpectMatches(const std::string& what, const std::vector<double>& ours,
                   const std::vector<double>& torch) {
  train::testing::ExpectMatches(what, ours, torch, kRtol, kAtol);
}

// A GPT with the fixture's config and weights.
std::unique_ptr<GPT> LoadedGpt(const Fixture& f) {
  const GptConfig c = ConfigOf(f);
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  auto gpt = std::make_unique<GPT>(c);
  gpt->Materialize(/*seed=*/7);  // overwritten below: every parameter must be in the fixture
  absl::Status s = nn::LoadStateDict(*gpt, f.weights);
  EXPECT_TRUE(s.ok()) << s;
  return gpt;
}

TEST(MinGptParityTest, FixtureNamesAreOurParameterNames) {
  const Fixture f = LoadFixture();
  ASSERT_FALSE(f.weights.empty());
  const std::vector<ParamShape> shapes = ParameterShapes(ConfigOf(f));
  ASSERT_EQ(f.weights.size(), shapes.size());
  // The script writes the weights in PyTorch's registration order, which is ours.
  const std::vector<std::string> torch_order = absl::StrSplit(Meta(f, "param_names"), ',');
  ASSERT_EQ(torch_order.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(torch_order[i], shapes[i].name);
    EXPECT_EQ(f.weights[i].first, shapes[i].name);
    EXPECT_EQ(f.weights[i].second.dtype(), tensor::Dtype::kF32) << shapes[i].name;
    EXPECT_EQ(f.weights[i].second.shape().dims(),
              tensor::Dims(shapes[i].shape.begin(), shapes[i].shape.end()))
        << shapes[i].name;
    EXPECT_EQ(f.reference.count("grad." + shapes[i].name), 1u) << shapes[i].name;
  }
}

TEST(MinGptParityTest, LossAndGradientsMatchPyTorch) {
  const Fixture f = LoadFixture();
  ASSERT_FALSE(f.weights.empty());
  std::unique_ptr<GPT> gpt = LoadedGpt(f);
  ASSERT_FALSE(HasFailure());
  const Tensor& idx = f.reference.at("idx");
  const Tensor& targets = f.reference.at("targets");
  ASSERT_EQ(idx.dtype(), tensor::Dtype::kI64);
  ASSERT_EQ(idx.shape().dims(), tensor::Dims({3, 8}));

  const double loss = gpt->ForwardBackward(idx, targets);
  // The f64 value from the metadata, then the f32 tensor the fixture also holds.
  ExpectMatches("loss", {loss}, MetaDoubles(f, "ref.loss"));
  ExpectMatches("loss (f32 tensor)", {loss}, AsDoubles(f.reference.at("loss")));
  int checked = 0;
  for (auto& [name, p] : gpt->NamedParameters()) {
    auto it = f.reference.find("grad." + name);
    ASSERT_NE(it, f.reference.end()) << name;
    ASSERT_TRUE(p->grad.defined()) << name;
    ExpectMatches("grad." + name, AsDoubles(p->grad), AsDoubles(it->second));
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(ParameterShapes(gpt->config()).size()));
}

TEST(MinGptParityTest, ThreeSgdStepsMatchPyTorch) {
  const Fixture f = LoadFixture();
  ASSERT_FALSE(f.weights.empty());
  std::unique_ptr<GPT> gpt = LoadedGpt(f);
  ASSERT_FALSE(HasFailure());
  optim::SgdOptions options;
  options.lr = MetaDouble(f, "sgd.lr");
  options.momentum = MetaDouble(f, "sgd.momentum");
  options.dampening = MetaDouble(f, "sgd.dampening");
  options.nesterov = MetaInt(f, "sgd.nesterov") != 0;
  options.weight_decay = MetaDouble(f, "sgd.weight_decay");
  EXPECT_GT(options.momentum, 0.0);
  EXPECT_GT(options.weight_decay, 0.0);
  auto sgd = optim::SGD::Create(options);
  ASSERT_TRUE(sgd.ok()) << sgd.status();

  // PyTorch decays exactly the parameters our model marks for decay.
  const std::vector<std::string> decayed = absl::StrSplit(Meta(f, "sgd.decayed"), ',');
  const std::set<std::string> torch_decay(decayed.begin(), decayed.end());
  gpt->ZeroGrad();
  gpt->ForwardBackward(f.reference.at("idx"), f.reference.at("targets"));  // creates the grads
  std::set<std::string> our_decay;
  for (const optim::ParamRef& ref : optim::FromModule(*gpt)) {
    if (!ref.decay_ranges.empty()) our_decay.insert(ref.name);
  }
  EXPECT_EQ(our_decay, torch_decay);

  const int64_t steps = MetaInt(f, "sgd.steps");
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    gpt->ZeroGrad();
    losses.push_back(gpt->ForwardBackward(f.reference.at("idx"), f.reference.at("targets")));
    (*sgd)->Step(optim::FromModule(*gpt));
  }
  const double final_loss = gpt->Loss(f.reference.at("idx"), f.reference.at("targets"));
  const std::vector<double> torch_losses = MetaDoubles(f, "ref.sgd_losses");
  ASSERT_EQ(torch_losses.size(), static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    ExpectMatches(absl::StrCat("sgd_losses[", i, "]"), {losses[i]}, {torch_losses[i]});
    std::printf("  loss before step %d: ours %.9f, PyTorch %.9f\n", static_cast<int>(i + 1),
                losses[i], torch_losses[i]);
  }
  ExpectMatches("sgd_final_loss", {final_loss}, MetaDoubles(f, "ref.sgd_final_loss"));
  ExpectMatches("sgd_losses (f32 tensor)", losses, AsDoubles(f.reference.at("sgd_losses")));
  ExpectMatches("sgd_final_loss (f32 tensor)", {final_loss},
                AsDoubles(f.reference.at("sgd_final_loss")));
}

}  // namespace
}  // namespace mingpt
