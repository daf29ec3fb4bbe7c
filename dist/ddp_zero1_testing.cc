// The DDP / ZeRO-1 tests' shared fixtures (ddp_zero1_testing.h).
#include "dist/ddp_zero1_testing.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace dist {
namespace ddp_zero1_testing {

using tensor::Tensor;

Batch RandomBatch(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> tok(0, 10);
  Batch b;
  for (int64_t i = 0; i < kGlobalRows * kT; ++i) {
    b.idx.push_back(tok(gen));
    b.targets.push_back(tok(gen));
  }
  return b;
}

Tensor Rows(const std::vector<int64_t>& v, int r, int n) {
  const int64_t B = kGlobalRows / n;
  std::vector<int64_t> out(v.begin() + r * B * kT, v.begin() + (r + 1) * B * kT);
  return Tensor::FromData<int64_t>(out, {B, kT});
}

std::vector<float> FlatParams(nn::Module& m) {
  std::vector<float> out;
  for (auto& [name, p] : m.NamedParameters()) {
    auto v = p->value.ToVector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> FlatGrads(nn::Module& m) {
  std::vector<float> out;
  for (auto& [name, p] : m.NamedParameters()) {
    auto v = p->grad.ToVector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

std::unique_ptr<optim::Optimizer> MakeOptimizer(Opt opt) {
  if (opt == Opt::kSgd) {
    optim::SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    return optim::SGD::Create(o).value();
  }
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return optim::AdamW::Create(o).value();
}

}  // namespace ddp_zero1_testing
}  // namespace dist
