// AdamW, SGD (momentum, nesterov) and global-norm clipping with parameters on
// a CUDA device against the same steps on the CPU, over weight-decay ranges
// that split a tensor. Tagged gpu; skips where no device is visible.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/ops/embedding.h"
#include "tensor/testing.h"

namespace optim {
namespace {

using tensor::Tensor;
using tensor::cuda::testing::MatchesCpu;
using tensor::cuda::testing::ToCpu;
using tensor::cuda::testing::ToGpu;

// Three steps of `opt_cpu` and `opt_gpu` on the same parameter (10007
// elements, decay on [100, 5000) and [9000, 10007)) with changing gradients,
// and of a second pair on a parameter with frozen ranges across those (an
// FSDP shard holding frozen parameters), which both leave as they were.
void ExpectSameSteps(const std::function<std::unique_ptr<Optimizer>()>& make) {
  const ElementRanges decay = {{100, 5000}, {9000, 10007}};
  for (const ElementRanges& frozen : {ElementRanges{}, ElementRanges{{0, 7}, {4000, 9500}}}) {
    SCOPED_TRACE(frozen.empty() ? "nothing frozen" : "frozen ranges");
    std::unique_ptr<Optimizer> opt_cpu = make(), opt_gpu = make();
    const Tensor start = tensor::testing::RandomTensor({10007}, 1);
    Tensor p_cpu = start.Clone();
    Tensor p_gpu = ToGpu(start);
    for (int step = 0; step < 3; ++step) {
      const Tensor g = tensor::testing::RandomTensor({10007}, 10 + step);
      ParamRef cpu{"w", p_cpu, g, decay, frozen};
      ParamRef gpu{"w", p_gpu, ToGpu(g), decay, frozen};
      opt_cpu->Step({cpu});
      opt_gpu->Step({gpu});
      EXPECT_TRUE(MatchesCpu(p_gpu, p_cpu, {1e-6, 1e-7})) << "step " << step;
    }
    for (const auto& [b, e] : frozen) {
      EXPECT_TRUE(MatchesCpu(p_gpu.Narrow(0, b, e - b), start.Narrow(0, b, e - b), {0, 0}));
    }
  }
}

// The AdamW the tests compare: a large step, decay on.
std::unique_ptr<Optimizer> DecayingAdamW() {
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return AdamW::Create(o).value();
}

TEST(CudaOptimizerTest, AdamWMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  ExpectSameSteps(DecayingAdamW);
}

TEST(CudaOptimizerTest, SgdVariantsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool nesterov : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      if (nesterov && momentum == 0.0) continue;
      SgdOptions o;
      o.lr = 0.1;
      o.momentum = momentum;
      o.nesterov = nesterov;
      o.weight_decay = 0.05;
      SCOPED_TRACE(testing::Message() << "momentum " << momentum << " nesterov " << nesterov);
      ExpectSameSteps([&] { return SGD::Create(o).value(); });
    }
  }
}

TEST(CudaOptimizerTest, ClipGradNormMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor p = tensor::testing::RandomTensor({3, 70001}, 5);
  const Tensor g = tensor::testing::RandomTensor({3, 70001}, 6);
  std::vector<ParamRef> cpu = {MakeParamRef("w", p.Clone(), g.Clone(), true)};
  std::vector<ParamRef> gpu = {MakeParamRef("w", ToGpu(p), ToGpu(g), true)};
  const double n_cpu = ClipGradNorm(cpu, 0.5);
  const double n_gpu = ClipGradNorm(gpu, 0.5);
  EXPECT_NEAR(n_gpu, n_cpu, 1e-5 * n_cpu);
  EXPECT_TRUE(MatchesCpu(gpu[0].grad, cpu[0].grad, {1e-5, 1e-7}));
}

// SGD with momentum and decay, compared as the AdamW above.
std::unique_ptr<Optimizer> DecayingSgd() {
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  return SGD::Create(o).value();
}

