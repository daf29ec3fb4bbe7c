// Tests of the nccl engine's call thread without a GPU: fake calls stand in
// for NCCL kernels (a loopback "collective" finishes once every rank started
// it), so ordering, timeouts counted from the oldest call, the missing-rank
// report through a HashStore, aborts and the broken state are all exercised;
// plus the tensor rules of NCCL calls. The launch order shared by a family of
// groups and the peers' departures: nccl_worker_peers_test.cc.
#include "dist/nccl_worker.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/nccl_worker_testing.h"
#include "dist/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace dist {
namespace nccl {
namespace {

using nccl::testing::FakeCall;
using nccl::testing::Loopback;
using tensor::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(PollUntilTest, BacksOffAndStopsWhenDone) {
  absl::Time now = absl::UnixEpoch();
  std::vector<absl::Duration> sleeps;
  Clock clock{[&] { return now; },
              [&](absl::Duration d) {
                sleeps.push_back(d);
                now += d;
              }};
  int polls = 0;
  absl::StatusOr<bool> done = PollUntil([&]() -> absl::StatusOr<bool> { return ++polls == 4; },
                                        now + absl::Seconds(1), clock, absl::Microseconds(4));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(polls, 4);
  EXPECT_THAT(sleeps,
              ElementsAre(absl::Microseconds(1), absl::Microseconds(2), absl::Microseconds(4)));
}

TEST(PollUntilTest, GivesUpAtTheDeadlineWithoutOvershooting) {
  absl::Time now = absl::UnixEpoch();
  const absl::Time deadline = now + absl::Microseconds(10);
  std::vector<absl::Duration> sleeps;
  Clock clock{[&] { return now; },
              [&](absl::Duration d) {
                sleeps.push_back(d);
                now += d;
              }};
  int polls = 0;
  absl::StatusOr<bool> done = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        ++polls;
        return false;
      },
      deadline, clock, absl::Microseconds(4));
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  EXPECT_EQ(now, deadline);
  EXPECT_EQ(polls, 5);  // at 0, 1, 3, 7 and 10 us: once more at the deadline
  EXPECT_THAT(sleeps, ElementsAre(absl::Microseconds(1), absl::Microseconds(2),
                                  absl::Microseconds(4), absl::Microseconds(3)));
}

TEST(PollUntilTest, ErrorsEndThePoll) {
  int polls = 0;
  absl::StatusOr<bool> done = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        if (++polls == 2) return absl::AbortedError("peer died");
        return false;
      },
      absl::InfiniteFuture());
  EXPECT_EQ(done.status(), absl::AbortedError("peer died"));
  EXPECT_EQ(polls, 2);
}

TEST(CallWorkerTest, StartsInOrderOnItsThreadAndCompletes) {
  std::mutex mu;
  std::vector<int> order;
  std::thread::id worker_thread;
  std::atomic<bool> wrong_thread{false};
  CallWorkerOptions options;
  options.on_thread_start = [&] { worker_thread = std::this_thread::get_id(); };
  std::vector<WorkPtr> works;
  {
    CallWorker worker(options);
    for (int i = 0; i < 5; ++i) {
      auto call = std::make_shared<FakeCall>();
      call->start = [&, i] {
        if (std::this_thread::get_id() != worker_thread) wrong_thread = true;
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
        return absl::OkStatus();
      };
      works.push_back(worker.Submit("all_reduce", absl::Seconds(30), call));
    }
    EXPECT_EQ(worker.submitted(), 5);
    for (const WorkPtr& work : works) EXPECT_TRUE(work->Wait().ok());
    EXPECT_TRUE(worker.broken().ok());
  }
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_FALSE(wrong_thread.load());
}

