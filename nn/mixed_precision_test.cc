// Mixed precision: bf16 compute copies, fp32 masters and gradients, BatchNorm kept fp32.
#include "nn/mixed_precision.h"

#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/linear.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;

TEST(MixedPrecisionTest, CastsLinearKeepsBatchNormAndRestores) {
  Sequential net;
  auto* lin = net.Append(std::make_unique<Linear>(4, 3));
  auto* bn = net.Append(std::make_unique<BatchNorm1d>(3));
  net.Materialize(1);
  const Tensor master = lin->weight()->value;
  MixedPrecision mp(net, precision::MixedPrecisionPolicy::Bf16());
  EXPECT_EQ(mp.num_cast(), 2);        // linear weight and bias
  EXPECT_EQ(mp.num_kept_fp32(), 2);   // batch norm weight and bias
  mp.CastForCompute();
  EXPECT_EQ(lin->weight()->value.dtype(), Dtype::kBF16);
  EXPECT_EQ(bn->NamedParameters()[0].second->value.dtype(), Dtype::kF32);
  Context ctx;
  Tensor y = net.Run(tensor::testing::RandomTensor({5, 4}, 2), ctx);
  EXPECT_EQ(y.dtype(), Dtype::kF32);  // BatchNorm computes and returns fp32
  net.RunBackward(tensor::testing::RandomTensor({5, 3}, 3), ctx);
  EXPECT_EQ(lin->weight()->grad.dtype(), Dtype::kF32);
  mp.RestoreMasters();
  EXPECT_TRUE(lin->weight()->value.SharesStorageWith(master));
}

TEST(MixedPrecisionTest, Fp32PolicyManagesNothing) {
  Linear lin(2, 2);
  lin.Materialize(1);
  MixedPrecision mp(lin, precision::MixedPrecisionPolicy::Fp32());
  EXPECT_EQ(mp.num_cast(), 0);
}

TEST(MixedPrecisionTest, UnmaterializedParametersAreAnError) {
  Linear lin(2, 2);
  EXPECT_THROW(MixedPrecision(lin, precision::MixedPrecisionPolicy::Bf16()), tensor::OpError);
}

}  // namespace
}  // namespace nn