// Many parameters of many sizes, some decayed in parts (more segments than
// one launch of the batched kernels takes): every one as on the CPU, with
// AdamW and with SGD; and clipping, whose norm is one read back of all
// gradients' block sums.
TEST(CudaOptimizerTest, AdamWSgdAndClippingOfManyParametersMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto make : {DecayingAdamW, DecayingSgd}) {
    auto opt_cpu = make();
    auto opt_gpu = make();
    SCOPED_TRACE(opt_cpu->name());
    std::vector<Tensor> p_cpu, p_gpu;
    for (int i = 0; i < 70; ++i) {  // more than one launch takes (32 AdamW segments, 64 tensors)
      const int64_t n = 1 + (i * 977) % 20011;
      p_cpu.push_back(tensor::testing::RandomTensor({n}, 100 + i));
      p_gpu.push_back(ToGpu(p_cpu.back()));
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<ParamRef> cpu, gpu;
      for (size_t i = 0; i < p_cpu.size(); ++i) {
        const int64_t n = p_cpu[i].numel();
        const Tensor g = tensor::testing::RandomTensor({n}, 1000 * step + i);
        ParamRef c{"p" + std::to_string(i), p_cpu[i], g.Clone(), {}};
        if (i % 3 == 1) c.decay_ranges = {{0, n}};
        if (i % 3 == 2 && n > 4) c.decay_ranges = {{n / 4, n / 2}, {3 * n / 4, n}};
        ParamRef d{c.name, p_gpu[i], ToGpu(g), c.decay_ranges};
        cpu.push_back(c);
        gpu.push_back(d);
      }
      const double n_cpu = ClipGradNorm(cpu, 1.0);
      const double n_gpu = ClipGradNorm(gpu, 1.0);
      EXPECT_NEAR(n_gpu, n_cpu, 1e-5 * n_cpu) << "step " << step;
      opt_cpu->Step(cpu);
      opt_gpu->Step(gpu);
      for (size_t i = 0; i < p_cpu.size(); ++i) {
        EXPECT_TRUE(MatchesCpu(p_gpu[i], p_cpu[i], {1e-6, 1e-7})) << "step " << step << " p" << i;
      }
    }
  }
}

// The GPU step takes 4 elements at a time where the parameter, its gradient
// and its state are 16-byte aligned alike; a gradient one element off (a
// view into a larger buffer) takes the element loop, with the same values.
TEST(CudaOptimizerTest, AdamWWithTheGradientAtAnotherAlignment) {
  SKIP_WITHOUT_GPU();
  auto opt_cpu = DecayingAdamW();
  auto opt_gpu = DecayingAdamW();
  const int64_t n = 1001;
  Tensor p_cpu = tensor::testing::RandomTensor({n}, 5);
  Tensor p_gpu = ToGpu(p_cpu);
  for (int step = 0; step < 3; ++step) {
    const Tensor g = tensor::testing::RandomTensor({n + 1}, 50 + step);
    ParamRef cpu{"w", p_cpu, g.Narrow(0, 1, n).Clone(), {{3, 700}}};
    ParamRef gpu{"w", p_gpu, ToGpu(g).Narrow(0, 1, n), {{3, 700}}};
    opt_cpu->Step({cpu});
    opt_gpu->Step({gpu});
    EXPECT_TRUE(MatchesCpu(p_gpu, p_cpu, {1e-6, 1e-7})) << "step " << step;
  }
}

// The optimizers write a bf16 / f16 copy of each updated parameter
// (ParamRef::low_precision_copy, mixed precision's next compute copy): after
// every step it is the parameter cast, bit for bit, and the parameter is what
// a step without a copy gives. AdamW writes it in its update's pass (the
// copy's elements in frozen ranges left as they were), SGD casts after its
// update. The parameter and its copy also sit one element into their
// buffers (the update's scalar head), the copy at another alignment than
// the parameter (the element loop throughout).
TEST(CudaOptimizerTest, TheStepWritesTheLowPrecisionCopy) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 10007;
  const ElementRanges decay = {{100, 5000}, {9000, 10007}};
  const ElementRanges frozen = {{0, 7}, {4000, 4500}};
  struct Layout {
    int64_t p_offset, copy_offset;
  };
  SgdOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>()>>> makes = {
      {"adamw", DecayingAdamW}, {"sgd", [&] { return SGD::Create(sgd).value(); }}};
  for (const auto& [name, make] : makes) {
    for (tensor::Dtype dtype : {tensor::Dtype::kBF16, tensor::Dtype::kF16}) {
      for (Layout at : {Layout{0, 0}, Layout{1, 1}, Layout{1, 0}}) {
        SCOPED_TRACE(testing::Message() << name << " " << tensor::DtypeName(dtype) << " param at "
                                        << at.p_offset << ", copy at " << at.copy_offset);
        std::unique_ptr<Optimizer> plain = make(), with_copy = make();
        const Tensor start = tensor::testing::RandomTensor({n}, 1);
        Tensor p_plain = ToGpu(start);
        Tensor p_buffer = Tensor::Zeros({n + 1}, tensor::Dtype::kF32, p_plain.device());
        Tensor p = p_buffer.Narrow(0, at.p_offset, n);
        p.CopyFrom(p_plain);
        Tensor copy_buffer = Tensor::Zeros({n + 1}, dtype, p_plain.device());
        Tensor copy = copy_buffer.Narrow(0, at.copy_offset, n);
        copy.CopyFrom(p);  // the cast before the first step (as the frozen elements keep)
        for (int step = 0; step < 3; ++step) {
          const Tensor g = ToGpu(tensor::testing::RandomTensor({n}, 10 + step));
          ParamRef ref{"w", p, g, decay, frozen};
          ref.low_precision_copy = copy;
          plain->Step({ParamRef{"w", p_plain, g, decay, frozen}});
          with_copy->Step({ref});
          EXPECT_TRUE(MatchesCpu(p, ToCpu(p_plain), {0, 0})) << "step " << step;
          EXPECT_TRUE(MatchesCpu(copy, ToCpu(p).To(dtype), {0, 0})) << "step " << step;
        }
      }
    }
  }
}

