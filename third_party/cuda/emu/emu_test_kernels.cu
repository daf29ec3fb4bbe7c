// Kernels for the CUDA emulation's own tests (emu_test_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "third_party/cuda/emu/emu_test_kernels.h"
#include "third_party/cuda/ptx.cuh"

namespace cuda_emu_test {
namespace {

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
}

constexpr int kShuffleResults = 6;

__global__ void ShuffleKernel(int64_t* out) {
  const int t = threadIdx.x;
  const int v = 10 * t + 1;
  int64_t* o = out + t * kShuffleResults;
  o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[1] = __shfl_down_sync(0xffffffffu, v, 3);
  o[2] = __shfl_up_sync(0xffffffffu, v, 2);
  o[3] = __shfl_sync(0xffffffffu, v, 7, 16);
  int sum = v;
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  o[4] = sum;
  o[5] = __ballot_sync(0xffffffffu, v % 20 == 11);
}

__global__ void ReverseKernel(const float* in, float* out) {
  __shared__ float stage[256];
  extern __shared__ float dyn[];
  const int i = threadIdx.x, b = blockIdx.x;
  stage[i] = in[b * 256 + i];
  __syncthreads();
  dyn[i] = stage[255 - i] + static_cast<float>(b);
  __syncthreads();
  out[b * 256 + i] = dyn[i];
}

__device__ uint32_t Pack(const __nv_bfloat16* p) {
  return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) |
         (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p + 1)) << 16);
}

// a: 16x16 row major; bt: B transposed (8 x 16, row major: column n of B is
// row n, so a lane's two k values are adjacent); c, d: 16x8 row major.
__global__ void MmaKernel(const __nv_bfloat16* a, const __nv_bfloat16* bt, const float* c,
                          float* d) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const uint32_t af[4] = {Pack(a + g * 16 + 2 * t), Pack(a + (g + 8) * 16 + 2 * t),
                          Pack(a + g * 16 + 2 * t + 8), Pack(a + (g + 8) * 16 + 2 * t + 8)};
  const uint32_t b0 = Pack(bt + g * 16 + 2 * t), b1 = Pack(bt + g * 16 + 2 * t + 8);
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                  c[(g + 8) * 8 + 2 * t + 1]};
  ptx::Mma<__nv_bfloat16>(acc, af, b0, b1);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// One warp: element (m, row, col) of four 8x8 matrices is m * 64 + row * 8 +
// col, in dynamic shared memory with rows kLd elements apart; lane l gives
// row l % 8 of matrix l / 8. out[(trans * 32 + lane) * 4 + m] = r[m].
__global__ void LdMatrixKernel(uint32_t* out) {
  constexpr int kLd = 24;  // 48-byte rows: aligned, not packed
  extern __shared__ __align__(16) unsigned char smem[];
  auto* s = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x;
  for (int i = lane; i < 4 * 8 * 8; i += 32) {
    const int m = i / 64, row = (i / 8) % 8, col = i % 8;
    s[(m * 8 + row) * kLd + col] = static_cast<uint16_t>(i);
  }
  __syncwarp();
  const uint16_t* row = s + ((lane / 8) * 8 + lane % 8) * kLd;
  uint32_t r[4];
  ptx::LdMatrixX4<false>(r, row);
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
  ptx::LdMatrixX4<true>(r, row);
  for (int m = 0; m < 4; ++m) out[(32 + lane) * 4 + m] = r[m];
}

// An ldmatrix from global memory (from_global) or from a shared row that is
// not 16-byte aligned: the emulation aborts (a GPU reads garbage or faults).
__global__ void LdMatrixMisusedKernel(const uint16_t* global, bool from_global) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint16_t* row =
      from_global ? global : reinterpret_cast<const uint16_t*>(smem) + 4 + threadIdx.x * 8;
  uint32_t r[4];
  ptx::LdMatrixX4<false>(r, row);
}

