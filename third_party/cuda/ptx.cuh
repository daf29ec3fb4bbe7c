// The warp-level PTX instructions the kernels use -- the tensor-core MMA,
// ldmatrix and cp.async -- as device functions: inline assembly on the GPU,
// and the CPU emulation's model of the instruction under --config=cuda_emu
// (third_party/cuda/emu/cuda_emu.h). The attention kernels and the
// emulation's checks against the hardware (//third_party/cuda/emu:emu_test)
// call these same functions.
#ifndef THIRD_PARTY_CUDA_PTX_CUH_
#define THIRD_PARTY_CUDA_PTX_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ptx {

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c (16x8 f32) += a (16x16)
// * b (16x8), each lane holding its fragments (PTX ISA, "Matrix fragments
// for mma.m16n8k16"; g = lane / 4, t = lane % 4):
//   a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   b0: (k = 2t..2t+1, n = g)  b1: (k = 2t+8..2t+9, n = g)
//   c0, c1: (g, 2t..2t+1)  c2, c3: (g+8, 2t..2t+1)
// Two elements per register, the lower column (or k) in the low half.
template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::MmaM16N8K16<__nv_bfloat16>(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void Mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::MmaM16N8K16<__half>(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8m .. 8m + 7 give
// the addresses of rows 0 .. 7 of the 8x8 matrix m (16 bytes each, 16-byte
// aligned, in shared memory); r[m] is this lane's fragment of matrix m: row
// g, columns 2t, 2t + 1 (.trans: rows 2t, 2t + 1 of column g), the lower
// column (row) in the low half.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::LdMatrixX4<kTrans>(r, row);
#else
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#endif
}

// cp.async.cg.shared.global: 16 bytes from global into shared memory,
// reading src_bytes of them (16, or 0 to zero-fill); they land once this
// thread waits for their group (CpAsyncWait), and reach the other threads at
// the next __syncthreads after that.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::CpAsync16(dst, src, src_bytes);
#else
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(src_bytes));
#endif
}

// cp.async.commit_group: closes this thread's group of the copies issued
// since the last one.
__device__ __forceinline__ void CpAsyncCommit() {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::CpAsyncCommit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// cp.async.wait_group N: waits until at most kNewestPending of this thread's
// committed groups (the newest) are still in flight; 0 waits for all.
template <int kNewestPending>
__device__ __forceinline__ void CpAsyncWait() {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::CpAsyncWait<kNewestPending>();
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kNewestPending));
#endif
}

}  // namespace ptx

#endif  // THIRD_PARTY_CUDA_PTX_CUH_