// One worker per rank of `size`, reporting progress to `store` under
// `prefix` (waiting 0.5 s for the others' reports); aborts[rank] counts the
// aborts of that rank's communicator.
std::vector<std::unique_ptr<CallWorker>> Workers(int size, HashStore& store,
                                                 const std::string& prefix,
                                                 std::vector<std::atomic<int>>& aborts) {
  std::vector<std::unique_ptr<CallWorker>> workers;
  for (int rank = 0; rank < size; ++rank) {
    CallWorkerOptions options;
    options.rank = rank;
    options.size = size;
    options.store = &store;
    options.prefix = prefix;
    options.report_wait = absl::Milliseconds(500);
    options.abort = [&aborts, rank] { aborts[rank].fetch_add(1); };
    workers.push_back(std::make_unique<CallWorker>(options));
  }
  return workers;
}

TEST(CallWorkerTest, TimeoutNamesTheRankThatNeverIssuedTheCall) {
  constexpr int kSize = 3;
  HashStore store;
  Loopback loopback(kSize);
  std::vector<std::atomic<int>> aborts(kSize);
  std::vector<std::unique_ptr<CallWorker>> workers = Workers(kSize, store, "lb", aborts);
  const absl::Duration timeout = absl::Milliseconds(300);
  std::vector<WorkPtr> first(kSize);
  std::vector<WorkPtr> second(kSize);
  for (int rank = 0; rank < kSize; ++rank) {
    first[rank] = workers[rank]->Submit("all_reduce", timeout, loopback.Call(0));
    // Rank 2 never issues call #1.
    if (rank != 2) second[rank] = workers[rank]->Submit("all_reduce", timeout, loopback.Call(1));
  }
  for (int rank = 0; rank < kSize; ++rank) EXPECT_TRUE(first[rank]->Wait().ok()) << rank;
  for (int rank : {0, 1}) {
    const absl::Status status = second[rank]->Wait();
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_EQ(status.message(),
              absl::StrCat("[all_reduce] rank ", rank,
                           " of 3 timed out after 0.3 s waiting for rank 2 (call #1 of this rank; "
                           "rank 2 sent no report within 0.5 s: exited, hung, or busy outside "
                           "this group)"));
    EXPECT_EQ(aborts[rank].load(), 1);
    EXPECT_EQ(store.Get(absl::StrCat("lb/seq/", rank)).value(), "2");
    // The group is unusable: later calls fail at once with that error.
    const absl::Time start = absl::Now();
    const absl::Status later = workers[rank]->Submit("barrier", timeout, loopback.Call(2))->Wait();
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
    EXPECT_TRUE(absl::IsDeadlineExceeded(later)) << later;
    EXPECT_THAT(std::string(later.message()),
                StartsWith(absl::StrCat("[barrier] rank ", rank,
                                        " of 3: the group is unusable after an earlier failure: "
                                        "[all_reduce] rank ",
                                        rank, " of 3 timed out after 0.3 s waiting for rank 2")));
  }
  EXPECT_EQ(aborts[2].load(), 0);
  EXPECT_TRUE(workers[2]->broken().ok());
}

// A call rank 1 refuses (bad arguments) would leave its next call to pair
// with the peers' refused one: once its earlier call finished, the refusal
// publishes its count and breaks its group; rank 0's call times out naming
// rank 1, and rank 1's later calls fail naming the refusal.
TEST(CallWorkerTest, ARefusedCallBreaksTheGroupAfterTheCallsBeforeIt) {
  constexpr int kSize = 2;
  HashStore store;
  Loopback loopback(kSize);
  std::vector<std::atomic<int>> aborts(kSize);
  std::vector<std::unique_ptr<CallWorker>> workers = Workers(kSize, store, "rf", aborts);
  const absl::Duration timeout = absl::Milliseconds(300);
  const absl::Status refusal =
      absl::InvalidArgumentError("[all_reduce] rank 1 of 2: the tensor is on cpu");
  // Rank 1's call #0 starts only when rank 0's does; its refusal waits for it.
  const WorkPtr first1 = workers[1]->Submit("all_gather", timeout, loopback.Call(0));
  const WorkPtr refused = workers[1]->Refuse("all_reduce", timeout, refusal);
  const WorkPtr later1 = workers[1]->Submit("barrier", timeout, loopback.Call(2));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(aborts[1].load(), 0);
  const WorkPtr first0 = workers[0]->Submit("all_gather", timeout, loopback.Call(0));
  const WorkPtr second0 = workers[0]->Submit("all_reduce", timeout, loopback.Call(1));
  EXPECT_TRUE(first0->Wait().ok());
  EXPECT_TRUE(first1->Wait().ok());
  EXPECT_EQ(refused->Wait(), refusal);
  const absl::Status later = later1->Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(later)) << later;
  EXPECT_EQ(later.message(),
            "[barrier] rank 1 of 2: the group is unusable after an earlier failure: "
            "[all_reduce] rank 1 of 2: the tensor is on cpu");
  EXPECT_EQ(aborts[1].load(), 1);
  EXPECT_EQ(store.Get("rf/seq/1").value(), "1");
  const absl::Status waited = second0->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_EQ(waited.message(),
            "[all_reduce] rank 0 of 2 timed out after 0.3 s waiting for rank 1 (call #1 of this "
            "rank; rank 1 had issued 1 call)");
  // In a group of one there is no peer to fall out of step with.
  CallWorker alone{CallWorkerOptions()};
  EXPECT_EQ(alone.Refuse("all_reduce", timeout, refusal)->Wait(), refusal);
  EXPECT_TRUE(alone.broken().ok());
}

