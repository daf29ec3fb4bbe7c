// State dicts: round trip through safetensors, fp32 output from bf16 values,
// and errors for missing, unknown and misshapen entries that change nothing.
#include "nn/state_dict.h"

#include "gtest/gtest.h"
#include "nn/linear.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;

TEST(StateDictTest, RoundTripThroughSafetensors) {
  Linear a(4, 3), b(4, 3);
  a.Materialize(1);
  b.Materialize(2);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/linear.safetensors";
  ASSERT_TRUE(tensor::WriteSafetensors(path, StateDict(a, "layer.")).ok());
  auto file = tensor::ReadSafetensors(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->tensors[0].first, "layer.weight");
  ASSERT_TRUE(LoadStateDict(b, file->tensors, "layer.").ok());
  EXPECT_TRUE(AllClose(b.weight()->value, a.weight()->value, 0, 0));
  EXPECT_TRUE(AllClose(b.bias()->value, a.bias()->value, 0, 0));
}

TEST(StateDictTest, SavesFp32FromLowPrecisionValues) {
  Linear a(2, 2);
  a.Materialize(1);
  a.weight()->value = a.weight()->value.To(Dtype::kBF16);
  tensor::NamedTensors sd = StateDict(a);
  EXPECT_EQ(sd[0].second.dtype(), Dtype::kF32);
}

TEST(StateDictTest, ErrorsNameTheProblemAndChangeNothing) {
  Linear a(4, 3);
  a.Materialize(1);
  const std::vector<float> before = a.weight()->value.ToVector<float>();
  tensor::NamedTensors sd = StateDict(a);
  tensor::NamedTensors wrong_shape = sd;
  wrong_shape[1].second = Tensor::Zeros({4});
  absl::Status s = LoadStateDict(a, wrong_shape);
  EXPECT_EQ(s.message(), "state dict entry 'bias' has shape (4), the model expects (3)");
  tensor::NamedTensors missing = {sd[1]};
  missing[0].second = Tensor::Zeros({3});
  s = LoadStateDict(a, missing);
  EXPECT_EQ(s.message(), "state dict lacks 1 entries: weight");
  tensor::NamedTensors extra = sd;
  extra.emplace_back("lm_head.weight", Tensor::Zeros({1}));
  s = LoadStateDict(a, extra);
  EXPECT_EQ(s.message(), "state dict has entries the model lacks: lm_head.weight");
  EXPECT_EQ(a.weight()->value.ToVector<float>(), before);
}

}  // namespace
}  // namespace nn
