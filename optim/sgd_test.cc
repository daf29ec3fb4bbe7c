// SGD against a double-precision textbook reference over several steps and
// against values printed by PyTorch (testdata/torch_reference.py).
#include "optim/sgd.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace optim {
namespace {

using tensor::Tensor;
using tensor::testing::AllClose;
using tensor::testing::RandomTensor;

// torch.optim.SGD's algorithm, in double, for one flat parameter.
struct SgdReference {
  SgdOptions o;
  std::vector<double> p;
  std::vector<double> buf;
  std::vector<bool> decay;  // per element
  int64_t steps = 0;

  void Step(const std::vector<double>& g) {
    ++steps;
    if (buf.empty()) buf.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i];
      if (decay[i]) d += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = steps == 1 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
};

std::vector<double> ToDouble(const Tensor& t) {
  std::vector<float> f = t.ToVector<float>();
  return std::vector<double>(f.begin(), f.end());
}

Tensor FromDouble(const std::vector<double>& v, const tensor::Shape& shape) {
  return Tensor::FromVector(std::vector<float>(v.begin(), v.end()), shape);
}

std::unique_ptr<SGD> MakeSgd(const SgdOptions& o) {
  auto sgd = SGD::Create(o);
  EXPECT_TRUE(sgd.ok()) << sgd.status();
  return std::move(*sgd);
}

class SgdReferenceTest : public ::testing::TestWithParam<SgdOptions> {};

TEST_P(SgdReferenceTest, MatchesReferenceOverSteps) {
  const SgdOptions o = GetParam();
  const tensor::Shape shape{5, 7};  // 35 elements: vector body and remainder
  Tensor param = RandomTensor(shape, 1);
  SgdReference ref{o, ToDouble(param), {}, std::vector<bool>(35, true)};
  auto sgd = MakeSgd(o);
  for (int step = 0; step < 5; ++step) {
    Tensor grad = RandomTensor(shape, 100 + step);
    std::vector<ParamRef> refs = {MakeParamRef("w", param, grad, /*decay=*/true)};
    sgd->Step(refs);
    ref.Step(ToDouble(grad));
    ASSERT_TRUE(AllClose(param, FromDouble(ref.p, shape), 1e-6, 1e-6)) << "step " << step;
    if (o.momentum != 0) {
      NamedTensors state = sgd->StateTensors();
      ASSERT_EQ(state.size(), 2u);
      EXPECT_EQ(state[1].first, "w.momentum_buffer");
      ASSERT_TRUE(AllClose(state[1].second, FromDouble(ref.buf, shape), 1e-6, 1e-6));
    }
    EXPECT_EQ(sgd->StepCount("w"), step + 1);
  }
}

SgdOptions Opt(double lr, double momentum, double dampening, bool nesterov, double wd) {
  SgdOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.nesterov = nesterov;
  o.weight_decay = wd;
  return o;
}

INSTANTIATE_TEST_SUITE_P(Variants, SgdReferenceTest,
                         ::testing::Values(Opt(0.1, 0, 0, false, 0),       // plain
                                           Opt(0.05, 0.9, 0, false, 0),    // momentum
                                           Opt(0.05, 0.9, 0.3, false, 0),  // dampening
                                           Opt(0.05, 0.9, 0, true, 0),     // nesterov
                                           Opt(0.1, 0, 0, false, 0.05),    // weight decay
                                           Opt(0.05, 0.8, 0.1, false, 0.02),
                                           Opt(0.05, 0.9, 0, true, 0.02)));

// The (2, 3) case of testdata/torch_reference.py: gradient i at step t.
std::vector<float> TorchCaseGrad(int t) {
  std::vector<float> g(6);
  for (int i = 0; i < 6; ++i) g[i] = static_cast<float>((i * 7 + t * 3) % 11 - 5) / 8.0f;
  return g;
}

void CheckAgainstTorch(const SgdOptions& o, const float (&expected)[4][6]) {
  Tensor param = Tensor::FromVector({0.5f, -1.25f, 2.0f, 0.0f, -0.75f, 1.5f}, {2, 3});
  auto sgd = MakeSgd(o);
  for (int t = 1; t <= 4; ++t) {
    std::vector<ParamRef> refs = {
        MakeParamRef("p", param, Tensor::FromVector(TorchCaseGrad(t), {2, 3}), true)};
    sgd->Step(refs);
    Tensor want =
        Tensor::FromVector(std::vector<float>(expected[t - 1], expected[t - 1] + 6), {2, 3});
    ASSERT_TRUE(AllClose(param, want, 1e-6, 1e-6)) << "step " << t;
  }
}

// Values printed by optim/testdata/torch_reference.py (PyTorch 1.13).
TEST(SgdTest, MatchesPyTorchPlain) {
  const float kTorch[4][6] = {
      {0.524999976f, -1.3125f, 1.98749995f, 0.0375000015f, -0.800000012f, 1.5f},
      {0.512499988f, -1.27499998f, 1.9375f, 0.0375000015f, -0.75f, 1.46249998f},
      {0.462499976f, -1.27499998f, 1.98749995f, 9.31322575e-10f, -0.737500012f, 1.52499998f},
      {0.512499988f, -1.3125f, 2.0f, 0.0625f, -0.762499988f, 1.54999995f}};
  CheckAgainstTorch(Opt(0.1, 0, 0, false, 0), kTorch);
}

TEST(SgdTest, MatchesPyTorchMomentum) {
  const float kTorch[4][6] = {
      {0.524999976f, -1.3125f, 1.98749995f, 0.0375000015f, -0.800000012f, 1.5f},
      {0.534999967f, -1.33124995f, 1.92624998f, 0.0712499991f, -0.795000017f, 1.46249998f},
      {0.493999958f, -1.34812498f, 1.92112494f, 0.064124994f, -0.777999997f, 1.49125004f},
      {0.507099986f, -1.40081251f, 1.92901242f, 0.120212495f, -0.787699997f, 1.54212499f}};
  CheckAgainstTorch(Opt(0.1, 0.9, 0, false, 0), kTorch);
}

TEST(SgdTest, MatchesPyTorchDampeningWeightDecay) {
  const float kTorch[4][6] = {
      {0.524500012f, -1.31124997f, 1.98549998f, 0.0375000015f, -0.799250007f, 1.49849999f},
      {0.540037751f, -1.34696937f, 1.94645727f, 0.0712312534f, -0.818175375f, 1.47765076f},
      {0.528751731f, -1.37844336f, 1.93534553f, 0.0828037634f, -0.828549147f, 1.48939764f},
      {0.543329895f, -1.42483068f, 1.93062735f, 0.124427617f, -0.849971235f, 1.51172507f}};
  CheckAgainstTorch(Opt(0.1, 0.9, 0.5, false, 0.01), kTorch);
}

TEST(SgdTest, MatchesPyTorchNesterovWeightDecay) {
  const float kTorch[4][6] = {
      {0.546549976f, -1.36637497f, 1.97245002f, 0.0712499991f, -0.843575001f, 1.49714994f},
      {0.541606545f, -1.34214139f, 1.86195731f, 0.101489618f, -0.786864698f, 1.42184031f},
      {0.452870309f, -1.35276079f, 1.90075147f, 0.0573265739f, -0.75633961f, 1.50520766f},
      {0.512634695f, -1.43220592f, 1.91248047f, 0.170062259f, -0.786888182f, 1.56990802f}};
  CheckAgainstTorch(Opt(0.1, 0.9, 0, true, 0.01), kTorch);
}

// A flat tensor with its middle half in a decay range: those elements step
// exactly as a fully decayed tensor, the others exactly as an undecayed one.
TEST(SgdTest, DecayOnlyInsideDecayRanges) {
  const int64_t n = 64;
  const SgdOptions o = Opt(0.1, 0.9, 0, false, 0.5);
  Tensor mixed = RandomTensor({n}, 7);
  Tensor all = mixed.Clone();
  Tensor none = mixed.Clone();
  auto s_mixed = MakeSgd(o), s_all = MakeSgd(o), s_none = MakeSgd(o);
  SgdReference ref{o, ToDouble(mixed), {}, std::vector<bool>(n, false)};
  for (int64_t i = 16; i < 48; ++i) ref.decay[i] = true;
  for (int step = 0; step < 3; ++step) {
    Tensor grad = RandomTensor({n}, 50 + step);
    std::vector<ParamRef> r_mixed = {{"w", mixed, grad, {{16, 48}}}};
    std::vector<ParamRef> r_all = {MakeParamRef("w", all, grad, true)};
    std::vector<ParamRef> r_none = {MakeParamRef("w", none, grad, false)};
    s_mixed->Step(r_mixed);
    s_all->Step(r_all);
    s_none->Step(r_none);
    ref.Step(ToDouble(grad));
  }
  const std::vector<float> m = mixed.ToVector<float>(), a = all.ToVector<float>(),
                           z = none.ToVector<float>();
  int differs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool in_range = i >= 16 && i < 48;
    EXPECT_EQ(m[i], in_range ? a[i] : z[i]) << "element " << i;
    differs += a[i] != z[i];
  }
  EXPECT_GT(differs, n / 2);  // decay made a difference
  EXPECT_TRUE(AllClose(mixed, FromDouble(ref.p, {n}), 1e-6, 1e-6));
}

