// The emulated libraries' work belongs to a device as kernels do (see
// devices_test.cc): cuBLASLt's matmul and CUB's sort on a stream of another
// device than the current one fail as their launches would
// (CUBLAS_STATUS_EXECUTION_FAILED, cudaErrorInvalidResourceHandle) and
// compute nothing; on the current device's streams they run. Emulation only
// (2 devices from the BUILD file).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/cub.h"
#include "third_party/cuda/emu/pending.h"

namespace cuda_emu {
namespace {

template <typename T>
T* OnDevice0(const std::vector<T>& values) {
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), values.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> Host(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

class LibraryDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(DeviceCount(), 2);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&on1_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&on0_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(on0_), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(on1_), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  cudaStream_t on0_ = nullptr, on1_ = nullptr;
};

TEST_F(LibraryDevicesTest, AMatmulOnAStreamOfAnotherDeviceFails) {
  // D (2 x 2) = A B, column-major, with A = I: D = B.
  float* a = OnDevice0<float>({1, 0, 0, 1});
  float* b = OnDevice0<float>({1, 2, 3, 4});
  float* d = OnDevice0<float>({0, 0, 0, 0});
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  auto matmul = [&](cudaStream_t stream) {
    return cublasLtMatmul(lt, desc, &one, a, layout, b, layout, &zero, d, layout, d, layout,
                          nullptr, nullptr, 0, stream);
  };
  EXPECT_EQ(matmul(on1_), CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(cudaStreamSynchronize(on0_), cudaSuccess);
  EXPECT_EQ(Host(d, 4), (std::vector<float>{0, 0, 0, 0})) << "the failed matmul ran";
  EXPECT_EQ(matmul(on0_), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamSynchronize(on0_), cudaSuccess);
  EXPECT_EQ(Host(d, 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
  for (float* p : {a, b, d}) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(LibraryDevicesTest, ASortOnAStreamOfAnotherDeviceFails) {
  int* keys = OnDevice0<int>({3, 1, 2});
  int* values = OnDevice0<int>({30, 10, 20});
  int* keys_out = OnDevice0<int>({0, 0, 0});
  int* values_out = OnDevice0<int>({0, 0, 0});
  char* temp = OnDevice0<char>({0});
  size_t temp_bytes = 1;
  auto sort = [&](cudaStream_t stream) {
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_out, values, values_out,
                                           3, 0, 32, stream);
  };
  EXPECT_EQ(sort(on1_), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamSynchronize(on0_), cudaSuccess);
  EXPECT_EQ(Host(values_out, 3), (std::vector<int>{0, 0, 0})) << "the failed sort ran";
  EXPECT_EQ(sort(on0_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(on0_), cudaSuccess);
  EXPECT_EQ(Host(values_out, 3), (std::vector<int>{10, 20, 30}));
  for (int* p : {keys, values, keys_out, values_out}) EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(temp), cudaSuccess);
}

}  // namespace
}  // namespace cuda_emu
