// The CUDA libraries (cuBLASLt, cuDNN, NCCL, cudart) compile and link; their
// version queries need no GPU. Tagged gpu: a --config=cuda build only.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "gtest/gtest.h"

namespace {

TEST(CudaLibrariesTest, VersionsLink) {
  EXPECT_GT(cublasLtGetVersion(), 0u);
  EXPECT_GE(cudnnGetVersion(), 9000u);
  int nccl = 0;
  EXPECT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  EXPECT_GT(nccl, 0);
  int runtime = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GE(runtime, 13000);
}

}  // namespace
