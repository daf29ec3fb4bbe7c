// The nccl engine's failures: a call that differs across ranks, two ranks on
// one GPU, a call one rank never makes (in the world group or a subgroup,
// whose label the error gives) or a peer that is gone (each named),
// a bad peer check interval, a call one rank refuses (the group broken, not
// out of step), the NCCL call lock's bounds, and an error NCCL cannot read.
// Most need the emulation or two GPUs; they skip (GTEST_SKIP) otherwise.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/nccl_group.h"
#include "dist/nccl_group_testing.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;
using testing::Options;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A call whose sizes differ across the ranks: the emulated NCCL flags both
// communicators and ends their pending work without running it (real NCCL's
// behaviour is undefined: not run there). The call fails on every rank with
// NCCL's error instead of returning OK over an output nothing wrote.
TEST(NcclGroupTest, ACallThatDiffersAcrossRanksFailsOnEveryRank) {
#ifndef CUDA_EMULATED
  GTEST_SKIP() << "mismatched NCCL calls are undefined on a real GPU";
#endif
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto pg =
          CreateNcclProcessGroup(rank, 2, rank, store, Options("differs", absl::Seconds(20)));
      if (!pg.ok()) {
        got[rank] = pg.status();
        return;
      }
      got[rank] = (*pg)->BarrierSync();
      if (!got[rank].ok()) return;
      Tensor x = Tensor::Full({rank == 0 ? 16 : 8}, 1.0, Dtype::kF32, Device::Cuda(rank));
      got[rank] = (*pg)->AllReduceSync(x, ReduceOp::kSum);
      (*pg)->set_timeout(absl::Seconds(3));  // bounds the broken group's shutdown
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(got[rank].ok()) << "rank " << rank;
    EXPECT_THAT(std::string(got[rank].message()), HasSubstr("differs across ranks"))
        << "rank " << rank << ": " << got[rank];
  }
}

// Two ranks on one GPU: NCCL refuses them (its duplicate-GPU check), and the
// error says what to change.
TEST(NcclGroupTest, TwoRanksOnOneGpuFailSayingWhy) {
#ifndef CUDA_EMULATED
  GTEST_SKIP() << "the emulated NCCL's check stands for NCCL's; a GPU run would need 2 ranks";
#endif
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  std::vector<absl::Status> got(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      got[rank] =
          CreateNcclProcessGroup(rank, 2, 0, store, Options("one_gpu", absl::Seconds(20))).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(std::string(got[rank].message()),
                HasSubstr("two ranks of this group are on one GPU. NCCL needs one GPU per rank"))
        << "rank " << rank << ": " << got[rank];
  }
}

// World rank `rank` of 2's groups for the tests below: the world group
// (prefix `prefix`, timeout `timeout`); with `depth` >= 1, Split(0) of it in
// reverse order (world rank 1 is its rank 0); with `depth` 2, Split(0) of
// that in its own order. Destroyed innermost first.
struct SplitGroups {
  std::vector<std::unique_ptr<ProcessGroup>> groups;  // the world group first
  ProcessGroup& innermost() { return *groups.back(); }
  void SetTimeouts(absl::Duration t) {
    for (auto& g : groups) g->set_timeout(t);
  }
  ~SplitGroups() {
    while (!groups.empty()) groups.pop_back();
  }
};
absl::Status MakeSplitGroups(int rank, HashStore& store, const std::string& prefix,
                             absl::Duration timeout, int depth, SplitGroups* out) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg =
      CreateNcclProcessGroup(rank, 2, rank, store, Options(prefix, timeout));
  if (!pg.ok()) return pg.status();
  out->groups.push_back(*std::move(pg));
  for (int level = 0; level < depth; ++level) {
    ProcessGroup& parent = out->innermost();
    absl::StatusOr<std::unique_ptr<ProcessGroup>> sub =
        parent.Split(0, /*key=*/level == 0 ? 1 - rank : parent.rank());
    if (!sub.ok()) return sub.status();
    out->groups.push_back(*std::move(sub));
  }
  return absl::OkStatus();
}

