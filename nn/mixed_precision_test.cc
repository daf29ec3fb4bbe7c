// Mixed precision: bf16 compute copies, fp32 masters and gradients, BatchNorm kept fp32.
#include "nn/mixed_precision.h"

#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/fp32_modules.h"
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

// A module of a kept class keeps every module inside it fp32 too
// (nn::KeptFp32Parameters): Block's Linear keeps fp32 weights and computes in
// fp32 (Linear casts its input to its weight's dtype); the Linear after it is
// cast. Gradients land fp32 in both.
class Block : public Module {
 public:
  Block() : Module("Block") { lin = RegisterModule("lin", std::make_unique<Linear>(4, 3)); }
  Linear* lin;

 protected:
  Tensors Forward(const Tensors& in, Context& ctx) override { return lin->Run(in, ctx.Child(0)); }
  Tensors Backward(const Tensors& grad, Context& ctx) override {
    return lin->RunBackward(grad, ctx.Child(0));
  }
};

TEST(MixedPrecisionTest, AKeptClassKeepsTheModulesInsideIt) {
  Sequential net;
  auto* block = net.Append(std::make_unique<Block>());
  auto* after = net.Append(std::make_unique<Linear>(3, 2));
  net.Materialize(1);
  EXPECT_EQ(KeptFp32Parameters(net, {"Block"}).size(), 2u);  // lin's weight and bias
  EXPECT_TRUE(KeptFp32Parameters(net, {}).empty());
  precision::MixedPrecisionPolicy policy = precision::MixedPrecisionPolicy::Bf16();
  policy.fp32_module_classes = {"Block"};
  MixedPrecision mp(net, policy);
  EXPECT_EQ(mp.num_kept_fp32(), 2);
  EXPECT_EQ(mp.num_cast(), 2);
  mp.CastForCompute();
  EXPECT_EQ(block->lin->weight()->value.dtype(), Dtype::kF32);
  EXPECT_EQ(after->weight()->value.dtype(), Dtype::kBF16);
  Context ctx;
  Tensor y = net.Run(tensor::testing::RandomTensor({5, 4}, 2), ctx);
  EXPECT_EQ(y.dtype(), Dtype::kBF16);
  net.RunBackward(tensor::testing::RandomTensor({5, 2}, 3), ctx);
  EXPECT_EQ(block->lin->weight()->grad.dtype(), Dtype::kF32);
  EXPECT_EQ(after->weight()->grad.dtype(), Dtype::kF32);
  mp.RestoreMasters();
}

// The optimizer's way (RestoreMastersKeepingCopies, ComputeCopyToWrite): the
// kept copy is handed out once per master, and the next CastForCompute uses
// what was written into it rather than casting; a parameter whose copy was
// not handed out is cast again, and plain RestoreMasters keeps nothing.
TEST(MixedPrecisionTest, HandedOutCopiesAreTheNextComputeCopies) {
  Sequential net;
  auto* lin = net.Append(std::make_unique<Linear>(4, 3));
  auto* bn = net.Append(std::make_unique<BatchNorm1d>(3));
  net.Materialize(1);
  Tensor weight = lin->weight()->value, bias = lin->bias()->value;
  auto fill = [](Tensor& t, double value) { t.CopyFrom(Tensor::Full(t.shape(), value)); };
  MixedPrecision mp(net, precision::MixedPrecisionPolicy::Bf16());
  // Nothing kept before a step's copies exist.
  EXPECT_FALSE(mp.ComputeCopyToWrite(weight).defined());
  mp.CastForCompute();
  const Tensor weight_copy = lin->weight()->value;
  mp.RestoreMastersKeepingCopies();
  EXPECT_TRUE(lin->weight()->value.SharesStorageWith(weight));
  // BatchNorm's fp32 parameters and tensors that are no master have no copy.
  EXPECT_FALSE(mp.ComputeCopyToWrite(bn->NamedParameters()[0].second->value).defined());
  EXPECT_FALSE(mp.ComputeCopyToWrite(weight.Clone()).defined());
  Tensor handed = mp.ComputeCopyToWrite(weight);
  ASSERT_TRUE(handed.defined());
  EXPECT_TRUE(handed.SharesStorageWith(weight_copy));
  EXPECT_EQ(handed.dtype(), Dtype::kBF16);
  // What an optimizer would write: the updated master's cast.
  fill(weight, 0.5);
  fill(bias, 0.25);
  handed.CopyFrom(weight);
  mp.CastForCompute();
  EXPECT_TRUE(lin->weight()->value.SharesStorageWith(weight_copy));  // no cast
  EXPECT_EQ(lin->weight()->value.To(Dtype::kF32).data<float>()[0], 0.5f);
  // The bias's copy was not handed out: cast from its master.
  EXPECT_EQ(lin->bias()->value.dtype(), Dtype::kBF16);
  EXPECT_EQ(lin->bias()->value.To(Dtype::kF32).data<float>()[0], 0.25f);
  // A hand-out lasts one CastForCompute: the next one casts again.
  mp.RestoreMastersKeepingCopies();
  handed = mp.ComputeCopyToWrite(weight);
  mp.CastForCompute();
  mp.RestoreMasters();
  EXPECT_FALSE(mp.ComputeCopyToWrite(weight).defined());  // nothing kept
  fill(weight, -1.0);
  mp.CastForCompute();
  EXPECT_FALSE(lin->weight()->value.SharesStorageWith(weight_copy));
  EXPECT_EQ(lin->weight()->value.To(Dtype::kF32).data<float>()[0], -1.0f);
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