// One warp. Group 1: lane l copies a[4l .. 4l + 3] to shared xs; group 2: it
// copies b[4l], b[4l + 1] and zero-fills two words into ys. out[l * 8 + i]:
// i = 0: xs[4l] before any wait; 1: xs[4l] after wait_group 1; 2: ys[4l]
// then; 3..6: ys[4l .. 4l + 3] after wait_group 0.
__global__ void AsyncCopyKernel(const uint32_t* a, const uint32_t* b, uint32_t* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* xs = reinterpret_cast<uint32_t*>(smem);
  uint32_t* ys = xs + 128;
  const int l = threadIdx.x;
  ptx::CpAsync16(xs + 4 * l, a + 4 * l, 16);
  ptx::CpAsyncCommit();
  ptx::CpAsync16(ys + 4 * l, b + 4 * l, 8);
  ptx::CpAsyncCommit();
  uint32_t* o = out + l * 8;
  o[0] = xs[4 * l];
  ptx::CpAsyncWait<1>();
  o[1] = xs[4 * l];
  o[2] = ys[4 * l];
  ptx::CpAsyncWait<0>();
  for (int i = 0; i < 4; ++i) o[3 + i] = ys[4 * l + i];
}

// A cp.async whose destination is in global memory: the emulation aborts.
__global__ void AsyncCopyToGlobalKernel(const uint32_t* a, uint32_t* global) {
  ptx::CpAsync16(global + 4 * threadIdx.x, a + 4 * threadIdx.x, 16);
  ptx::CpAsyncCommit();
  ptx::CpAsyncWait<0>();
}

// 64 KiB of dynamic shared memory (kVariant: one instantiation whose limit is
// raised, one whose is not): thread i writes words i, i + 256, ... and
// thread 0 adds them all up.
constexpr int kLargeSharedWords = 16384;
template <int kVariant>
__global__ void LargeSharedKernel(float* out) {
  extern __shared__ float words[];
  for (int i = threadIdx.x; i < kLargeSharedWords; i += blockDim.x) words[i] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < kLargeSharedWords; ++i) sum += words[i];
    *out = sum;
  }
}

__global__ void EmptyKernel() {}

__global__ void StoreTwoKernel(int* out, int a, int b) {
  out[0] = a;
  out[1] = b;
}

__global__ void MismatchedKernel() {
  if (threadIdx.x == 0) {
    __syncwarp(0xffffffffu);
  } else {
    __syncthreads();
  }
}

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* p = nullptr;
  Check(cudaMalloc(&p, v.size() * sizeof(T)), "cudaMalloc");
  Check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}
template <typename T>
std::vector<T> ToHost(T* p, size_t n) {
  std::vector<T> v(n);
  Check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  Check(cudaFree(p), "cudaFree");
  return v;
}

}  // namespace

std::vector<int64_t> Shuffles() {
  int64_t* out = ToDevice(std::vector<int64_t>(64 * kShuffleResults, 0));
  ShuffleKernel<<<1, 64>>>(out);
  Check(cudaGetLastError(), "ShuffleKernel");
  return ToHost(out, 64 * kShuffleResults);
}

std::vector<float> ReverseThroughSharedMemory(const std::vector<float>& in) {
  const float* d_in = ToDevice(in);
  float* out = ToDevice(std::vector<float>(in.size(), 0.0f));
  ReverseKernel<<<static_cast<unsigned>(in.size() / 256), 256, 256 * sizeof(float)>>>(d_in, out);
  Check(cudaGetLastError(), "ReverseKernel");
  Check(cudaFree(const_cast<float*>(d_in)), "cudaFree");
  return ToHost(out, in.size());
}

std::vector<float> MmaBf16(const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>& c) {
  std::vector<__nv_bfloat16> ha(256), hbt(128);
  for (int i = 0; i < 256; ++i) ha[i] = __float2bfloat16_rn(a[i]);
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) hbt[n * 16 + k] = __float2bfloat16_rn(b[k * 8 + n]);
  }
  const __nv_bfloat16* da = ToDevice(ha);
  const __nv_bfloat16* dbt = ToDevice(hbt);
  const float* dc = ToDevice(c);
  float* dd = ToDevice(std::vector<float>(128, 0.0f));
  MmaKernel<<<1, 32>>>(da, dbt, dc, dd);
  Check(cudaGetLastError(), "MmaKernel");
  Check(cudaFree(const_cast<__nv_bfloat16*>(da)), "cudaFree");
  Check(cudaFree(const_cast<__nv_bfloat16*>(dbt)), "cudaFree");
  Check(cudaFree(const_cast<float*>(dc)), "cudaFree");
  return ToHost(dd, 128);
}

