// Tests of how the threads engine fails: timeouts that name the missing
// ranks, mismatched and invalid calls, and peers that leave (return, throw,
// destroy their handle) making the others fail promptly instead of hanging.
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "dist/thread_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Tensor;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Generous bound on how long a prompt failure may take (sanitizers are slow).
constexpr absl::Duration kPrompt = absl::Seconds(5);

// Waits until `count` reaches `target` (at most 30 s, so a bug cannot hang).
void WaitForCount(const std::atomic<int>& count, int target) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (count.load() < target && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
}

TEST(ThreadGroupFailureTest, TimeoutNamesTheMissingRank) {
  const absl::Duration timeout = absl::Milliseconds(500);
  std::vector<absl::Status> statuses(4);
  std::vector<absl::Duration> elapsed(4);
  std::atomic<int> failed{0};
  absl::Status late;
  absl::Duration late_elapsed;
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) {
    if (rank == 2) {
      // Skips the all-reduce but stays alive until the others have failed;
      // then its own next call fails at once: the group is aborted.
      WaitForCount(failed, 3);
      const absl::Time start = absl::Now();
      late = pg.BarrierSync();
      late_elapsed = absl::Now() - start;
      return;
    }
    Tensor x = Tensor::Full({8}, 1.0);
    const absl::Time start = absl::Now();
    statuses[rank] = pg.AllReduceSync(x, ReduceOp::kSum, CollectiveOptions::WithTimeout(timeout));
    elapsed[rank] = absl::Now() - start;
    failed.fetch_add(1);
  });
  ASSERT_TRUE(status.ok()) << status;
  int timed_out_here = 0;
  for (int r : {0, 1, 3}) {
    SCOPED_TRACE(absl::StrCat("rank ", r, ": ", statuses[r].ToString()));
    EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[r]));
    const std::string message(statuses[r].message());
    EXPECT_THAT(message, StartsWith(absl::StrCat("[all_reduce] rank ", r, " of 4")));
    EXPECT_THAT(message, HasSubstr("timed out after 0.5 s waiting for rank 2"));
    if (message ==
        absl::StrCat("[all_reduce] rank ", r, " of 4 timed out after 0.5 s waiting for rank 2")) {
      ++timed_out_here;
      EXPECT_GE(elapsed[r], timeout - absl::Milliseconds(5));
    }
    EXPECT_LT(elapsed[r], timeout + kPrompt);
  }
  EXPECT_GE(timed_out_here, 1);  // the rank whose deadline came first
  EXPECT_TRUE(absl::IsDeadlineExceeded(late)) << late;
  EXPECT_THAT(std::string(late.message()),
              StartsWith("[barrier] rank 2 of 4: the group was aborted: rank "));
  EXPECT_THAT(std::string(late.message()), HasSubstr("waiting for rank 2 in all_reduce (call #0)"));
  EXPECT_LT(late_elapsed, kPrompt);
}

TEST(ThreadGroupFailureTest, TimeoutMessageExactly) {
  absl::Notification rank0_failed;
  absl::Status status0;
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      rank0_failed.WaitForNotificationWithTimeout(absl::Seconds(30));
      return;
    }
    Tensor x = Tensor::Full({3}, 1.0);
    status0 = pg.AllReduceSync(x, ReduceOp::kSum,
                               CollectiveOptions::WithTimeout(absl::Milliseconds(500)));
    rank0_failed.Notify();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(status0, absl::DeadlineExceededError(
                         "[all_reduce] rank 0 of 2 timed out after 0.5 s waiting for rank 1"));
}

TEST(ThreadGroupFailureTest, TimeoutNamesSeveralMissingRanksAndUsesTheGroupTimeout) {
  ThreadWorldOptions options;
  options.timeout = absl::Seconds(2);
  std::atomic<int> failed{0};
  std::vector<absl::Status> statuses(4);
  absl::Status status = RunRanks(
      4,
      [&](int rank, ProcessGroup& pg) {
        EXPECT_EQ(pg.timeout(), absl::Seconds(2));
        if (rank >= 2) {
          WaitForCount(failed, 2);
          return;
        }
        if (rank == 1) pg.set_timeout(absl::Milliseconds(250));
        statuses[rank] = pg.BarrierSync();
        failed.fetch_add(1);
      },
      options);
  ASSERT_TRUE(status.ok()) << status;
  for (int r : {0, 1}) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("waiting for ranks 2, 3"));
  }
  // Rank 1's deadline (0.25 s) comes long before rank 0's (2 s).
  EXPECT_THAT(statuses[0].ToString() + statuses[1].ToString(),
              HasSubstr("rank 1 of 4 timed out after 0.25 s waiting for ranks 2, 3"));
}