TEST(CallWorkerTest, TimeoutCountsFromWhenTheCallBecameTheOldest) {
  CallWorker worker{CallWorkerOptions()};
  const absl::Time first_done = absl::Now() + absl::Milliseconds(400);
  auto first = std::make_shared<FakeCall>();
  first->finished = [first_done]() -> absl::StatusOr<bool> { return absl::Now() >= first_done; };
  auto second = std::make_shared<FakeCall>();
  second->finished = [first_done]() -> absl::StatusOr<bool> {
    return absl::Now() >= first_done + absl::Milliseconds(50);
  };
  WorkPtr a = worker.Submit("all_gather", absl::Seconds(30), first);
  // Finishes 0.45 s after it was issued, with a 0.25 s timeout: fine, since
  // it waited 0.4 s behind the first call.
  WorkPtr b = worker.Submit("all_gather", absl::Milliseconds(250), second);
  EXPECT_TRUE(a->Wait().ok());
  EXPECT_TRUE(b->Wait().ok());
}

TEST(CallWorkerTest, SlowCallTimesOutAfterTheOneBeforeIt) {
  std::atomic<int> aborts{0};
  CallWorkerOptions options;
  options.abort = [&] { aborts.fetch_add(1); };
  CallWorker worker(options);
  const absl::Time first_done = absl::Now() + absl::Milliseconds(200);
  auto first = std::make_shared<FakeCall>();
  first->finished = [first_done]() -> absl::StatusOr<bool> { return absl::Now() >= first_done; };
  auto never = std::make_shared<FakeCall>();
  never->finished = []() -> absl::StatusOr<bool> { return false; };
  WorkPtr a = worker.Submit("all_reduce", absl::Seconds(30), first);
  WorkPtr b = worker.Submit("broadcast", absl::Milliseconds(250), never);
  EXPECT_TRUE(a->Wait().ok());
  const absl::Status status = b->Wait();
  EXPECT_GE(absl::Now(), first_done + absl::Milliseconds(245));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_EQ(status.message(),
            "[broadcast] rank 0 of 1 timed out after 0.25 s waiting for the call to finish (call "
            "#1: the device never finished it)");
  EXPECT_EQ(aborts.load(), 1);
}