// An all-reduce that rank 0 makes (with a 1 s timeout) and rank 1 never does,
// in the innermost of MakeSplitGroups(`depth`) (0: the world group), after a
// barrier of both when `barrier_first`; then rank 0's barrier, which must
// fail at once on the group the timeout made unusable. Rank 1 stays alive
// until rank 0 is done.
struct StuckCall {
  absl::Status timed_out;  // rank 0's all-reduce (or what failed before it)
  absl::Status later;      // rank 0's barrier after it
  absl::Status rank1;
};
StuckCall RunStuckAllReduce(const std::string& prefix, int depth, bool barrier_first) {
  HashStore store;
  StuckCall got;
  const std::string done = absl::StrCat("test/", prefix, "_rank0_done");
  std::thread rank0_thread([&] {
    SplitGroups groups;
    got.timed_out = MakeSplitGroups(0, store, prefix, absl::Seconds(30), depth, &groups);
    if (!got.timed_out.ok()) return;
    if (barrier_first) {
      got.timed_out = groups.innermost().BarrierSync();  // call #0, both ranks
      if (!got.timed_out.ok()) return;
    }
    Tensor x = Tensor::Full({16}, 1.0, Dtype::kF32, Device::Cuda(0));
    got.timed_out = groups.innermost().AllReduceSync(
        x, ReduceOp::kSum, CollectiveOptions::WithTimeout(absl::Seconds(1)));
    const absl::Time start = absl::Now();
    got.later = groups.innermost().BarrierSync();
    if (absl::Now() - start > absl::Seconds(1)) got.later = absl::InternalError("not at once");
    ASSERT_TRUE(store.Set(done, "1").ok());
  });
  std::thread rank1_thread([&] {
    SplitGroups groups;
    got.rank1 = MakeSplitGroups(1, store, prefix, absl::Seconds(30), depth, &groups);
    if (!got.rank1.ok()) return;
    if (barrier_first) got.rank1 = groups.innermost().BarrierSync();
    // Skips the all-reduce, stays alive until rank 0 has failed.
    groups.SetTimeouts(absl::Seconds(3));  // bounds the groups' shutdown (finalize)
    got.rank1.Update(store.Get(done, absl::Seconds(60)).status());
  });
  rank0_thread.join();
  rank1_thread.join();
  return got;
}

TEST(NcclGroupTest, ACallOneRankNeverMakesTimesOutNamingIt) {
  SKIP_WITHOUT_GPUS(2);
  const auto [timed_out, later, rank1] =
      RunStuckAllReduce("stuck", /*depth=*/0, /*barrier_first=*/true);
  ASSERT_TRUE(rank1.ok()) << rank1;
  ASSERT_TRUE(absl::IsDeadlineExceeded(timed_out)) << timed_out;
  EXPECT_THAT(std::string(timed_out.message()),
              StartsWith("[all_reduce] rank 0 of 2 timed out after 1.0 s waiting for rank 1 (call "
                         "#1 of this rank; rank 1 sent no report"));
  EXPECT_THAT(std::string(later.message()),
              StartsWith("[barrier] rank 0 of 2: the group is unusable after an earlier failure: "
                         "[all_reduce] rank 0 of 2 timed out"));
}

// The same in a subgroup of a subgroup (MakeSplitGroups: world rank 1 is
// rank 0 of both): the error names the group and the peer's world rank as
// the other engines do, "rank 1 of 2 in group world/split0/color0/split0/
// color0 ... waiting for rank 0 (world 1)".
TEST(NcclGroupTest, ACallInASubgroupTimesOutNamingTheGroup) {
  SKIP_WITHOUT_GPUS(2);
  const auto [timed_out, later, rank1] =
      RunStuckAllReduce("sub", /*depth=*/2, /*barrier_first=*/false);
  ASSERT_TRUE(rank1.ok()) << rank1;
  ASSERT_TRUE(absl::IsDeadlineExceeded(timed_out)) << timed_out;
  EXPECT_THAT(std::string(timed_out.message()),
              StartsWith("[all_reduce] rank 1 of 2 in group world/split0/color0/split0/color0 "
                         "timed out after 1.0 s waiting for rank 0 (world 1) (call #0 of this "
                         "rank"));
  EXPECT_THAT(std::string(later.message()),
              StartsWith("[barrier] rank 1 of 2 in group world/split0/color0/split0/color0: the "
                         "group is unusable after an earlier failure"));
}