TEST(ThreadGroupFailureTest, TimeoutInSubgroupNamesGroupAndWorldRanks) {
  absl::Notification done;
  absl::Status status2;
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) -> absl::Status {
    auto sub = pg.Split(rank % 2);
    if (!sub.ok()) return sub.status();
    if (rank == 2) {
      status2 = (*sub)->BarrierSync(CollectiveOptions::WithTimeout(absl::Milliseconds(300)));
      done.Notify();
    } else if (rank == 0) {
      done.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(status2.message(),
            "[barrier] rank 1 of 2 in group world/split0/color0 timed out after 0.3 s waiting for "
            "rank 0 (world 0)");
}

TEST(ThreadGroupFailureTest, MismatchedSizesFailOnEveryRankAndTheGroupStaysUsable) {
  std::vector<absl::Status> statuses(3);
  std::vector<float> after(3);
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup& pg) -> absl::Status {
    Tensor x = Tensor::Full({rank == 1 ? 12 : 10}, 1.0);
    statuses[rank] = pg.AllReduceSync(x);
    // The calls were counted alike on every rank, so the group goes on.
    Tensor y = Tensor::Full({4}, rank);
    if (absl::Status s = pg.AllReduceSync(y); !s.ok()) return s;
    after[rank] = y.ToVector<float>()[0];
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(statuses[r])) << statuses[r];
    EXPECT_EQ(statuses[r].message(), absl::StrCat("[all_reduce] rank ", r,
                                                  " of 3: the calls do not match across ranks: "
                                                  "rank 0: all_reduce(sum, f32, 10 elements); "
                                                  "rank 1: all_reduce(sum, f32, 12 elements); "
                                                  "rank 2: all_reduce(sum, f32, 10 elements)"));
    EXPECT_EQ(after[r], 3.0f);
  }
}

TEST(ThreadGroupFailureTest, MismatchedOpsAndDtypesAreReported) {
  std::vector<absl::Status> statuses(2), dtypes(2);
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    Tensor x = Tensor::Full({6}, 1.0);
    statuses[rank] = rank == 0 ? pg.AllReduceSync(x, ReduceOp::kMax) : pg.BroadcastSync(x, 1);
    Tensor y = Tensor::Full({6}, 1.0, rank == 0 ? tensor::Dtype::kF32 : tensor::Dtype::kBF16);
    dtypes[rank] = pg.AllReduceSync(y);
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 0: all_reduce(max, f32, 6 elements); "
                          "rank 1: broadcast(root 1, f32, 6 elements)"));
    EXPECT_THAT(std::string(dtypes[r].message()),
                HasSubstr("rank 0: all_reduce(sum, f32, 6 elements); "
                          "rank 1: all_reduce(sum, bf16, 6 elements)"));
  }
}

TEST(ThreadGroupFailureTest, InvalidCallOnOneRankFailsThePeersPromptly) {
  std::vector<absl::Status> statuses(2);
  std::vector<absl::Duration> elapsed(2);
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    Tensor input = Tensor::Full({8}, 1.0);
    Tensor output = Tensor::Empty({rank == 1 ? 3 : 4});
    const absl::Time start = absl::Now();
    statuses[rank] = pg.ReduceScatterSync(input, output, ReduceOp::kSum,
                                          CollectiveOptions::WithTimeout(absl::Seconds(60)));
    elapsed[rank] = absl::Now() - start;
  });
  ASSERT_TRUE(status.ok()) << status;
  const std::string own =
      "[reduce_scatter] rank 1 of 2: output has 3 elements, expected input "
      "8 / group size 2 = 4";
  EXPECT_EQ(statuses[1], absl::InvalidArgumentError(own));
  EXPECT_EQ(statuses[0], absl::InvalidArgumentError(absl::StrCat(
                             "[reduce_scatter] rank 0 of 2: rank 1's call is invalid: ", own)));
  EXPECT_LT(elapsed[0], kPrompt);
}