TEST(CallWorkerTest, AnErrorBreaksTheGroupAndNothingRunsAfterTheAbort) {
  std::atomic<bool> aborted{false};
  std::atomic<bool> touched_after_abort{false};
  std::atomic<int> aborts{0};
  CallWorkerOptions options;
  options.abort = [&] {
    aborts.fetch_add(1);
    aborted = true;
  };
  CallWorker worker(options);
  auto guard = [&] {
    if (aborted.load()) touched_after_abort = true;
  };
  const absl::Time fail_at = absl::Now() + absl::Milliseconds(100);
  auto failing = std::make_shared<FakeCall>();
  failing->finished = [&, fail_at]() -> absl::StatusOr<bool> {
    guard();
    if (absl::Now() >= fail_at) return absl::InternalError("boom");
    return false;
  };
  std::vector<WorkPtr> works = {worker.Submit("all_reduce", absl::Seconds(30), failing)};
  for (int i = 0; i < 2; ++i) {
    auto pending = std::make_shared<FakeCall>();
    pending->start = [&] {
      guard();
      return absl::OkStatus();
    };
    pending->finished = [&]() -> absl::StatusOr<bool> {
      guard();
      return false;
    };
    works.push_back(worker.Submit("broadcast", absl::Seconds(30), pending));
  }
  const absl::Status first = works[0]->Wait();
  EXPECT_EQ(first, absl::InternalError("[all_reduce] rank 0 of 1: boom"));
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(works[i]->Wait(),
              absl::InternalError("[broadcast] rank 0 of 1: the group is unusable after an "
                                  "earlier failure: [all_reduce] rank 0 of 1: boom"));
  }
  auto late = std::make_shared<FakeCall>();
  std::atomic<bool> late_started{false};
  late->start = [&] {
    late_started = true;
    return absl::OkStatus();
  };
  EXPECT_EQ(worker.Submit("barrier", absl::Seconds(30), late)->Wait(),
            absl::InternalError("[barrier] rank 0 of 1: the group is unusable after an earlier "
                                "failure: [all_reduce] rank 0 of 1: boom"));
  EXPECT_EQ(worker.broken(), absl::InternalError("[all_reduce] rank 0 of 1: boom"));
  EXPECT_FALSE(late_started.load());
  EXPECT_FALSE(touched_after_abort.load());
  EXPECT_EQ(aborts.load(), 1);
}