std::vector<uint32_t> LdMatrixX4() {
  uint32_t* out = ToDevice(std::vector<uint32_t>(2 * 32 * 4, 0));
  LdMatrixKernel<<<1, 32, 32 * 24 * sizeof(uint16_t)>>>(out);
  Check(cudaGetLastError(), "LdMatrixKernel");
  return ToHost(out, 2 * 32 * 4);
}

void LdMatrixMisused(bool from_global) {
  uint16_t* global = ToDevice(std::vector<uint16_t>(32 * 8, 0));
  LdMatrixMisusedKernel<<<1, 32, 33 * 8 * sizeof(uint16_t)>>>(global, from_global);
  Check(cudaDeviceSynchronize(), "LdMatrixMisusedKernel");
  Check(cudaFree(global), "cudaFree");
}

std::vector<uint32_t> AsyncCopies() {
  std::vector<uint32_t> a(128), b(128);
  for (uint32_t i = 0; i < 128; ++i) {
    a[i] = 1000 + i;
    b[i] = 5000 + i;
  }
  const uint32_t* da = ToDevice(a);
  const uint32_t* db = ToDevice(b);
  uint32_t* out = ToDevice(std::vector<uint32_t>(32 * 8, 0));
  AsyncCopyKernel<<<1, 32, 2 * 128 * sizeof(uint32_t)>>>(da, db, out);
  Check(cudaGetLastError(), "AsyncCopyKernel");
  Check(cudaFree(const_cast<uint32_t*>(da)), "cudaFree");
  Check(cudaFree(const_cast<uint32_t*>(db)), "cudaFree");
  return ToHost(out, 32 * 8);
}

void AsyncCopyToGlobal() {
  const uint32_t* a = ToDevice(std::vector<uint32_t>(128, 1));
  uint32_t* global = ToDevice(std::vector<uint32_t>(128, 0));
  AsyncCopyToGlobalKernel<<<1, 32>>>(a, global);
  Check(cudaDeviceSynchronize(), "AsyncCopyToGlobalKernel");
}

float LargeDynamicShared(bool raise_limit) {
  float* out = ToDevice(std::vector<float>(1, 0.0f));
  constexpr size_t kBytes = kLargeSharedWords * sizeof(float);
  if (raise_limit) {
    Check(cudaFuncSetAttribute(LargeSharedKernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kBytes)),
          "cudaFuncSetAttribute");
    LargeSharedKernel<0><<<1, 256, kBytes>>>(out);
  } else {
    LargeSharedKernel<1><<<1, 256, kBytes>>>(out);
  }
  Check(cudaGetLastError(), "LargeSharedKernel");
  return ToHost(out, 1)[0];
}

std::vector<int> ArgumentsAtLaunch() {
  int* out = ToDevice(std::vector<int>(2, 0));
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  {
    std::vector<int> values = {7, 8};
    const int* first = values.data();
    StoreTwoKernel<<<1, 1, 0, stream>>>(out, *first, values[1]);
    Check(cudaGetLastError(), "StoreTwoKernel");
    values[0] = -1;
    values[1] = -2;
  }  // the arguments' sources are gone before the kernel need have run
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  Check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return ToHost(out, 2);
}

std::string OversizedBlockError() {
  EmptyKernel<<<1, 2048>>>();
  return cudaGetErrorName(cudaGetLastError());
}

void MismatchedBarriers() {
  MismatchedKernel<<<1, 64>>>();
  Check(cudaDeviceSynchronize(), "MismatchedKernel");
}

}  // namespace cuda_emu_test