TEST(ThreadGroupFailureTest, InvalidArguments) {
  std::vector<std::vector<std::string>> messages(3);
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup& pg) {
    auto record = [&](const absl::Status& s) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      messages[rank].push_back(std::string(s.message()));
    };
    // Reduce-scatter needs a size divisible by the group size.
    record(pg.ReduceScatterSync(Tensor::Empty({10}), Tensor::Empty({3})));
    record(pg.AllReduceSync(Tensor::Full({2}, 1.0, tensor::Dtype::kI32), ReduceOp::kAvg));
    record(pg.AllGatherSync(Tensor::Empty({2}), Tensor::Empty({5})));
    record(pg.AllGatherSync(Tensor::Empty({2}), Tensor::Empty({6}, tensor::Dtype::kBF16)));
    record(pg.BroadcastSync(Tensor::Empty({2}), 3));
    record(pg.AllReduceSync(Tensor()));
    // In place, but at another rank's chunk.
    Tensor out = Tensor::Zeros({6});
    record(pg.AllGatherSync(out.Narrow(0, ((rank + 1) % 3) * 2, 2), out));
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(messages[r].size(), 7u);
    const std::string who = absl::StrCat("rank ", r, " of 3: ");
    EXPECT_EQ(messages[r][0], absl::StrCat("[reduce_scatter] ", who,
                                           "input has 10 elements, not divisible by the group "
                                           "size 3"));
    EXPECT_EQ(messages[r][1],
              absl::StrCat("[all_reduce] ", who, "avg needs a floating-point dtype, got i32"));
    EXPECT_EQ(messages[r][2], absl::StrCat("[all_gather] ", who,
                                           "output has 5 elements, expected group size 3 x "
                                           "input 2 = 6"));
    EXPECT_EQ(messages[r][3],
              absl::StrCat("[all_gather] ", who, "input dtype f32 differs from output dtype bf16"));
    EXPECT_EQ(messages[r][4],
              absl::StrCat("[broadcast] ", who, "root 3 is not a rank of a group of size 3"));
    EXPECT_EQ(messages[r][5], absl::StrCat("[all_reduce] ", who, "the tensor is undefined"));
    EXPECT_EQ(messages[r][6], absl::StrCat("[all_gather] ", who,
                                           "input and output overlap other than at this "
                                           "rank's chunk"));
  }
}

TEST(ThreadGroupFailureTest, PeerThatReturnsEarlyFailsTheOthersPromptly) {
  std::vector<absl::Status> statuses(3);
  std::vector<absl::Duration> elapsed(3);
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup& pg) -> absl::Status {
    if (rank == 2) return absl::OkStatus();  // Leaves without the all-reduce.
    Tensor x = Tensor::Full({4}, 1.0);
    const absl::Time start = absl::Now();
    statuses[rank] = pg.AllReduceSync(x, ReduceOp::kSum,
                                      CollectiveOptions::WithTimeout(absl::InfiniteDuration()));
    elapsed[rank] = absl::Now() - start;
    return statuses[rank];
  });
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("rank "));
  for (int r : {0, 1}) {
    EXPECT_TRUE(absl::IsAborted(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 2 will never join all_reduce (call #0): rank 2's thread "
                          "finished without making this call"));
    EXPECT_LT(elapsed[r], kPrompt);
  }
}

TEST(ThreadGroupFailureTest, PeerThatThrowsFailsTheOthersAndRunRanksNamesIt) {
  std::vector<absl::Status> statuses(3);
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup& pg) {
    if (rank == 1) throw std::runtime_error("boom");
    Tensor x = Tensor::Full({4}, 1.0);
    statuses[rank] = pg.AllReduceSync(x);  // the default timeout: 300 s
  });
  EXPECT_TRUE(absl::IsInternal(status)) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("rank 1: uncaught exception: boom"));
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::IsAborted(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 1's thread failed (INTERNAL: uncaught exception: boom)"));
  }
}

