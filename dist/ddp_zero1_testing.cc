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

std::vector<std::pair<int64_t, float>> ReducedSlices(const Zero1& zero) {
  std::vector<std::pair<int64_t, float>> out;
  for (int b = 0; b < zero.num_buckets(); ++b) {
    const Zero1::Segment seg = zero.segment(b);
    int64_t unpadded = 0;
    for (int c = 0; c < zero.num_buckets(); ++c) {
      if (zero.segment(c).begin < seg.begin) unpadded += zero.segment(c).numel;
    }
    const std::vector<float> g = zero.grad_shard(b).ToVector<float>();
    for (int64_t j = 0; j < static_cast<int64_t>(g.size()); ++j) {
      const int64_t in_segment = seg.shard_begin - seg.begin + j;
      out.emplace_back(in_segment < seg.numel ? unpadded + in_segment : -1, g[j]);
    }
  }
  return out;
}

void ExpectSlicesEqual(const std::vector<std::pair<int64_t, float>>& slices,
                       const std::vector<float>& want, double tol, int rank) {
  int64_t checked = 0;
  for (auto& [pos, v] : slices) {
    if (pos < 0) {
      EXPECT_EQ(v, 0.0f) << "rank " << rank << ": padding";
      continue;
    }
    ASSERT_LT(pos, static_cast<int64_t>(want.size()));
    EXPECT_NEAR(v, want[pos], tol) << "rank " << rank << " @" << pos;
    ++checked;
  }
  EXPECT_GT(checked, 0) << "rank " << rank;
}

}  // namespace ddp_zero1_testing
}  // namespace dist
