// RelativePositionBias with its table on a GPU against the same layer on the
// CPU: the bias and the table's gradient, over a sequence of grids that
// changes (length, query offset, explicit positions) and comes back, so the
// device bucket table it keeps is reused only for the positions it was made
// from (models/t5:gpu_step_counts_test pins the waits it spares). Tagged gpu;
// skips without a device.
#include <vector>

#include "gtest/gtest.h"
#include "nn/relative_position_bias.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Device;
using tensor::cuda::testing::MatchesCpu;
using tensor::cuda::testing::ToGpu;
using tensor::cuda::testing::Tolerance;
using tensor::testing::RandomTensor;

struct Grid {
  int64_t t_q, t_k, offset;
};

TEST(RelativePositionBiasCudaTest, ReusesItsDeviceTableOnlyForTheSamePositions) {
  SKIP_WITHOUT_GPU();
  for (bool bidirectional : {true, false}) {
    SCOPED_TRACE(bidirectional ? "bidirectional" : "causal");
    RelativePositionBias cpu(3, bidirectional), gpu(3, bidirectional);
    cpu.weight()->value = RandomTensor({32, 3}, 5);
    gpu.weight()->value = ToGpu(cpu.weight()->value);
    const std::vector<Grid> grids = {{6, 6, 0}, {6, 6, 0}, {9, 6, 0}, {6, 6, 0},
                                     {1, 7, 6}, {1, 7, 5}, {6, 6, 0}};
    for (size_t i = 0; i < grids.size(); ++i) {
      const Grid& g = grids[i];
      SCOPED_TRACE(::testing::Message()
                   << "call " << i << ": " << g.t_q << "x" << g.t_k << " offset " << g.offset);
      Context cpu_ctx, gpu_ctx;
      const Tensor want = cpu.Run(g.t_q, g.t_k, cpu_ctx, g.offset);
      const Tensor got = gpu.Run(g.t_q, g.t_k, gpu_ctx, g.offset);
      EXPECT_TRUE(MatchesCpu(got, want, Tolerance{0, 0}));
      const Tensor grad = RandomTensor(want.shape(), 10 + i);
      cpu.RunBackward(grad, cpu_ctx);
      gpu.RunBackward(ToGpu(grad), gpu_ctx);
      EXPECT_TRUE(MatchesCpu(gpu.weight()->grad, cpu.weight()->grad, Tolerance{1e-5, 1e-5}));
    }
    // Explicit positions that differ from the last grid only in one entry.
    Tensor rel = RelativePositionBias::RelativePositions(6, 6);
    rel.data<int64_t>()[7] = 40;
    Context cpu_ctx, gpu_ctx;
    EXPECT_TRUE(MatchesCpu(gpu.Run(Tensors{rel}, gpu_ctx).at(0),
                           cpu.Run(Tensors{rel}, cpu_ctx).at(0), Tolerance{0, 0}));
  }
}

}  // namespace
}  // namespace nn