// RunWithin (what bounds NCCL's aborts: the worker's, and ~Comm's after a
// finalize that timed out): true once fn returned in time; false after about
// the limit when it did not, fn left running on its own thread.
TEST(RunWithinTest, SaysWhetherTheFunctionReturnedInTime) {
  std::atomic<bool> ran{false};
  EXPECT_TRUE(RunWithin([&] { ran = true; }, absl::Seconds(10)));
  EXPECT_TRUE(ran.load());
  ran = false;
  EXPECT_TRUE(RunWithin([&] { ran = true; }, absl::InfiniteDuration()));
  EXPECT_TRUE(ran.load());

  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto returned = std::make_shared<std::atomic<bool>>(false);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(RunWithin(
      [released, returned] {
        released.wait();
        *returned = true;
      },
      absl::Milliseconds(200)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(195));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_FALSE(returned->load());
  release->set_value();  // the left thread finishes on its own
  for (int i = 0; i < 2000 && !returned->load(); ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(returned->load());
}

// NCCL's abort may itself hang (a peer's process gone mid-call): past
// abort_timeout the calls fail anyway, saying so, their buffers go to
// `abandon` to be kept, and the worker can be destroyed while the abort still
// runs.
TEST(CallWorkerTest, AnAbortThatDoesNotReturnStillFailsTheCalls) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;  // Guarded by mu.
  std::atomic<bool> abort_returned{false};
  std::atomic<int> abandons{0};
  std::vector<std::shared_ptr<PendingCall>> kept;
  {
    CallWorkerOptions options;
    options.abort_timeout = absl::Milliseconds(200);
    options.abort = [&] {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return release; });
      }
      abort_returned = true;  // the last use of the test's locals
    };
    options.abandon = [&](std::vector<std::shared_ptr<PendingCall>> calls) {
      abandons.fetch_add(1);
      kept = std::move(calls);
    };
    CallWorker worker(options);
    std::atomic<bool> second_started{false};
    auto failing = std::make_shared<FakeCall>();
    failing->finished = [&]() -> absl::StatusOr<bool> {
      if (second_started.load()) return absl::InternalError("boom");
      return false;
    };
    auto pending = std::make_shared<FakeCall>();
    pending->start = [&] {
      second_started = true;
      return absl::OkStatus();
    };
    pending->finished = []() -> absl::StatusOr<bool> { return false; };
    const absl::Time start = absl::Now();
    WorkPtr a = worker.Submit("all_reduce", absl::Seconds(30), failing);
    WorkPtr b = worker.Submit("broadcast", absl::Seconds(30), pending);
    const absl::Status first = a->Wait();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(195));
    EXPECT_EQ(first, absl::InternalError("[all_reduce] rank 0 of 1: boom (then the "
                                         "communicator's abort did not return within 200ms: "
                                         "its buffers stay allocated; this process should "
                                         "exit)"));
    EXPECT_THAT(std::string(b->Wait().message()), HasSubstr("abort did not return within"));
    const WorkPtr later =
        worker.Submit("barrier", absl::Seconds(30), std::make_shared<FakeCall>());
    EXPECT_THAT(std::string(later->Wait().message()),
                HasSubstr("unusable after an earlier failure: [all_reduce] rank 0 of 1: boom "
                          "(then the communicator's abort did not return"));
    EXPECT_EQ(abandons.load(), 1);
    EXPECT_EQ(kept.size(), 2u);  // both calls' buffers, kept
    EXPECT_FALSE(abort_returned.load());
  }  // the worker goes while its abort still runs
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  for (int i = 0; i < 500 && !abort_returned.load(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(abort_returned.load());
}

TEST(CallWorkerTest, StartErrorsAndEnqueueTimeoutsFailTheCall) {
  {
    CallWorker worker{CallWorkerOptions()};
    auto bad = std::make_shared<FakeCall>();
    bad->start = [] { return absl::InvalidArgumentError("ncclAllReduce: invalid argument"); };
    EXPECT_EQ(
        worker.Submit("all_reduce", absl::Seconds(30), bad)->Wait(),
        absl::InvalidArgumentError("[all_reduce] rank 0 of 1: ncclAllReduce: invalid argument"));
  }
  {
    CallWorker worker{CallWorkerOptions()};
    auto stuck = std::make_shared<FakeCall>();
    stuck->enqueued = []() -> absl::StatusOr<bool> { return false; };
    const absl::Time start = absl::Now();
    const absl::Status status =
        worker.Submit("reduce_scatter", absl::Milliseconds(100), stuck)->Wait();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                StartsWith("[reduce_scatter] rank 0 of 1 timed out after 0.1 s"));
  }
}

TEST(CallWorkerTest, IdleCallsStartAfterEveryEarlierCallFinished) {
  CallWorker worker{CallWorkerOptions()};
  std::atomic<bool> first_finished{false};
  std::atomic<bool> split_saw_first_finished{false};
  const absl::Time first_done = absl::Now() + absl::Milliseconds(100);
  auto first = std::make_shared<FakeCall>();
  first->finished = [&, first_done]() -> absl::StatusOr<bool> {
    if (absl::Now() < first_done) return false;
    first_finished = true;
    return true;
  };
  auto split = std::make_shared<FakeCall>();
  split->needs_idle = true;
  split->start = [&] {
    split_saw_first_finished = first_finished.load();
    return absl::OkStatus();
  };
  WorkPtr a = worker.Submit("all_reduce", absl::Seconds(30), first);
  WorkPtr b = worker.Submit("split", absl::Seconds(30), split);
  EXPECT_TRUE(a->Wait().ok());
  EXPECT_TRUE(b->Wait().ok());
  EXPECT_TRUE(split_saw_first_finished.load());
}

TEST(CallWorkerTest, DestructionLetsCallsFinish) {
  WorkPtr work;
  {
    CallWorker worker{CallWorkerOptions()};
    const absl::Time done = absl::Now() + absl::Milliseconds(100);
    auto call = std::make_shared<FakeCall>();
    call->finished = [done]() -> absl::StatusOr<bool> { return absl::Now() >= done; };
    work = worker.Submit("all_reduce", absl::Seconds(30), call);
  }
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(work->Wait().ok());
}