// Rank 1 makes one call and destroys its group (its work ended, or failed
// outside the group, as a rank of FSDP whose backward threw does): rank 0's
// next call, which rank 1 will never make, fails within about a second
// instead of after its 60 s timeout, naming rank 1; the group is then
// unusable on rank 0.
TEST(NcclGroupTest, ACallAPeerWillNeverMakeFailsOnceThePeerIsGone) {
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  absl::Status first;
  absl::Status never;
  absl::Duration waited;
  absl::Status rank1;
  std::thread rank0_thread([&] {
    auto pg = CreateNcclProcessGroup(0, 2, 0, store, Options("gone", absl::Seconds(60)));
    if (!pg.ok()) {
      first = pg.status();
      return;
    }
    first = (*pg)->BarrierSync();  // call #0, both ranks
    Tensor x = Tensor::Full({16}, 1.0, Dtype::kF32, Device::Cuda(0));
    const absl::Time start = absl::Now();
    never = (*pg)->AllReduceSync(x, ReduceOp::kSum);
    waited = absl::Now() - start;
  });
  std::thread rank1_thread([&] {
    auto pg = CreateNcclProcessGroup(1, 2, 1, store, Options("gone", absl::Seconds(60)));
    if (!pg.ok()) {
      rank1 = pg.status();
      return;
    }
    rank1 = (*pg)->BarrierSync();
  });  // rank 1's group is destroyed here
  rank0_thread.join();
  rank1_thread.join();
  ASSERT_TRUE(rank1.ok()) << rank1;
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_TRUE(absl::IsAborted(never)) << never;
  EXPECT_THAT(std::string(never.message()), StartsWith("[all_reduce] rank 0 of 2"));
#ifdef CUDA_EMULATED
  // On a GPU, NCCL may report rank 1's exit first (ncclRemoteError).
  EXPECT_EQ(never.message(),
            "[all_reduce] rank 0 of 2: rank 1 will never make this call (call #1 of this rank; "
            "rank 1 stopped before its call #1: its group was destroyed after issuing 1 call "
            "(the rank finished, or stopped on an error outside this group))");
#endif
  EXPECT_LT(waited, absl::Seconds(30));
}

// The same in a subgroup whose ranks are in reverse order (MakeSplitGroups
// of depth 1): the gone peer is named with its world rank, "rank 0 (world 1)
// will never make this call".
TEST(NcclGroupTest, ACallAPeerOfASubgroupWillNeverMakeNamesItsWorldRank) {
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  absl::Status never;
  absl::Status rank1;
  std::thread rank0_thread([&] {
    SplitGroups groups;
    never = MakeSplitGroups(0, store, "sub_gone", absl::Seconds(60), /*depth=*/1, &groups);
    if (!never.ok()) return;
    never = groups.innermost().BarrierSync();  // call #0, both ranks
    if (!never.ok()) return;
    Tensor x = Tensor::Full({16}, 1.0, Dtype::kF32, Device::Cuda(0));
    never = groups.innermost().AllReduceSync(x, ReduceOp::kSum);
  });
  std::thread rank1_thread([&] {
    SplitGroups groups;
    rank1 = MakeSplitGroups(1, store, "sub_gone", absl::Seconds(60), /*depth=*/1, &groups);
    if (rank1.ok()) rank1 = groups.innermost().BarrierSync();
  });  // rank 1's groups are destroyed here
  rank0_thread.join();
  rank1_thread.join();
  ASSERT_TRUE(rank1.ok()) << rank1;
  EXPECT_TRUE(absl::IsAborted(never)) << never;
  EXPECT_THAT(std::string(never.message()),
              StartsWith("[all_reduce] rank 1 of 2 in group world/split0/color0"));
#ifdef CUDA_EMULATED
  // On a GPU, NCCL may report rank 1's exit first (ncclRemoteError).
  EXPECT_THAT(std::string(never.message()),
              StartsWith("[all_reduce] rank 1 of 2 in group world/split0/color0: rank 0 (world 1) "
                         "will never make this call (call #1 of this rank; rank 0 stopped before "
                         "its call #1"));
#endif
}

TEST(NcclGroupTest, ABadPeerCheckIntervalIsRefused) {
  HashStore store;
  NcclGroupOptions options = Options("interval");
  options.peer_check_interval = absl::ZeroDuration();
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, options);
  EXPECT_EQ(pg.status(), absl::InvalidArgumentError("[nccl_init] peer_check_interval must be > 0 "
                                                    "(InfiniteDuration: never), not 0"));
}

