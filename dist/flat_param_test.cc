// FlatParameter: the decay ranges of every rank's shard cover exactly the
// decayed parameters, and a flat gradient made for a backward to write is
// written or zeroed, never read as the memory held it (padding, frozen
// parameters, views no backward reached).
#include "dist/flat_param.h"

#include <cmath>
#include <vector>

#include "dist/fsdp_testing.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"

namespace dist {
namespace {

using namespace dist::testing;  // NOLINT: the shared fixtures (Tiny())

TEST(FlatParameterTest, DecayRangesOfShardsCoverTheDecayedParameters) {
  mingpt::GPT gpt(Tiny());
  auto plans = PlanUnits(gpt, WrapPolicy::None());
  // Expected: per-element decay flags of the padded flat buffer.
  std::vector<bool> decay;
  for (auto& [n, p] : plans[0].params) decay.insert(decay.end(), p->numel(), p->weight_decay);
  for (int world : {1, 3, 4}) {
    std::vector<bool> seen;
    for (int r = 0; r < world; ++r) {
      FlatParameter flat(plans[0].params, world, r);
      std::vector<bool> mine(flat.shard_numel(), false);
      for (auto [b, e] : flat.shard_decay_ranges())
        for (int64_t i = b; i < e; ++i) mine[i] = true;
      seen.insert(seen.end(), mine.begin(), mine.end());
    }
    ASSERT_GE(seen.size(), decay.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i], i < decay.size() ? decay[i] : false) << "world " << world << " elem " << i;
    }
  }
}

// A flat gradient made for a backward to write (no memset of the whole): the
// padding and a frozen parameter's elements are zeroed over what the memory
// held (NaN here), every trainable view is marked unwritten, the first GradToWrite
// writes (not adds) and clears its mark, GradBuffer zeroes first, and
// ZeroUnwrittenGrads zeroes the views no backward reached: no NaN left of
// the memory's old contents.
TEST(FlatParameterTest, AnUnwrittenGradientIsWrittenOrZeroedNeverReadAsIs) {
  mingpt::GPT gpt(Tiny());
  auto plans = PlanUnits(gpt, WrapPolicy::None());
  std::vector<std::pair<std::string, nn::Parameter*>>& params = plans[0].params;
  ASSERT_GE(params.size(), 4u);
  params[1].second->requires_grad = false;  // frozen before the FlatParameter is built
  FlatParameter flat(params, /*num_shards=*/3, /*shard=*/0);
  ASSERT_GT(flat.padded_numel(), flat.numel()) << "no padding to check";
  // What new memory may hold.
  const tensor::Tensor grad = tensor::Tensor::Full({flat.padded_numel()}, std::nan(""));
  flat.ZeroUncoveredGrad(grad);
  flat.SetGradViews(grad, /*unwritten=*/true);
  EXPECT_FALSE(params[1].second->grad.defined());
  for (size_t i : {0, 2, 3}) EXPECT_TRUE(params[i].second->grad_unwritten) << params[i].first;
  // Parameter 0 written, 2 zeroed then added to, 3 untouched.
  nn::Parameter::GradSink sink = params[0].second->GradToWrite();
  EXPECT_FALSE(sink.accumulate);
  EXPECT_FALSE(params[0].second->grad_unwritten);
  tensor::Fill(sink.grad, 1.0);
  EXPECT_TRUE(params[0].second->GradToWrite().accumulate);  // written once: added to now
  tensor::AddInPlace(params[2].second->GradBuffer(), tensor::Tensor::Full(params[2].second->shape, 2.0));
  flat.ZeroUnwrittenGrads();
  for (size_t i : {0, 2, 3}) EXPECT_FALSE(params[i].second->grad_unwritten) << params[i].first;
  const float* g = grad.data<float>();
  for (const FlatParameter::Entry& e : flat.entries()) {
    const float want = e.param == params[0].second ? 1.0f : e.param == params[2].second ? 2.0f : 0.0f;
    for (int64_t i = e.offset; i < e.offset + e.numel; ++i) ASSERT_EQ(g[i], want) << e.name;
  }
  for (int64_t i = flat.numel(); i < flat.padded_numel(); ++i) ASSERT_EQ(g[i], 0.0f) << "pad " << i;
  flat.ClearGrads();
  EXPECT_FALSE(params[0].second->grad.defined());
}

// ZeroUncoveredGrad zeroes exactly the frozen parameters' elements (adjacent
// ones and the padding as one run) and the padding; the rest keeps what the
// memory held.
TEST(FlatParameterTest, ZeroUncoveredGradZeroesFrozenParametersAndThePaddingOnly) {
  mingpt::GPT gpt(Tiny());
  auto plans = PlanUnits(gpt, WrapPolicy::None());
  std::vector<std::pair<std::string, nn::Parameter*>>& params = plans[0].params;
  const size_t n = params.size();
  ASSERT_GE(n, 5u);
  for (size_t i : {size_t{1}, size_t{2}, n - 1}) params[i].second->requires_grad = false;
  FlatParameter flat(params, /*num_shards=*/3, /*shard=*/0);
  ASSERT_GT(flat.padded_numel(), flat.numel()) << "no padding to check";
  const tensor::Tensor grad = tensor::Tensor::Full({flat.padded_numel()}, std::nan(""));
  flat.ZeroUncoveredGrad(grad);
  const float* g = grad.data<float>();
  for (const FlatParameter::Entry& e : flat.entries()) {
    for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
      if (e.frozen) {
        ASSERT_EQ(g[i], 0.0f) << e.name;
      } else {
        ASSERT_TRUE(std::isnan(g[i])) << e.name;
      }
    }
  }
  for (int64_t i = flat.numel(); i < flat.padded_numel(); ++i) ASSERT_EQ(g[i], 0.0f) << "pad " << i;
  EXPECT_THROW(flat.ZeroUncoveredGrad(tensor::Tensor::Zeros({flat.padded_numel() + 1})),
               tensor::OpError);
}

}  // namespace
}  // namespace dist
