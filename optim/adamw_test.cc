// AdamW against a double-precision textbook reference over several steps and
// against values printed by PyTorch (testdata/torch_reference.py).
#include "optim/adamw.h"

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

// torch.optim.AdamW's algorithm (amsgrad off), in double, for one flat parameter.
struct AdamWReference {
  AdamWOptions o;
  std::vector<double> p;
  std::vector<bool> decay;  // per element
  std::vector<double> m, v;
  int64_t t = 0;

  void Step(const std::vector<double>& g) {
    ++t;
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      if (decay[i]) p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      p[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
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

AdamWOptions Opt(double lr, double beta1, double beta2, double eps, double wd) {
  AdamWOptions o;
  o.lr = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = wd;
  return o;
}

std::unique_ptr<AdamW> MakeAdamW(const AdamWOptions& o) {
  auto adamw = AdamW::Create(o);
  EXPECT_TRUE(adamw.ok()) << adamw.status();
  return std::move(*adamw);
}

class AdamWReferenceTest : public ::testing::TestWithParam<AdamWOptions> {};

TEST_P(AdamWReferenceTest, MatchesReferenceOverSteps) {
  const AdamWOptions o = GetParam();
  const tensor::Shape shape{3, 13};  // 39 elements: vector body and remainder
  Tensor param = RandomTensor(shape, 11);
  AdamWReference ref{o, ToDouble(param), std::vector<bool>(39, true)};
  auto adamw = MakeAdamW(o);
  for (int step = 0; step < 6; ++step) {
    Tensor grad = RandomTensor(shape, 200 + step);
    std::vector<ParamRef> refs = {MakeParamRef("w", param, grad, /*decay=*/true)};
    adamw->Step(refs);
    ref.Step(ToDouble(grad));
    ASSERT_TRUE(AllClose(param, FromDouble(ref.p, shape), 1e-6, 1e-6)) << "step " << step;
    NamedTensors state = adamw->StateTensors();
    ASSERT_EQ(state.size(), 3u);
    EXPECT_EQ(state[0].first, "w.step");
    EXPECT_EQ(state[0].second.Item(), step + 1);
    EXPECT_EQ(state[1].first, "w.exp_avg");
    EXPECT_EQ(state[2].first, "w.exp_avg_sq");
    ASSERT_TRUE(AllClose(state[1].second, FromDouble(ref.m, shape), 1e-7, 1e-6));
    ASSERT_TRUE(AllClose(state[2].second, FromDouble(ref.v, shape), 1e-9, 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, AdamWReferenceTest,
                         ::testing::Values(Opt(1e-3, 0.9, 0.999, 1e-8, 1e-2),  // defaults
                                           Opt(3e-2, 0.9, 0.95, 1e-8, 0.1),
                                           Opt(1e-2, 0.8, 0.99, 1e-3, 0.0),
                                           Opt(5e-3, 0.0, 0.5, 1e-6, 0.3)));

// The lr may change between steps (a schedule): each step uses the current one.
TEST(AdamWTest, UsesCurrentLrEachStep) {
  const AdamWOptions o = Opt(1e-2, 0.9, 0.99, 1e-8, 0.1);
  Tensor param = RandomTensor({20}, 3);
  AdamWReference ref{o, ToDouble(param), std::vector<bool>(20, true)};
  auto adamw = MakeAdamW(o);
  const double lrs[] = {1e-2, 3e-2, 5e-3, 0.0};
  for (int step = 0; step < 4; ++step) {
    adamw->set_lr(lrs[step]);
    ref.o.lr = lrs[step];
    Tensor grad = RandomTensor({20}, 300 + step);
    std::vector<ParamRef> refs = {MakeParamRef("w", param, grad, true)};
    adamw->Step(refs);
    ref.Step(ToDouble(grad));
    ASSERT_TRUE(AllClose(param, FromDouble(ref.p, {20}), 1e-6, 1e-6)) << "step " << step;
  }
}

// The (2, 3) case of testdata/torch_reference.py: gradient i at step t.
std::vector<float> TorchCaseGrad(int t) {
  std::vector<float> g(6);
  for (int i = 0; i < 6; ++i) g[i] = static_cast<float>((i * 7 + t * 3) % 11 - 5) / 8.0f;
  return g;
}

void CheckAgainstTorch(const AdamWOptions& o, const float (&expected)[4][6]) {
  Tensor param = Tensor::FromVector({0.5f, -1.25f, 2.0f, 0.0f, -0.75f, 1.5f}, {2, 3});
  auto adamw = MakeAdamW(o);
  for (int t = 1; t <= 4; ++t) {
    std::vector<ParamRef> refs = {
        MakeParamRef("p", param, Tensor::FromVector(TorchCaseGrad(t), {2, 3}), true)};
    adamw->Step(refs);
    Tensor want =
        Tensor::FromVector(std::vector<float>(expected[t - 1], expected[t - 1] + 6), {2, 3});
    ASSERT_TRUE(AllClose(param, want, 1e-6, 1e-6)) << "step " << t;
  }
}

// Values printed by optim/testdata/torch_reference.py (PyTorch 1.13).
TEST(AdamWTest, MatchesPyTorchWithDecay) {
  const float kTorch[4][6] = {
      {0.509500027f, -1.25874996f, 1.98800004f, 0.00999999978f, -0.759249985f, 1.49849999f},
      {0.511674225f, -1.25941765f, 1.97726476f, 0.0167764779f, -0.757964432f, 1.48965192f},
      {0.506654322f, -1.25966656f, 1.97483659f, 0.0159012116f, -0.755675256f, 1.49063694f},
      {0.507132351f, -1.2622087f, 1.97349143f, 0.0197973698f, -0.755674958f, 1.49295223f}};
  CheckAgainstTorch(Opt(0.01, 0.9, 0.95, 1e-8, 0.1), kTorch);
}

TEST(AdamWTest, MatchesPyTorchLargeEpsNoDecay) {
  const float kTorch[4][6] = {
      {0.549800813f, -1.29992008f, 1.95039678f, 0.0498670302f, -0.799900174f, 1.5f},
      {0.560304463f, -1.30665207f, 1.90488946f, 0.081254594f, -0.79435569f, 1.46096146f},
      {0.533201337f, -1.31152809f, 1.90587342f, 0.0722490773f, -0.784224153f, 1.4766922f},
      {0.539755225f, -1.33034873f, 1.91240883f, 0.0934926346f, -0.788058877f, 1.49901426f}};
  CheckAgainstTorch(Opt(0.05, 0.8, 0.99, 1e-3, 0.0), kTorch);
}

// A flat tensor with half its elements in decay ranges gets decay only there.
TEST(AdamWTest, DecayOnlyInsideDecayRanges) {
  const int64_t n = 64;
  const AdamWOptions o = Opt(0.05, 0.9, 0.99, 1e-8, 0.5);
  const ElementRanges ranges = {{0, 10}, {20, 30}, {40, 52}};  // 32 elements
  Tensor mixed = RandomTensor({n}, 9);
  Tensor all = mixed.Clone();
  Tensor none = mixed.Clone();
  auto a_mixed = MakeAdamW(o), a_all = MakeAdamW(o), a_none = MakeAdamW(o);
  AdamWReference ref{o, ToDouble(mixed), std::vector<bool>(n, false)};
  for (const auto& [b, e] : ranges) {
    for (int64_t i = b; i < e; ++i) ref.decay[i] = true;
  }
  for (int step = 0; step < 3; ++step) {
    Tensor grad = RandomTensor({n}, 70 + step);
    std::vector<ParamRef> r_mixed = {{"w", mixed, grad, ranges}};
    std::vector<ParamRef> r_all = {MakeParamRef("w", all, grad, true)};
    std::vector<ParamRef> r_none = {MakeParamRef("w", none, grad, false)};
    a_mixed->Step(r_mixed);
    a_all->Step(r_all);
    a_none->Step(r_none);
    ref.Step(ToDouble(grad));
  }
  const std::vector<float> m = mixed.ToVector<float>(), a = all.ToVector<float>(),
                           z = none.ToVector<float>();
  int differs = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(m[i], ref.decay[i] ? a[i] : z[i]) << "element " << i;
    differs += a[i] != z[i];
  }
  EXPECT_GT(differs, n / 2);  // decay made a difference
  EXPECT_TRUE(AllClose(mixed, FromDouble(ref.p, {n}), 1e-6, 1e-6));
}

// The ledger charges exactly 2 x 4 bytes per element to kOptimizerState (the
// step counters are plain integers), and gets it all back with the optimizer.
TEST(AdamWTest, LedgerCountsStateExactly) {
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  const auto cpu = tensor::Device::Cpu();
  const auto category = tensor::MemoryCategory::kOptimizerState;
  const int64_t numel = 1000 + 37 + 6;
  {
    auto adamw = MakeAdamW(AdamWOptions{});
    Tensor a = RandomTensor({1000}, 1), b = RandomTensor({37}, 2), c = RandomTensor({2, 3}, 3);
    std::vector<ParamRef> refs = {MakeParamRef("a", a, RandomTensor({1000}, 4), true),
                                  MakeParamRef("b", b, RandomTensor({37}, 5), false),
                                  MakeParamRef("c", c, RandomTensor({2, 3}, 6), true)};
    const int64_t before = ledger.Stats(cpu, category).current;
    EXPECT_EQ(before, 0);
    adamw->Step(refs);
    EXPECT_EQ(adamw->StateBytes(), 2 * 4 * numel);
    EXPECT_EQ(ledger.Stats(cpu, category).current, 2 * 4 * numel);
    adamw->Step(refs);  // no new state on later steps
    EXPECT_EQ(ledger.Stats(cpu, category).current, 2 * 4 * numel);
    EXPECT_EQ(ledger.Stats(cpu, category).peak, 2 * 4 * numel);
  }
  EXPECT_EQ(ledger.Stats(cpu, category).current, 0);
}

TEST(AdamWTest, CreateRejectsInvalidOptions) {
  struct Case {
    AdamWOptions o;
    const char* says;
  };
  const Case cases[] = {
      {Opt(-1e-3, 0.9, 0.999, 1e-8, 0), "lr must be finite and >= 0"},
      {Opt(1e-3, 1.0, 0.999, 1e-8, 0), "beta1 must be in [0, 1)"},
      {Opt(1e-3, -0.1, 0.999, 1e-8, 0), "beta1"},
      {Opt(1e-3, 0.9, 1.0, 1e-8, 0), "beta2 must be in [0, 1)"},
      {Opt(1e-3, 0.9, 0.999, -1e-8, 0), "eps must be finite and >= 0"},
      {Opt(1e-3, 0.9, 0.999, 1e-8, -0.1), "weight_decay must be finite and >= 0"},
      {Opt(1e-3, NAN, 0.999, 1e-8, 0), "beta1"},
  };
  for (const Case& c : cases) {
    auto adamw = AdamW::Create(c.o);
    ASSERT_FALSE(adamw.ok());
    EXPECT_EQ(adamw.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(adamw.status().message()).find(c.says), std::string::npos)
        << adamw.status();
  }
}

// Settings: every hyperparameter but the learning rate, which a schedule changes.
TEST(AdamWTest, SettingsNameEveryHyperparameterButTheLr) {
  auto a = AdamW::Create(Opt(3e-4, 0.9, 0.95, 1e-8, 0.1));
  auto b = AdamW::Create(Opt(1e-3, 0.9, 0.95, 1e-8, 0.1));
  auto c = AdamW::Create(Opt(3e-4, 0.9, 0.999, 1e-8, 0.1));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)->Settings(), "adamw(beta1=0.9,beta2=0.95,eps=1e-08,weight_decay=0.1)");
  EXPECT_EQ((*a)->Settings(), (*b)->Settings());
  EXPECT_NE((*a)->Settings(), (*c)->Settings());
}

}  // namespace
}  // namespace optim
