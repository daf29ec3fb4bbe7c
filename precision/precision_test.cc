// Policy presets and validation, dtype support errors, the loss scaler schedule.
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "precision/dtype_support.h"
#include "precision/loss_scaler.h"
#include "precision/policy.h"

namespace precision {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;

TEST(PolicyTest, PresetsAndNames) {
  auto bf16 = MixedPrecisionPolicy::FromName("bf16");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->param_dtype, Dtype::kBF16);
  EXPECT_EQ(bf16->reduce_dtype, Dtype::kBF16);
  EXPECT_TRUE(bf16->KeepsFp32("BatchNorm1d"));
  EXPECT_EQ(bf16->ComputeDtype("BatchNorm1d"), Dtype::kF32);
  EXPECT_EQ(bf16->ComputeDtype("Linear"), Dtype::kBF16);
  EXPECT_FALSE(bf16->NeedsLossScaling());
  EXPECT_TRUE(MixedPrecisionPolicy::Fp16().NeedsLossScaling());
  EXPECT_FALSE(MixedPrecisionPolicy::Fp32().IsMixed());
  // Buffers are not cast (BatchNorm's stay f32): the policy says so, and
  // refuses to promise another buffer dtype.
  EXPECT_EQ(bf16->ToString(), "param=bf16 reduce=bf16 buffer=f32 fp32_modules=[BatchNorm1d]");
  MixedPrecisionPolicy cast_buffers = *bf16;
  cast_buffers.buffer_dtype = Dtype::kBF16;
  EXPECT_EQ(cast_buffers.Validate(Device::Cpu()).code(), absl::StatusCode::kUnimplemented);
  auto bad = MixedPrecisionPolicy::FromName("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown precision 'fp8'; expected fp32, bf16 or fp16");
}

TEST(DtypeSupportTest, Fp32AlwaysAndClearErrorsOtherwise) {
  EXPECT_TRUE(CheckComputeDtype(Dtype::kF32, Device::Cpu()).ok());
  EXPECT_FALSE(CheckComputeDtype(Dtype::kI32, Device::Cpu()).ok());
  // No CPU f16 GEMM: a clear error naming the device.
  absl::Status f16 = CheckComputeDtype(Dtype::kF16, Device::Cpu());
  ASSERT_FALSE(f16.ok());
  EXPECT_NE(f16.message().find("f16 is not supported on cpu"), std::string::npos);
  // What to use instead: bf16 where this CPU runs it, else fp32.
  EXPECT_NE(f16.message().find(Bf16Supported(Device::Cpu()) ? "; use bf16" : "; use fp32"),
            std::string::npos)
      << f16.message();
  // A CUDA device that is not there.
  absl::Status gpu = CheckComputeDtype(Dtype::kBF16, Device::Cuda(99));
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.message().find("cuda:99"), std::string::npos);
  absl::Status policy = MixedPrecisionPolicy::Fp16().Validate(Device::Cpu());
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.message().find("param_dtype=f16"), std::string::npos);
  // bf16 on the CPU follows the CPU's units.
  const bool units = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  if (units) {
    EXPECT_TRUE(Bf16Supported(Device::Cpu()));
  }
}

TEST(LossScalerTest, BacksOffSkipsAndGrows) {
  LossScalerOptions o;
  o.growth_interval = 3;
  auto s = DynamicLossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->scale(), 65536.0);
  EXPECT_FALSE(s->Update(true));  // inf: skip and halve
  EXPECT_EQ(s->scale(), 32768.0);
  EXPECT_EQ(s->skipped_steps(), 1);
  EXPECT_TRUE(s->Update(false));
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), 32768.0);
  EXPECT_TRUE(s->Update(false));  // third good step in a row: grow
  EXPECT_EQ(s->scale(), 65536.0);
  EXPECT_EQ(s->good_steps(), 0);
  // A bad step resets the run of good steps.
  EXPECT_TRUE(s->Update(false));
  EXPECT_FALSE(s->Update(true));
  EXPECT_EQ(s->good_steps(), 0);
  DynamicLossScaler::State st = s->GetState();
  auto restored = DynamicLossScaler::Create(o);
  ASSERT_TRUE(restored->SetState(st).ok());
  EXPECT_EQ(restored->scale(), s->scale());
  EXPECT_EQ(restored->skipped_steps(), 2);
}

