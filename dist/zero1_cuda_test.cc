// ZeRO-1 with bf16 mixed precision over GPU memory: ranks of the threads
// engine sharing cuda:0. Each rank's optimizer step writes its slice of every
// bucket's bf16 flat parameter in its own pass (optim::ParamRef::
// low_precision_copy; AdamW and SGD on a GPU), and the all-gather sends that
// slice: after every step the bf16 parameters are the fp32 masters' casts, bit
// for bit, on every rank. Runs on a GPU (built with --config=cuda) or the
// CUDA emulation; skips where no device is visible.
#include <cstdint>
#include <string>
#include <vector>

#include "dist/ddp_zero1_testing.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "precision/policy.h"
#include "tensor/cuda/testing.h"
#include "tensor/error.h"
#include "tensor/ops/embedding.h"

namespace dist {
namespace {

using ddp_zero1_testing::kSeed;
using ddp_zero1_testing::MakeOptimizer;
using ddp_zero1_testing::Opt;
using ddp_zero1_testing::RandomBatch;
using ddp_zero1_testing::Rows;
using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;
using testing::Tiny;  // dist/fsdp_testing.h

TEST(Zero1CudaTest, EachRanksStepWritesItsBf16SliceThatTheAllGatherSends) {
  SKIP_WITHOUT_GPU();
  const int n = 2;
  const ddp_zero1_testing::Batch batch = RandomBatch(31);
  const Device gpu = Device::Cuda(0);
  for (Opt opt : {Opt::kAdamW, Opt::kSgd}) {
    SCOPED_TRACE(opt == Opt::kAdamW ? "adamw" : "sgd");
    ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                  mingpt::GPT model(Tiny());
                  model.Materialize(kSeed, gpu);
                  Zero1Options options;
                  options.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
                  options.bucket_cap_mb = 0.002;  // several buckets, each split over the ranks
                  Zero1 zero(model, pg, MakeOptimizer(opt), options);
                  ASSERT_EQ(zero.flat_param_dtype(), Dtype::kBF16);
                  ASSERT_GT(zero.num_buckets(), 1);
                  for (int step = 0; step < 2; ++step) {
                    model.ForwardBackward(Rows(batch.idx, rank, n).To(gpu),
                                          Rows(batch.targets, rank, n).To(gpu));
                    ASSERT_TRUE(zero.Step().ok());
                    zero.ZeroGrad();
                    const auto full = zero.FullStateDict();  // rank 0: the fp32 masters
                    if (rank != 0) continue;
                    const auto params = model.NamedParameters();
                    ASSERT_EQ(full.size(), params.size());
                    for (size_t i = 0; i < full.size(); ++i) {
                      ASSERT_EQ(full[i].second.dtype(), Dtype::kF32);
                      const Tensor value = params[i].second->value.To(Device::Cpu());
                      ASSERT_EQ(value.dtype(), Dtype::kBF16) << full[i].first;
                      EXPECT_EQ(full[i].second.To(Device::Cpu()).To(Dtype::kBF16).ToVector<float>(),
                                value.ToVector<float>())
                          << full[i].first << ", step " << step;
                    }
                  }
                }).ok());
  }
}

// A GPU check still unread when Step() starts (here an embedding's ids, looked
// up after the loss was read, so no wait has read the check) throws before
// anything changes: the parameters keep their values, and the next Step()
// runs as if this one had not been tried.
TEST(Zero1CudaTest, AFailedDeferredCheckStopsTheStepBeforeAnythingChanges) {
  SKIP_WITHOUT_GPU();
  const int n = 2;
  const ddp_zero1_testing::Batch batch = RandomBatch(31);
  const Device gpu = Device::Cuda(0);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed, gpu);
                Zero1 zero(model, pg, MakeOptimizer(Opt::kAdamW), Zero1Options{});
                model.ForwardBackward(Rows(batch.idx, rank, n).To(gpu),
                                      Rows(batch.targets, rank, n).To(gpu));
                auto values = [&] {
                  std::vector<std::vector<float>> v;
                  for (const auto& [name, p] : model.NamedParameters()) {
                    v.push_back(p->value.To(Device::Cpu()).ToVector<float>());
                  }
                  return v;
                };
                const std::vector<std::vector<float>> before = values();
                const Tensor table = Tensor::Zeros({3, 2}, Dtype::kF32, gpu);
                const Tensor ids = Tensor::FromData<int64_t>({5}, {1}).To(gpu);  // 5 >= 3
                tensor::Embedding(table, ids);  // queued, no wait
                try {
                  (void)zero.Step();
                  ADD_FAILURE() << "expected OpError";
                } catch (const tensor::OpError& e) {
                  const std::string msg = e.what();
                  EXPECT_NE(msg.find("[embedding] id 5 at position [0]"), std::string::npos)
                      << msg;
                }
                EXPECT_EQ(values(), before) << "rank " << rank;
                ASSERT_TRUE(zero.Step().ok());
                EXPECT_NE(values(), before) << "rank " << rank;
              }).ok());
}

}  // namespace
}  // namespace dist
