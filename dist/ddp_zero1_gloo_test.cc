// DDP and ZeRO-1 across real processes over gloo, for what threads cannot
// show: a rank that runs out of memory making a bucket's bf16 reduction copy
// at the root's PostBackward (its backward throws after writing every
// gradient) gives the bucket back, so the FinishBackward or Step that follows
// issues it and pairs with the other rank's collective; both ranks hold the
// averaged gradient and train on in step. (Out of memory before the root's
// backward ended leaves partial gradients, which no rank steps on:
// ddp_zero1_test's ABackwardStoppedPartwayOnOneRankStopsEveryRank.)
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/ddp.h"
#include "dist/gloo_group.h"
#include "dist/process_testing.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Tensor;
using testing::ExpectAllOk;
using testing::LiftAddressSpaceLimit;
using testing::LimitAddressSpace;
using testing::Outcome;
using testing::RunProcesses;
using testing::TmpDir;

constexpr int64_t kIn = 4096, kOut = 8192;  // a 128 MiB weight: a 64 MiB bf16 copy

// A Linear whose backward, when `limit` is set, caps the address space at
// 32 MiB more than it maps once its gradients are written: the reduction
// copies made at the root's PostBackward (the first synced backward issues
// every bucket there) do not fit, the bias's (16 KiB) does.
class LimitedAfterBackward : public nn::Module {
 public:
  LimitedAfterBackward() : nn::Module("LimitedAfterBackward") {
    inner_ = RegisterModule("inner", std::make_unique<nn::Linear>(kIn, kOut));
  }
  bool limit = false;
  bool limited = false;  // the cap was set
  nn::Linear& inner() { return *inner_; }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    return inner_->Run(in, ctx.Child(0));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    nn::Tensors g = inner_->RunBackward(grad, ctx.Child(0));
    if (limit) limited = LimitAddressSpace(int64_t{32} << 20);
    return g;
  }

 private:
  nn::Linear* inner_;
};

// x (1, kIn) filled with rank + 1, dy = 1: the weight's local gradient is
// rank + 1 everywhere, the bias's 1; the averages over 2 ranks 1.5 and 1.
void Backward(LimitedAfterBackward& m, int rank) {
  nn::Context ctx;
  m.Run(Tensor::Full({1, kIn}, rank + 1.0), ctx);
  m.RunBackward(Tensor::Full({1, kOut}, 1.0), ctx);
}

// "" when every element of `t` is `want`, else what differs.
std::string AllEqual(const Tensor& t, float want, const std::string& what) {
  const std::vector<float> v = t.ToVector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != want) return absl::StrCat(what, "[", i, "] = ", v[i], ", want ", want);
  }
  return "";
}

// Runs one rank: 3 steps, the first with rank 1 out of memory at its
// reduction copies; "" on success.
std::string RunRank(bool zero1, int rank, int size, const std::string& dir) {
  GlooGroupOptions options;
  options.store = dir;
  options.timeout = absl::Seconds(20);  // a bucket never issued: a timeout, not a hang
  auto pg = CreateGlooProcessGroup(rank, size, options);
  if (!pg.ok()) return pg.status().ToString();
  LimitedAfterBackward m;
  m.Materialize(7);
  precision::MixedPrecisionPolicy mp = precision::MixedPrecisionPolicy::Fp32();
  mp.reduce_dtype = tensor::Dtype::kBF16;  // 1.5 and 1 are exact in bf16
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<Zero1> zero;
  if (zero1) {
    Zero1Options o;
    o.mixed_precision = mp;
    optim::SgdOptions sgd;
    sgd.lr = 0;  // every step's gradients alike
    zero = std::make_unique<Zero1>(m, **pg, optim::SGD::Create(sgd).value(), o);
    if (zero->num_buckets() != 2) return "not one bucket per parameter";
  } else {
    DdpOptions o;
    o.mixed_precision = mp;
    ddp = std::make_unique<DistributedDataParallel>(m, **pg, o);
    if (ddp->num_buckets() != 2) return "not one bucket per parameter";
  }
  for (int step = 0; step < 3; ++step) {
    m.limit = step == 0 && rank == 1;
    try {
      Backward(m, rank);
      EXPECT_OR_MSG(!m.limit, "the backward under the cap did not throw");
    } catch (const std::bad_alloc& e) {
      EXPECT_OR_MSG(m.limit && m.limited, absl::StrCat("out of memory uncapped: ", e.what()));
      EXPECT_OR_MSG(LiftAddressSpaceLimit(), "could not lift the cap");
    }
    if (m.limit && !m.limited) return "setrlimit failed";
    if (zero1) {
      RETURN_IF_ERROR_MSG(zero->FinishBackward());
      // Bucket 0 holds the bias, bucket 1 the weight; 2 divides both evenly.
      for (const std::string& wrong : {AllEqual(zero->grad_shard(0), 1.0f, "bias slice"),
                                       AllEqual(zero->grad_shard(1), 1.5f, "weight slice")}) {
        EXPECT_OR_MSG(wrong.empty(), absl::StrCat("step ", step, ": ", wrong));
      }
      RETURN_IF_ERROR_MSG(zero->Step());
      zero->ZeroGrad();
    } else {
      RETURN_IF_ERROR_MSG(ddp->FinishBackward());
      for (const std::string& wrong : {AllEqual(m.inner().bias()->grad, 1.0f, "bias grad"),
                                       AllEqual(m.inner().weight()->grad, 1.5f, "weight grad")}) {
        EXPECT_OR_MSG(wrong.empty(), absl::StrCat("step ", step, ": ", wrong));
      }
      ddp->ZeroGrad();
    }
  }
  return "";
}

class DdpZero1GlooTest : public ::testing::TestWithParam<bool> {};

TEST_P(DdpZero1GlooTest, ARankOutOfMemoryForAReductionCopyStaysInStep) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve more address space than an RLIMIT_AS allows";
#endif
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(
      2, [&](int rank, int size) -> std::string { return RunRank(GetParam(), rank, size, dir); });
  ExpectAllOk(o);
}

INSTANTIATE_TEST_SUITE_P(Wrappers, DdpZero1GlooTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Zero1" : "Ddp";
                         });

}  // namespace
}  // namespace dist