CollectiveCall MakeCall(CollectiveKind kind, Tensor input, Tensor output = Tensor()) {
  CollectiveCall call;
  call.kind = kind;
  call.input = std::move(input);
  call.output = std::move(output);
  return call;
}

TEST(CheckNcclTensorsTest, DeviceMustBeTheGroups) {
  const tensor::Device gpu = tensor::Device::Cuda(0);
  Tensor x = Tensor::Empty({8});
  absl::Status s = CheckNcclTensors(MakeCall(CollectiveKind::kAllReduce, x), gpu, 0, 1);
  EXPECT_EQ(s, absl::InvalidArgumentError("[all_reduce] rank 0 of 1: the tensor is on cpu; the "
                                          "nccl group of rank 0 uses cuda:0"));
  s = CheckNcclTensors(MakeCall(CollectiveKind::kAllGather, Tensor::Empty({2}), x), gpu, 1, 4);
  EXPECT_EQ(s, absl::InvalidArgumentError("[all_gather] rank 1 of 4: the input tensor is on cpu; "
                                          "the nccl group of rank 1 uses cuda:0"));
  EXPECT_TRUE(CheckNcclTensors(MakeCall(CollectiveKind::kBarrier, Tensor()), gpu, 0, 1).ok());
}

TEST(CheckNcclTensorsTest, TensorsMustBeContiguous) {
  const tensor::Device cpu = tensor::Device::Cpu();
  Tensor t = Tensor::Empty({2, 3}).Transpose(0, 1);
  EXPECT_EQ(CheckNcclTensors(MakeCall(CollectiveKind::kBroadcast, t), cpu, 0, 2),
            absl::InvalidArgumentError("[broadcast] rank 0 of 2: the tensor is not contiguous (the "
                                       "nccl engine takes contiguous tensors only)"));
  EXPECT_EQ(
      CheckNcclTensors(MakeCall(CollectiveKind::kReduceScatter, t, Tensor::Empty({3})), cpu, 0, 2)
          .message(),
      "[reduce_scatter] rank 0 of 2: the input tensor is not contiguous (the nccl engine "
      "takes contiguous tensors only)");
  EXPECT_TRUE(
      CheckNcclTensors(MakeCall(CollectiveKind::kAllReduce, Tensor::Empty({2, 3})), cpu, 0, 2)
          .ok());
}

TEST(CheckNcclTensorsTest, OnlyNcclsInPlaceFormsMayAlias) {
  const tensor::Device cpu = tensor::Device::Cpu();
  Tensor flat = Tensor::Empty({8});
  // reduce_scatter, rank 2 of 4: output chunk 2 of the input.
  EXPECT_TRUE(CheckNcclTensors(MakeCall(CollectiveKind::kReduceScatter, flat, flat.Narrow(0, 4, 2)),
                               cpu, 2, 4)
                  .ok());
  EXPECT_EQ(
      CheckNcclTensors(MakeCall(CollectiveKind::kReduceScatter, flat, flat.Narrow(0, 2, 2)), cpu, 2,
                       4),
      absl::InvalidArgumentError("[reduce_scatter] rank 2 of 4: the output overlaps the input but "
                                 "is not chunk 2 of it (the only in-place form NCCL supports)"));
  // all_gather, rank 3 of 4: input chunk 3 of the output.
  EXPECT_TRUE(
      CheckNcclTensors(MakeCall(CollectiveKind::kAllGather, flat.Narrow(0, 6, 2), flat), cpu, 3, 4)
          .ok());
  EXPECT_EQ(
      CheckNcclTensors(MakeCall(CollectiveKind::kAllGather, flat.Narrow(0, 6, 2), flat), cpu, 1, 4),
      absl::InvalidArgumentError("[all_gather] rank 1 of 4: the input overlaps the output but is "
                                 "not chunk 1 of it (the only in-place form NCCL supports)"));
  // Separate buffers never alias.
  EXPECT_TRUE(
      CheckNcclTensors(MakeCall(CollectiveKind::kAllGather, Tensor::Empty({2}), flat), cpu, 1, 4)
          .ok());
}

}  // namespace
}  // namespace nccl
}  // namespace dist
