// The race check of --config=cuda_emu_race (fiber.h): what orders the CUDA
// threads' memory accesses on a GPU orders them here, and nothing else does,
// whatever order the fibers happen to run in. Each racy kernel must be
// reported (ThreadSanitizer stops at the first report, in a death test's
// child); each correct one must not (a report would stop this process).
// Skips in builds without the check.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/fiber.h"
// After everything else: it redefines CUDA's qualifiers for kernel sources.
#include "third_party/cuda/emu/cuda_emu.h"

namespace cuda_emu {
namespace {

constexpr char kRace[] = "ThreadSanitizer: data race";

class RaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kRaceCheck) GTEST_SKIP() << "not a --config=cuda_emu_race build";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

int Tid() { return static_cast<int>(CurrentThread().thread_idx.x); }

// Thread t writes slot t of shared memory, then reads slot (t + shift) % n,
// with `sync` between the two.
void Exchange(int blocks, int n, int shift, const std::function<void()>& sync, int* out) {
  Launch(dim3(blocks), dim3(n), n * sizeof(int), [=] {
    int* s = DynamicShared<int>();
    const int t = Tid();
    s[t] = t + 1;
    sync();
    out[CurrentBlock().block_idx.x * n + t] = s[(t + shift) % n];
  });
}

TEST_F(RaceTest, SharedMemoryExchangeAfterSyncThreadsIsClean) {
  // Two blocks: the second reuses the first one's shared memory.
  std::vector<int> out(2 * 64);
  Exchange(
      2, 64, 1, [] { SyncThreads(); }, out.data());
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], (i % 64 + 1) % 64 + 1);
}

TEST_F(RaceTest, SharedMemoryExchangeWithoutABarrierIsARace) {
  std::vector<int> out(64);
  EXPECT_DEATH(Exchange(
                   1, 64, 1, [] {}, out.data()),
               kRace);
}

TEST_F(RaceTest, SyncWarpOrdersTheLanesOfItsWarp) {
  std::vector<int> lanes(64);
  Launch(dim3(1), dim3(64), 64 * sizeof(int), [&lanes] {
    int* s = DynamicShared<int>();
    const int t = Tid();
    s[t] = t;
    SyncWarp(0xffffffffu);
    lanes[t] = s[t ^ 1];
  });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(lanes[t], t ^ 1);
}

TEST_F(RaceTest, SyncWarpDoesNotOrderOtherWarps) {
  std::vector<int> out(64);
  EXPECT_DEATH(Exchange(
                   1, 64, 32, [] { SyncWarp(0xffffffffu); }, out.data()),
               kRace);
}

TEST_F(RaceTest, ShufflesDoNotOrderMemory) {
  std::vector<int> out(32);
  EXPECT_DEATH(Exchange(
                   1, 32, 1, [] { (void)__shfl_sync(0xffffffffu, 1, 0); }, out.data()),
               kRace);
}

TEST_F(RaceTest, TwoThreadsWritingOneGlobalWordIsARace) {
  int word = 0;
  EXPECT_DEATH(Launch(dim3(1), dim3(2), 0, [&word] { word = Tid(); }), kRace);
}

TEST_F(RaceTest, TwoBlocksWritingOneGlobalWordIsARace) {
  int word = 0;
  EXPECT_DEATH(Launch(dim3(2), dim3(1), 0, [&word] { word = CurrentBlock().block_idx.x; }), kRace);
}

// A static __shared__ array (as transform.py rewrites its declaration): each
// block has its own copy of it, which the previous block's accesses do not
// reach.
void StaticExchange(int* out) {
  Launch(dim3(2), dim3(64), 0, [=] {
    static char key;
    int* s = static_cast<int*>(StaticShared(&key, 64 * sizeof(int), alignof(int)));
    const int t = Tid();
    s[t] = t;
    SyncThreads();
    out[CurrentBlock().block_idx.x * 64 + t] = s[(t + 1) % 64];
  });
}

TEST_F(RaceTest, StaticSharedArraysAreEachBlocksOwn) {
  std::vector<int> out(128);
  StaticExchange(out.data());
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], (i + 1) % 64);
}

TEST_F(RaceTest, AtomicsDoNotRace) {
  int count = 0;
  unsigned long long lowest = ~0ull;
  Launch(dim3(2), dim3(64), 0, [&] {
    atomicAdd(&count, 1);
    atomicMin(&lowest, static_cast<unsigned long long>(100 + Tid()));
  });
  EXPECT_EQ(count, 128);
  EXPECT_EQ(lowest, 100u);
}

TEST_F(RaceTest, LaunchesAreOrdered) {
  std::vector<int> data(64, 0);
  Launch(dim3(1), dim3(64), 0, [&data] { data[Tid()] = Tid(); });
  Launch(dim3(1), dim3(64), 0, [&data] { data[63 - Tid()] += 1; });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(data[t], t + 1);
}

// cp.async: thread 0 copies 16 bytes into shared memory; thread 1 reads the
// destination before the copy is issued (if read_before_issue, then a barrier
// if barrier_after_read), and reads the copy either after the wait and a
// barrier (read_after_wait) or after a barrier that follows only the issue.
void CopyAndRead(const int* src, int* seen, bool read_before_issue, bool barrier_after_read,
                 bool read_after_wait) {
  Launch(dim3(1), dim3(32), 16, [=] {
    int* s = DynamicShared<int>();
    const int t = Tid();
    if (t == 1 && read_before_issue) seen[0] = s[0];  // the old bytes
    if (barrier_after_read) SyncThreads();
    if (t == 0) {
      CpAsync16(s, src, 16);
      CpAsyncCommit();
    }
    SyncThreads();
    if (t == 1 && !read_after_wait) seen[1] = s[0];
    if (t == 0) CpAsyncWait<0>();
    SyncThreads();
    if (t == 1 && read_after_wait) seen[1] = s[0];
  });
}

alignas(16) const int kSource[4] = {7, 8, 9, 10};

TEST_F(RaceTest, CpAsyncReadAfterTheWaitAndABarrierIsClean) {
  int seen[2] = {0, 0};
  CopyAndRead(kSource, seen, /*read_before_issue=*/true, /*barrier_after_read=*/true,
              /*read_after_wait=*/true);
  EXPECT_EQ(seen[1], 7);
}

TEST_F(RaceTest, CpAsyncDestinationReadBeforeTheWaitIsARace) {
  int seen[2] = {0, 0};
  EXPECT_DEATH(CopyAndRead(kSource, seen, false, false, /*read_after_wait=*/false), kRace);
}

TEST_F(RaceTest, CpAsyncOverwritingATileNotYetReadIsARace) {
  // Thread 1 still reads the old tile when thread 0 issues the copy over it:
  // on a GPU the copy may land first (the barrier before the wait is too late).
  int seen[2] = {0, 0};
  EXPECT_DEATH(CopyAndRead(kSource, seen, /*read_before_issue=*/true,
                           /*barrier_after_read=*/false, /*read_after_wait=*/true),
               kRace);
}

TEST_F(RaceTest, TheReportNamesTheCudaThread) {
  std::vector<int> out(64);
  EXPECT_DEATH(Exchange(
                   1, 64, 1, [] {}, out.data()),
               "CUDA thread [0-9]+ \\(warp 0, lane [0-9]+\\) of (even|odd) blocks");
}

}  // namespace
}  // namespace cuda_emu