TEST(SgdTest, NoMomentumKeepsNoBuffers) {
  auto sgd = MakeSgd(Opt(0.1, 0, 0, false, 0));
  Tensor param = RandomTensor({10}, 1);
  std::vector<ParamRef> refs = {MakeParamRef("w", param, RandomTensor({10}, 2), true)};
  sgd->Step(refs);
  EXPECT_EQ(sgd->StateBytes(), 0);
  NamedTensors state = sgd->StateTensors();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "w.step");
  EXPECT_EQ(state[0].second.Item(), 1.0);
}

TEST(SgdTest, LedgerCountsMomentumBuffer) {
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  const auto cpu = tensor::Device::Cpu();
  const auto category = tensor::MemoryCategory::kOptimizerState;
  {
    auto sgd = MakeSgd(Opt(0.1, 0.9, 0, false, 0));
    Tensor a = RandomTensor({100}, 1), b = RandomTensor({3, 7}, 2);
    std::vector<ParamRef> refs = {MakeParamRef("a", a, RandomTensor({100}, 3), true),
                                  MakeParamRef("b", b, RandomTensor({3, 7}, 4), true)};
    sgd->Step(refs);
    EXPECT_EQ(sgd->StateBytes(), 4 * (100 + 21));
    EXPECT_EQ(ledger.Stats(cpu, category).current, 4 * (100 + 21));
  }
  EXPECT_EQ(ledger.Stats(cpu, category).current, 0);
}