// A copy that is f32, of another shape or on another device is refused
// before anything changes, the message naming the parameter.
TEST(CudaOptimizerTest, ABadLowPrecisionCopyIsRefused) {
  SKIP_WITHOUT_GPU();
  auto opt = DecayingAdamW();
  const Tensor start = tensor::testing::RandomTensor({64}, 1);
  Tensor p = ToGpu(start);
  const Tensor g = ToGpu(tensor::testing::RandomTensor({64}, 2));
  for (const Tensor& bad : {Tensor::Zeros({64}, tensor::Dtype::kF32, p.device()),
                            Tensor::Zeros({63}, tensor::Dtype::kBF16, p.device()),
                            Tensor::Zeros({64}, tensor::Dtype::kBF16)}) {
    ParamRef ref = MakeParamRef("h.0.w", p, g, true);
    ref.low_precision_copy = bad;
    try {
      opt->Step({ref});
      ADD_FAILURE() << "accepted " << bad.shape().ToString() << " "
                    << tensor::DtypeName(bad.dtype());
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find("'h.0.w'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("low-precision copy"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(MatchesCpu(p, start, {0, 0}));
  EXPECT_FALSE(opt->HasState("h.0.w"));
}

// State loaded from a checkpoint (host tensors) for a GPU parameter moves to
// the GPU at the next step and continues like the CPU optimizer it came from.
TEST(CudaOptimizerTest, StateLoadedOnTheHostFollowsAGpuParameter) {
  SKIP_WITHOUT_GPU();
  AdamWOptions o;
  o.lr = 1e-2;
  auto cpu = AdamW::Create(o).value();
  Tensor p_cpu = tensor::testing::RandomTensor({513}, 1);
  Tensor p_gpu = ToGpu(p_cpu);
  const Tensor g0 = tensor::testing::RandomTensor({513}, 2);
  cpu->Step({MakeParamRef("w", p_cpu, g0, true)});
  p_gpu.CopyFrom(p_cpu);
  auto gpu = AdamW::Create(o).value();
  ASSERT_TRUE(gpu->LoadStateTensors(cpu->StateTensors()).ok());  // host buffers
  const Tensor g1 = tensor::testing::RandomTensor({513}, 3);
  cpu->Step({MakeParamRef("w", p_cpu, g1, true)});
  gpu->Step({MakeParamRef("w", p_gpu, ToGpu(g1), true)});
  EXPECT_TRUE(MatchesCpu(p_gpu, p_cpu, {1e-6, 1e-7}));
  for (auto& [name, t] : gpu->StateTensors()) {
    if (t.numel() > 1) {
      EXPECT_TRUE(t.device().is_cuda()) << name;
    }
  }
}

// A first step that runs out of device memory making the second parameter's
// state (its 2 x 16 MiB of AdamW moments past a limit 8 MiB above what the
// process holds) changes nothing: no parameter, no step count (the first's
// used to count a step it never took, and its retried step then used the
// second step's bias correction). The step then runs without the limit as a
// first step, as on the CPU.
TEST(CudaOptimizerTest, AStepOutOfMemoryMakingStateChangesNothing) {
  SKIP_WITHOUT_GPU();
  struct Lift {
    ~Lift() { tensor::cuda::SetDeviceMemoryLimit(0, -1); }
  } lift;
  const Tensor a = tensor::testing::RandomTensor({1024}, 1);
  const Tensor b = tensor::testing::RandomTensor({int64_t{4} << 20}, 2);
  const Tensor ga = tensor::testing::RandomTensor({1024}, 3);
  const Tensor gb = tensor::testing::RandomTensor({int64_t{4} << 20}, 4);
  Tensor a_gpu = ToGpu(a), b_gpu = ToGpu(b);
  const Tensor ga_gpu = ToGpu(ga), gb_gpu = ToGpu(gb);
  std::unique_ptr<Optimizer> gpu = DecayingAdamW(), cpu = DecayingAdamW();
  tensor::cuda::ReleaseCachedDeviceMemory(0);
  tensor::cuda::SetDeviceMemoryLimit(0, tensor::cuda::DeviceReservedBytes(0) + (8 << 20));
  EXPECT_THROW(gpu->Step({MakeParamRef("a", a_gpu, ga_gpu, true),
                          MakeParamRef("b", b_gpu, gb_gpu, true)}),
               tensor::OutOfMemoryError);
  tensor::cuda::SetDeviceMemoryLimit(0, -1);
  EXPECT_EQ(gpu->StepCount("a"), 0);
  EXPECT_TRUE(MatchesCpu(a_gpu, a, {0, 0}));
  EXPECT_TRUE(MatchesCpu(b_gpu, b, {0, 0}));
  Tensor a_cpu = a.Clone(), b_cpu = b.Clone();
  cpu->Step({MakeParamRef("a", a_cpu, ga, true), MakeParamRef("b", b_cpu, gb, true)});
  gpu->Step({MakeParamRef("a", a_gpu, ga_gpu, true), MakeParamRef("b", b_gpu, gb_gpu, true)});
  EXPECT_EQ(gpu->StepCount("a"), 1);
  EXPECT_TRUE(MatchesCpu(a_gpu, a_cpu, {1e-6, 1e-7}));
  EXPECT_TRUE(MatchesCpu(b_gpu, b_cpu, {1e-6, 1e-7}));
}

// A GPU check still unread when the step starts (an embedding's ids, checked
// without a host wait) is waited for, and its failure stops the step before
// anything changes: the parameter, and the optimizer's state and step count
// (the next step is a first step, as on the CPU).
TEST(CudaOptimizerTest, AFailedDeferredCheckStopsTheStepBeforeAnythingChanges) {
  SKIP_WITHOUT_GPU();
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "adamw" : "sgd");
    auto make = [adamw]() -> std::unique_ptr<Optimizer> {
      SgdOptions sgd;
      sgd.lr = 0.1;
      sgd.momentum = 0.9;
      if (adamw) return DecayingAdamW();
      return SGD::Create(sgd).value();
    };
    auto cpu = make(), gpu = make();
    const Tensor start = tensor::testing::RandomTensor({513}, 1);
    Tensor p_cpu = start.Clone();
    Tensor p_gpu = ToGpu(start);
    const Tensor g = tensor::testing::RandomTensor({513}, 2);
    const Tensor g_gpu = ToGpu(g);  // before the check: this copy waits for the GPU
    const Tensor ids = ToGpu(Tensor::FromData<int64_t>({0, 3}, {2}));  // 3: out of range for 3
    tensor::Embedding(ToGpu(Tensor::Full({3, 4}, 1.0)), ids);  // queued, no wait
    try {
      gpu->Step({MakeParamRef("w", p_gpu, g_gpu, true)});
      FAIL() << "expected OpError";
    } catch (const tensor::OpError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("[embedding] id 3 at position [1] of ids (2)"), std::string::npos) << msg;
    }
    EXPECT_TRUE(MatchesCpu(p_gpu, start, {0, 0}));
    EXPECT_TRUE(gpu->StateTensors().empty());
    cpu->Step({MakeParamRef("w", p_cpu, g, true)});
    gpu->Step({MakeParamRef("w", p_gpu, ToGpu(g), true)});
    EXPECT_TRUE(MatchesCpu(p_gpu, p_cpu, {1e-6, 1e-7}));
  }
}

}  // namespace
}  // namespace optim