// A collective's failure thrown through ops (tensor::StatusError, as FSDP's
// units throw one) keeps its code: a timeout is DeadlineExceeded, not the
// InvalidArgument of an op's bad input (OpError), which train exits 2 on.
TEST(ThreadGroupFailureTest, AThrownStatusKeepsItsCode) {
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    if (rank == 1) {
      tensor::ThrowIfError(absl::DeadlineExceededError("timed out"), "fsdp", "unit 'a' all_gather");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              StartsWith("rank 1: [fsdp] unit 'a' all_gather: DEADLINE_EXCEEDED: timed out"));
  status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    if (rank == 1) tensor::ThrowOpError("matmul", "shapes differ");
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  // A collective's tensors that do not match a peer's: the program's fault
  // (Internal), not a bad command line (InvalidArgument: exit 2).
  status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    if (rank == 1) {
      tensor::ThrowIfError(absl::InvalidArgumentError("shapes differ"), "fsdp", "all_gather");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsInternal(status)) << status;
}

TEST(ThreadGroupFailureTest, QueuedWorkOfAFinishedRankStillRuns) {
  std::vector<float> result(2);
  absl::Status second;
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    Tensor x = Tensor::Full({4}, rank + 1.0);
    if (rank == 1) {
      // Issues and leaves without waiting; the engine keeps x alive and runs it.
      WorkPtr ignored = pg.AllReduce(x);
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
    if (absl::Status s = pg.AllReduceSync(x); !s.ok()) return s;
    result[0] = x.ToVector<float>()[0];
    second = pg.BarrierSync();  // rank 1 is gone for good now
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(result[0], 3.0f);
  EXPECT_TRUE(absl::IsAborted(second)) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("rank 1's thread finished"));
}

TEST(ThreadGroupFailureTest, DestroyedSubgroupHandleFailsThePeersPromptly) {
  absl::Notification rank0_done;
  absl::Status status0;
  absl::Duration elapsed;
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    auto sub = pg.Split(0);
    if (!sub.ok()) return sub.status();
    if (rank == 1) {
      sub->reset();
      rank0_done.WaitForNotificationWithTimeout(absl::Seconds(30));
      return absl::OkStatus();
    }
    const absl::Time start = absl::Now();
    status0 = (*sub)->AllReduceSync(Tensor::Full({2}, 1.0));
    elapsed = absl::Now() - start;
    rank0_done.Notify();
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(absl::IsAborted(status0)) << status0;
  EXPECT_THAT(std::string(status0.message()),
              HasSubstr("rank 1 destroyed its handle of the group"));
  EXPECT_LT(elapsed, kPrompt);
}

TEST(ThreadGroupFailureTest, RunRanksReportsEveryFailedRank) {
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup&) -> absl::Status {
    if (rank == 2) return absl::NotFoundError("no data for rank 2");
    if (rank == 0) {
      absl::SleepFor(absl::Milliseconds(200));  // fails second
      return absl::OutOfRangeError("late");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_EQ(status.message(), "rank 2: no data for rank 2 [then: rank 0: OUT_OF_RANGE: late]");
  // The same failure on several ranks (a check every rank makes): named once.
  status = RunRanks(4, [&](int rank, ProcessGroup&) -> absl::Status {
    if (rank != 2) absl::SleepFor(absl::Milliseconds(100));  // rank 2 first
    return rank == 3 ? absl::OutOfRangeError("other") : absl::InvalidArgumentError("bad flag");
  });
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(status.message(),
            "rank 2: bad flag [then: ranks 0, 1: the same; rank 3: OUT_OF_RANGE: other]");
  // Ranks alike after a first that differs: named together too.
  status = RunRanks(4, [&](int rank, ProcessGroup&) -> absl::Status {
    if (rank != 2) absl::SleepFor(absl::Milliseconds(100));
    return rank == 2 ? absl::NotFoundError("first") : absl::AbortedError("lost a peer");
  });
  EXPECT_EQ(status.message(), "rank 2: first [then: ranks 0, 1, 3: ABORTED: lost a peer]");
}

TEST(ThreadGroupFailureTest, EscapedTensorsOutliveTheWorldSafely) {
  // A tensor allocated by a rank and kept after the world is gone: its ledger
  // is kept alive, so freeing the tensor later is safe (checked by ASan).
  std::vector<Tensor> kept(2);
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    kept[rank] = Tensor::Full({16}, rank);
    return pg.AllReduceSync(kept[rank]);
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(kept[1].ToVector<float>()[0], 1.0f);
  kept.clear();
}

}  // namespace
}  // namespace dist