// A call rank 1 refuses (a strided tensor) is made by rank 0 only: rank 1's
// group breaks instead of pairing its next call with rank 0's all-reduce, and
// rank 0's all-reduce fails naming rank 1 and its refusal (or, when rank 0's
// 2 s timeout comes before its check of the store, naming rank 1 as having
// issued 1 call).
TEST(NcclGroupTest, ACallOneRankRefusesBreaksItsGroupInsteadOfDesyncing) {
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  std::vector<absl::Status> got(2);
  std::vector<absl::Status> later(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto pg = CreateNcclProcessGroup(rank, 2, rank, store, Options("refused", absl::Seconds(30)));
      if (!pg.ok()) {
        got[rank] = pg.status();
        return;
      }
      got[rank] = (*pg)->BarrierSync();  // call #0, both ranks
      if (!got[rank].ok()) return;
      (*pg)->set_timeout(absl::Seconds(2));  // rank 0's wait for rank 1; bounds the shutdown
      Tensor x = Tensor::Full({4, 4}, 1.0, Dtype::kF32, Device::Cuda(rank));
      got[rank] = (*pg)->AllReduceSync(rank == 0 ? x : x.Transpose(0, 1), ReduceOp::kSum);
      later[rank] = (*pg)->BarrierSync();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(absl::IsInvalidArgument(got[1])) << got[1];
  EXPECT_THAT(std::string(got[1].message()),
              StartsWith("[all_reduce] rank 1 of 2: the tensor is not contiguous"));
  EXPECT_THAT(std::string(later[1].message()),
              StartsWith("[barrier] rank 1 of 2: the group is unusable after an earlier failure: "
                         "[all_reduce] rank 1 of 2: the tensor is not contiguous"));
  EXPECT_FALSE(got[0].ok());
  EXPECT_THAT(std::string(got[0].message()), StartsWith("[all_reduce] rank 0 of 2"));
  if (absl::IsDeadlineExceeded(got[0])) {
    EXPECT_THAT(std::string(got[0].message()),
                HasSubstr("waiting for rank 1 (call #1 of this rank; rank 1 had issued 1 call)"));
  } else {
    EXPECT_TRUE(absl::IsAborted(got[0])) << got[0];
#ifdef CUDA_EMULATED
    EXPECT_EQ(got[0].message(),
              "[all_reduce] rank 0 of 2: rank 1 will never make this call (call #1 of this "
              "rank; rank 1 stopped before its call #1: [all_reduce] rank 1 of 2: the tensor is "
              "not contiguous (the nccl engine takes contiguous tensors only))");
#endif
  }
  EXPECT_FALSE(later[0].ok());
}

// Another call of the group's family holding the NCCL call lock (one that
// hangs, as a destroy behind a kernel waiting for a peer can) holds up this
// group's enqueue for the call's timeout at most: the call then fails naming
// the lock, and the group is broken, instead of waiting as long as the hang.
TEST(NcclGroupTest, AnEnqueueWaitsForTheNcclCallLockItsTimeoutAtMost) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("locked"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<std::shared_ptr<std::timed_mutex>> calls =
      internal::NcclCallsLockForTesting(**pg);
  ASSERT_TRUE(calls.ok()) << calls.status();
  Tensor t = Tensor::Full({4}, 1.0, Dtype::kF32, Device::Cuda(0));
  std::unique_lock<std::timed_mutex> held(**calls);
  WorkPtr work = (*pg)->AllReduce(t, ReduceOp::kSum,
                                  CollectiveOptions::WithTimeout(absl::Milliseconds(300)));
  // Let go after 20 s whatever happens (a wait without a bound then enqueues
  // the call, which succeeds: that fails below).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!work->IsCompleted() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  held.unlock();
  const absl::Status s = work->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("enqueuing the NCCL call: another NCCL call of the group's family (the "
                        "groups split from one, or sharing its launch order) did not return "
                        "within 300ms"));
  EXPECT_THAT(std::string((*pg)->BarrierSync().message()),
              HasSubstr("the group is unusable after an earlier failure"));
}

