// The semantics the CUDA emulation reproduces, checked on whatever runs the
// kernels: with --config=cuda_emu the emulation, with --config=cuda a GPU
// (where the test pins the emulation's model to the hardware; skipped
// without one).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/emu_test_kernels.h"

namespace cuda_emu_test {
namespace {

bool Emulated() {
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
         std::strstr(prop.name, "cuda_emu") != nullptr;
}

#define SKIP_WITHOUT_DEVICE()                                         \
  do {                                                                \
    int n = 0;                                                        \
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {            \
      GTEST_SKIP() << "no CUDA device (or emulation) visible";        \
    }                                                                 \
  } while (0)

TEST(CudaSemanticsTest, WarpShuffles) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<int64_t> got = Shuffles();
  for (int t = 0; t < 64; ++t) {
    SCOPED_TRACE(t);
    const int lane = t % 32, base = t - lane;
    auto v = [&](int l) { return int64_t{10} * (base + l) + 1; };
    const int64_t* o = got.data() + t * 6;
    EXPECT_EQ(o[0], v(lane ^ 5));
    EXPECT_EQ(o[1], lane + 3 < 32 ? v(lane + 3) : v(lane));
    EXPECT_EQ(o[2], lane >= 2 ? v(lane - 2) : v(lane));
    EXPECT_EQ(o[3], v((lane & ~15) + 7));
    int64_t sum = 0;
    for (int l = 0; l < 32; ++l) sum += v(l);
    EXPECT_EQ(o[4], sum);
    int64_t ballot = 0;
    for (int l = 0; l < 32; ++l) {
      if (v(l) % 20 == 11) ballot |= int64_t{1} << l;
    }
    EXPECT_EQ(static_cast<uint32_t>(o[5]), static_cast<uint32_t>(ballot));
  }
}

TEST(CudaSemanticsTest, BarriersAndSharedMemory) {
  SKIP_WITHOUT_DEVICE();
  std::vector<float> in(3 * 256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  const std::vector<float> out = ReverseThroughSharedMemory(in);
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < 256; ++i) ASSERT_EQ(out[b * 256 + i], in[b * 256 + 255 - i] + b) << b << " " << i;
  }
}

TEST(CudaSemanticsTest, MmaFragmentLayouts) {
  SKIP_WITHOUT_DEVICE();
  // Small integers: exact in bf16 and in any summation order.
  std::vector<float> a(256), b(128), c(128);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>((i * 7) % 11 - 5);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>((i * 5) % 9 - 4);
  for (int i = 0; i < 128; ++i) c[i] = static_cast<float>(i % 13);
  const std::vector<float> d = MmaBf16(a, b, c);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      float want = c[m * 8 + n];
      for (int k = 0; k < 16; ++k) want += a[m * 16 + k] * b[k * 8 + n];
      EXPECT_EQ(d[m * 8 + n], want) << "row " << m << " column " << n;
    }
  }
}

TEST(CudaSemanticsTest, LdMatrixFragmentLayouts) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<uint32_t> out = LdMatrixX4();
  auto element = [](int m, int row, int col) {
    return static_cast<uint32_t>(m * 64 + row * 8 + col);
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(out[lane * 4 + m], element(m, g, 2 * t) | element(m, g, 2 * t + 1) << 16)
          << "lane " << lane << " matrix " << m;
      EXPECT_EQ(out[(32 + lane) * 4 + m], element(m, 2 * t, g) | element(m, 2 * t + 1, g) << 16)
          << ".trans, lane " << lane << " matrix " << m;
    }
  }
}

TEST(CudaSemanticsTest, AsyncCopiesLandByGroup) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<uint32_t> out = AsyncCopies();
  for (uint32_t lane = 0; lane < 32; ++lane) {
    const uint32_t* o = out.data() + lane * 8;
    EXPECT_EQ(o[1], 1000 + 4 * lane) << "lane " << lane << ": the first group after wait_group 1";
    EXPECT_EQ(o[3], 5000 + 4 * lane) << lane;
    EXPECT_EQ(o[4], 5000 + 4 * lane + 1) << lane;
    EXPECT_EQ(o[5], 0u) << lane << ": zero-filled";
    EXPECT_EQ(o[6], 0u) << lane << ": zero-filled";
    if (Emulated()) {
      // The emulation lands a group at its wait: earlier reads see the
      // block's initial shared memory (0xff bytes). A GPU may land it sooner.
      EXPECT_EQ(o[0], 0xffffffffu) << lane << ": read before any wait";
      EXPECT_EQ(o[2], 0xffffffffu) << lane << ": the second group after wait_group 1";
    }
  }
}

// A launch's arguments are evaluated when it is made, even where the
// emulation runs the kernel later (it evaluated them when the kernel ran: a
// deferred dropout launch read a caller's tensor after it was gone).
TEST(CudaSemanticsTest, ArgumentsAreTheirValuesAtTheLaunch) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(ArgumentsAtLaunch(), std::vector<int>({7, 8}));
}

TEST(CudaSemanticsTest, OversizedBlockIsALaunchError) {
  SKIP_WITHOUT_DEVICE();
  // What CUDA 13 returns on an H200 (cudaErrorInvalidConfiguration before).
  EXPECT_EQ(OversizedBlockError(), "cudaErrorInvalidValue");
}

TEST(CudaSemanticsTest, DynamicSharedMemoryAbove48KiBOnceTheLimitIsRaised) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(LargeDynamicShared(/*raise_limit=*/true), 16384.0f);
}

TEST(CudaSemanticsDeathTest, DynamicSharedMemoryAbove48KiBWithoutRaisingTheLimit) {
  SKIP_WITHOUT_DEVICE();
  if (!Emulated()) GTEST_SKIP() << "a GPU fails the launch: emulation only";
  EXPECT_DEATH(LargeDynamicShared(/*raise_limit=*/false),
               "a kernel launched with 65536 bytes of dynamic shared memory, above its limit of "
               "49152");
}

TEST(CudaSemanticsDeathTest, MismatchedBarriersAreReportedNotHung) {
  SKIP_WITHOUT_DEVICE();
  if (!Emulated()) GTEST_SKIP() << "a GPU would hang: emulation only";
  EXPECT_DEATH(MismatchedBarriers(), "deadlock in block \\(0, 0, 0\\)");
}

TEST(CudaSemanticsDeathTest, LdMatrixOutsideSharedMemoryIsReported) {
  SKIP_WITHOUT_DEVICE();
  if (!Emulated()) GTEST_SKIP() << "undefined on a GPU: emulation only";
  EXPECT_DEATH(LdMatrixMisused(/*from_global=*/true),
               "an ldmatrix row at 0x[0-9a-f]+ by thread \\(0, 0, 0\\) of block \\(0, 0, 0\\) "
               "is not in the block's dynamic shared memory");
  EXPECT_DEATH(LdMatrixMisused(/*from_global=*/false), "misaligned address: a 16-byte access");
}

TEST(CudaSemanticsDeathTest, AsyncCopyOutsideSharedMemoryIsReported) {
  SKIP_WITHOUT_DEVICE();
  if (!Emulated()) GTEST_SKIP() << "undefined on a GPU: emulation only";
  EXPECT_DEATH(AsyncCopyToGlobal(),
               "a cp.async destination at 0x[0-9a-f]+ by thread \\(0, 0, 0\\) .* is not in the "
               "block's dynamic shared memory");
}

}  // namespace
}  // namespace cuda_emu_test