TEST(LossScalerTest, DefaultsMatchTheSpecAndBadOptionsAreErrors) {
  auto s = DynamicLossScaler::Create();
  for (int i = 0; i < 1999; ++i) s->Update(false);
  EXPECT_EQ(s->scale(), 65536.0);
  s->Update(false);
  EXPECT_EQ(s->scale(), 131072.0);
  LossScalerOptions bad;
  bad.backoff_factor = 1.5;
  EXPECT_FALSE(DynamicLossScaler::Create(bad).ok());
  // An infinite scale would skip every step (inf * 0.5 is inf).
  bad = LossScalerOptions();
  bad.init_scale = HUGE_VAL;
  EXPECT_FALSE(DynamicLossScaler::Create(bad).ok());
  bad = LossScalerOptions();
  bad.growth_factor = HUGE_VAL;
  EXPECT_FALSE(DynamicLossScaler::Create(bad).ok());
}

// The scale multiplies the loss in fp32: it grows up to fp32's largest
// power of two (2^127), not to 2^128 (inf there), as PyTorch's fp32 scale.
TEST(LossScalerTest, GrowthStopsAtFp32sLargest) {
  LossScalerOptions o;
  o.init_scale = std::ldexp(1.0, 126);
  o.growth_interval = 1;
  auto s = DynamicLossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), std::ldexp(1.0, 127));
  EXPECT_TRUE(s->Update(false));
  EXPECT_EQ(s->scale(), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isfinite(static_cast<float>(s->scale())));
}

TEST(LossScalerTest, ABadStateIsRefusedAndChangesNothing) {
  auto s = DynamicLossScaler::Create();
  ASSERT_TRUE(s.ok());
  for (const DynamicLossScaler::State& bad :
       {DynamicLossScaler::State{-1.0, 0, 0}, DynamicLossScaler::State{std::nan(""), 0, 0},
        DynamicLossScaler::State{HUGE_VAL, 0, 0}, DynamicLossScaler::State{0.0, 0, 0},
        DynamicLossScaler::State{8.0, -1, 0}, DynamicLossScaler::State{8.0, 0, -3}}) {
    const absl::Status st = s->SetState(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad.scale;
    EXPECT_EQ(s->scale(), 65536.0);
    EXPECT_EQ(s->good_steps(), 0);
  }
}

TEST(NonFiniteTest, FindsInfAndNanInEveryFloatDtype) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    Tensor t = Tensor::Full({100000}, 1.0, d);
    EXPECT_FALSE(HasNonFinite(t));
    Tensor bad = Tensor::FromVector({1, 2, std::numeric_limits<float>::infinity()}, {3}, d);
    EXPECT_TRUE(HasNonFinite(bad));
    Tensor nan = Tensor::FromVector({std::nanf(""), 0}, {2}, d);
    EXPECT_TRUE(HasNonFinite(nan));
  }
  Tensor g = Tensor::FromVector({2, 4, 8}, {3});
  EXPECT_FALSE(ScaleAndCheckNonFinite(g, 0.5f));
  EXPECT_EQ(g.ToVector<float>(), (std::vector<float>{1, 2, 4}));
  Tensor h = Tensor::FromVector({3e38f}, {1});
  EXPECT_TRUE(ScaleAndCheckNonFinite(h, 10.0f));  // overflow to inf
  // Finite as a float, inf once stored in 16 bits (f16's largest is 65504).
  Tensor f16 = Tensor::FromVector({40000.0f, 1.0f}, {2}).To(tensor::Dtype::kF16);
  EXPECT_TRUE(ScaleAndCheckNonFinite(f16, 2.0f));
  EXPECT_TRUE(std::isinf(f16.To(tensor::Dtype::kF32).ToVector<float>()[0]));
  Tensor bf16 = Tensor::FromVector({3e38f}, {1}).To(tensor::Dtype::kBF16);
  EXPECT_TRUE(ScaleAndCheckNonFinite(bf16, 1.2f));
  Tensor fine = Tensor::FromVector({40000.0f}, {1}).To(tensor::Dtype::kF16);
  EXPECT_FALSE(ScaleAndCheckNonFinite(fine, 0.5f));
}

}  // namespace
}  // namespace precision