TEST(SgdTest, CreateRejectsInvalidOptions) {
  struct Case {
    SgdOptions o;
    const char* says;
  };
  const Case cases[] = {
      {Opt(-0.1, 0, 0, false, 0), "lr must be finite and >= 0"},
      {Opt(0.1, -0.9, 0, false, 0), "momentum must be finite and >= 0"},
      {Opt(0.1, 0, 0, false, -1), "weight_decay must be finite and >= 0"},
      {Opt(0.1, 0, 0, true, 0), "nesterov"},
      {Opt(0.1, 0.9, 0.1, true, 0), "nesterov"},
      {Opt(NAN, 0, 0, false, 0), "lr"},
  };
  for (const Case& c : cases) {
    auto sgd = SGD::Create(c.o);
    ASSERT_FALSE(sgd.ok());
    EXPECT_EQ(sgd.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(sgd.status().message()).find(c.says), std::string::npos) << sgd.status();
  }
  EXPECT_TRUE(SGD::Create(Opt(0.1, 0.9, 0, true, 0.01)).ok());
}

TEST(SgdTest, SetLrAppliesToNextStep) {
  auto sgd = MakeSgd(Opt(0.1, 0, 0, false, 0));
  Tensor param = Tensor::FromVector({1.0f}, {1});
  std::vector<ParamRef> refs = {MakeParamRef("w", param, Tensor::FromVector({2.0f}, {1}), true)};
  sgd->Step(refs);
  EXPECT_FLOAT_EQ(param.Item(), 1.0f - 0.2f);
  sgd->set_lr(0.25);
  EXPECT_EQ(sgd->lr(), 0.25);
  sgd->Step(refs);
  EXPECT_FLOAT_EQ(param.Item(), 0.8f - 0.5f);
  EXPECT_THROW(sgd->set_lr(-1), tensor::OpError);
}

// Settings: every hyperparameter but the learning rate, which a schedule changes.
TEST(SgdTest, SettingsNameEveryHyperparameterButTheLr) {
  EXPECT_EQ(MakeSgd(Opt(0.1, 0.9, 0, true, 0.01))->Settings(),
            "sgd(momentum=0.9,dampening=0,nesterov=true,weight_decay=0.01)");
  EXPECT_EQ(MakeSgd(Opt(0.5, 0.9, 0, true, 0.01))->Settings(),
            MakeSgd(Opt(0.1, 0.9, 0, true, 0.01))->Settings());
  EXPECT_NE(MakeSgd(Opt(0.1, 0.9, 0, true, 0))->Settings(),
            MakeSgd(Opt(0.1, 0.9, 0, true, 0.01))->Settings());
}

}  // namespace
}  // namespace optim
