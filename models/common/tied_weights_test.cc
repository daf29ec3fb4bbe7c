// Tied weights must stay in the root FSDP unit: a policy that moves one is
// refused naming the unit, and under size:N the refusal says which N keeps
// it in the root when its unit holds the tied weights alone.
#include "models/common/tied_weights.h"

#include <memory>

#include "dist/wrap_policy.h"
#include "gtest/gtest.h"
#include "nn/containers.h"
#include "nn/linear.h"

namespace train {
namespace {

// "0": Linear(100, 10), 1010 parameters (its weight read elsewhere: tied);
// "1": two Linear(10, 10), 110 parameters each.
std::unique_ptr<nn::Sequential> Net() {
  auto net = std::make_unique<nn::Sequential>();
  net->Append(std::make_unique<nn::Linear>(100, 10));
  auto inner = std::make_unique<nn::Sequential>();
  inner->Append(std::make_unique<nn::Linear>(10, 10));
  inner->Append(std::make_unique<nn::Linear>(10, 10));
  net->Append(std::move(inner));
  return net;
}

TEST(CheckTiedWeightsInRootTest, AMovedTiedWeightIsRefusedNamingItsUnit) {
  auto net = Net();
  const std::string prefix =
      "--auto_wrap=size:500 puts '0.weight' into the FSDP unit '0', but it must stay in the root "
      "unit (the model reads it outside 0's forward: a tied weight); use "
      "--auto_wrap=transformer";
  // The unit holds the tied weights alone: above its parameters, size:N keeps them in the root.
  absl::Status s = CheckTiedWeightsInRoot(*net, dist::WrapPolicy::SizeBased(500), "size:500",
                                          {"0.weight", "0.bias"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), prefix + " (a size:N keeps it in the root only for N above 1010, the "
                                  "parameters of '0', and then wraps only modules larger than "
                                  "that)");
  EXPECT_TRUE(CheckTiedWeightsInRoot(*net, dist::WrapPolicy::SizeBased(1011), "size:1011",
                                     {"0.weight", "0.bias"})
                  .ok());
  // It holds more (the bias is not tied): no threshold is promised.
  s = CheckTiedWeightsInRoot(*net, dist::WrapPolicy::SizeBased(500), "size:500", {"0.weight"});
  EXPECT_EQ(s.message(), prefix + " or another size:N");
  // Policies that leave it in the root, and names the model lacks.
  EXPECT_TRUE(CheckTiedWeightsInRoot(*net, dist::WrapPolicy::None(), "none", {"0.weight"}).ok());
  EXPECT_TRUE(CheckTiedWeightsInRoot(*net, dist::WrapPolicy::SizeBased(500), "size:500",
                                     {"shared.weight"}, /*must_exist=*/false)
                  .ok());
  EXPECT_EQ(CheckTiedWeightsInRoot(*net, dist::WrapPolicy::None(), "none", {"shared.weight"})
                .code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace train