// A group destroyed while another call of its family holds the NCCL call
// lock aborts its communicator once the finalize has waited the group's
// timeout for the lock, and says so, naming the lock. (Destroyed on a thread
// of its own: only this one may let go of the lock, after 20 s at most.)
TEST(NcclGroupTest, AGroupWhoseFinalizeCannotTakeTheLockIsAbortedSayingWhy) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("destroyed"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<std::shared_ptr<std::timed_mutex>> calls =
      internal::NcclCallsLockForTesting(**pg);
  ASSERT_TRUE(calls.ok()) << calls.status();
  (*pg)->set_timeout(absl::Milliseconds(200));
  std::unique_lock<std::timed_mutex> held(**calls);
  ::testing::internal::CaptureStderr();
  std::atomic<bool> destroyed{false};
  std::thread destroy([&] {
    pg->reset();
    destroyed = true;
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!destroyed && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  const bool in_time = destroyed;
  held.unlock();
  destroy.join();
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(in_time) << "the destruction waited for the lock without a bound";
  EXPECT_THAT(said, HasSubstr("nccl: cuda:0: aborting the communicator instead of destroying it: "
                              "finalize: another NCCL call of the group's family (the groups "
                              "split from one, or sharing its launch order) did not return "
                              "within 200ms"));
}

// While another call of its family holds the NCCL call lock, a call whose
// kernel has finished on the device is not finished for the group: NCCL's
// error (ncclCommGetAsyncError, a call under the lock) is unread, and a
// communicator that failed can let the done event complete without the
// collective having run. Once the lock is free the call finishes. (The two
// ranks' groups are separate families.)
TEST(NcclGroupTest, ACallIsNotFinishedWhileNcclsErrorCannotBeRead) {
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  std::vector<std::unique_ptr<ProcessGroup>> groups(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto pg = CreateNcclProcessGroup(rank, 2, rank, store, Options("unread"));
      if (pg.ok()) groups[rank] = *std::move(pg);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(groups[0] != nullptr && groups[1] != nullptr);
  absl::StatusOr<std::shared_ptr<std::timed_mutex>> calls =
      internal::NcclCallsLockForTesting(*groups[0]);
  ASSERT_TRUE(calls.ok()) << calls.status();
  // A first call on both, waited for: NCCL has connected (with
  // NCCL_RUNTIME_CONNECT=1 a first call's enqueue would return in progress,
  // completed only by a poll under the lock) and the workers are running.
  {
    Tensor t0 = Tensor::Full({1}, 1.0, Dtype::kF32, Device::Cuda(0));
    Tensor t1 = Tensor::Full({1}, 1.0, Dtype::kF32, Device::Cuda(1));
    WorkPtr w0 = groups[0]->AllReduce(t0, ReduceOp::kSum);
    WorkPtr w1 = groups[1]->AllReduce(t1, ReduceOp::kSum);
    const absl::Status s0 = w0->Wait(), s1 = w1->Wait();
    ASSERT_TRUE(s0.ok() && s1.ok()) << s0 << "; " << s1;
  }
  // Rank 0's call must be enqueued before the lock is taken (else it waits
  // for the lock, and rank 1's call for it): tried again, with a longer
  // wait, when it was not.
  absl::Duration enqueue_wait = absl::Milliseconds(100);
  for (int attempt = 0; attempt < 3; ++attempt, enqueue_wait *= 4) {
    Tensor t0 = Tensor::Full({4}, 1.0, Dtype::kF32, Device::Cuda(0));
    Tensor t1 = Tensor::Full({4}, 2.0, Dtype::kF32, Device::Cuda(1));
    WorkPtr w0 = groups[0]->AllReduce(t0, ReduceOp::kSum);
    absl::SleepFor(enqueue_wait);  // rank 0's worker enqueues its part
    std::unique_lock<std::timed_mutex> held(**calls);
    WorkPtr w1 = groups[1]->AllReduce(t1, ReduceOp::kSum);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!w1->IsCompleted() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    if (!w1->IsCompleted()) {
      held.unlock();
      const absl::Status s0 = w0->Wait(), s1 = w1->Wait();
      ASSERT_TRUE(s0.ok() && s1.ok()) << s0 << "; " << s1;
      continue;
    }
    const absl::Status s1 = w1->Wait();  // both ranks' kernels have run
    ASSERT_TRUE(s1.ok()) << s1;
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_FALSE(w0->IsCompleted()) << "finished without NCCL's error read";
    held.unlock();
    const absl::Status s0 = w0->Wait();
    ASSERT_TRUE(s0.ok()) << s0;
    EXPECT_EQ(t0.ToVector<float>(), std::vector<float>(4, 3.0f));
    return;
  }
  FAIL() << "rank 0's call was not enqueued before the lock was taken, 3 times";
}

}  // namespace
}  // namespace dist
