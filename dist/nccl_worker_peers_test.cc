// Tests of the nccl engine's call thread across groups and ranks, without a
// GPU (fake calls stand in for NCCL kernels, nccl_worker_testing.h): the
// launch order a group shares with the groups split from it (a call starts
// only once the family's calls issued before it were enqueued; a broken
// group, a refusal or a waiting worker never stall the family), and the
// departures of peers whose group broke or was destroyed (a call such a peer
// will never make fails at once, naming it and why).
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "dist/nccl_launch_order.h"
#include "dist/nccl_worker.h"
#include "dist/nccl_worker_testing.h"
#include "dist/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dist {
namespace nccl {
namespace {

using nccl::testing::CompletesWithin;
using nccl::testing::FakeCall;
using nccl::testing::Loopback;
using ::testing::ElementsAre;
using ::testing::StartsWith;

// Two workers of one family (a group and its split) sharing a LaunchOrder.
struct Family {
  std::shared_ptr<LaunchOrder> order = std::make_shared<LaunchOrder>();
  std::mutex mu;
  std::vector<std::string> started;  // the calls' names, in the order they started

  CallWorkerOptions Options(std::function<void()> abort = nullptr) {
    CallWorkerOptions options;
    options.size = 2;  // a refusal breaks the group (in a group of one it fails alone)
    options.launch_order = order;
    options.abort = std::move(abort);
    return options;
  }
  std::shared_ptr<FakeCall> Call(std::string name) {
    auto call = std::make_shared<FakeCall>();
    call->start = [this, name] {
      std::lock_guard<std::mutex> lock(mu);
      started.push_back(name);
      return absl::OkStatus();
    };
    return call;
  }
  std::vector<std::string> Started() {
    std::lock_guard<std::mutex> lock(mu);
    return started;
  }
};

// Issued a0, a1 on group A, then b0 on its split B: while a0 is still being
// enqueued, B's worker (idle, its call queued) must not start b0 before a1,
// or ranks whose workers ran in other orders would launch NCCL kernels of
// the two communicators in different orders.
TEST(CallWorkerTest, AFamilysCallsStartInIssueOrderAcrossWorkers) {
  Family family;
  std::atomic<bool> release{false};  // before the workers, whose calls read it
  CallWorker a(family.Options());
  CallWorker b(family.Options());
  auto a0 = family.Call("a0");
  a0->enqueued = [&]() -> absl::StatusOr<bool> { return release.load(); };
  const WorkPtr w0 = a.Submit("all_gather", absl::Seconds(30), a0);
  const WorkPtr w1 = a.Submit("reduce_scatter", absl::Seconds(30), family.Call("a1"));
  const WorkPtr w2 = b.Submit("all_reduce", absl::Seconds(30), family.Call("b0"));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(family.Started(), ElementsAre("a0"));
  release = true;
  for (const WorkPtr& w : {w0, w1, w2}) {
    ASSERT_TRUE(CompletesWithin(w, absl::Seconds(10)));
    EXPECT_TRUE(w->Wait().ok());
  }
  EXPECT_THAT(family.Started(), ElementsAre("a0", "a1", "b0"));
  EXPECT_EQ(family.order->taken(), 3);
}

// A group that breaks drops its queued calls' turns: the family goes on.
TEST(CallWorkerTest, ABrokenGroupPassesItsTurnsToTheFamily) {
  Family family;
  std::atomic<bool> release{false};
  CallWorker a(family.Options([] {}));
  CallWorker b(family.Options());
  auto a0 = family.Call("a0");
  a0->enqueued = [&]() -> absl::StatusOr<bool> {
    if (!release.load()) return false;
    return absl::AbortedError("a peer exited");
  };
  const WorkPtr w0 = a.Submit("all_gather", absl::Seconds(30), a0);
  const WorkPtr w1 = a.Submit("all_gather", absl::Seconds(30), family.Call("a1"));
  const WorkPtr w2 = b.Submit("all_reduce", absl::Seconds(30), family.Call("b0"));
  absl::SleepFor(absl::Milliseconds(20));
  release = true;
  for (const WorkPtr& w : {w0, w1, w2}) ASSERT_TRUE(CompletesWithin(w, absl::Seconds(10)));
  EXPECT_TRUE(absl::IsAborted(w0->Wait())) << w0->Wait();
  EXPECT_TRUE(absl::IsAborted(w1->Wait())) << w1->Wait();
  EXPECT_TRUE(w2->Wait().ok());
  EXPECT_THAT(family.Started(), ElementsAre("a0", "b0"));
  // Later calls of the family still run.
  const WorkPtr w3 = b.Submit("all_reduce", absl::Seconds(30), family.Call("b1"));
  ASSERT_TRUE(CompletesWithin(w3, absl::Seconds(10)));
  EXPECT_TRUE(w3->Wait().ok());
}

// A refusal reaches no communicator: while it waits for its group's call in
// flight, the family's later calls launch.
TEST(CallWorkerTest, ARefusalTakesNoTurnOfTheFamily) {
  Family family;
  std::atomic<bool> release{false};
  CallWorker a(family.Options([] {}));
  CallWorker b(family.Options());
  auto a0 = family.Call("a0");
  a0->finished = [&]() -> absl::StatusOr<bool> { return release.load(); };
  const WorkPtr w0 = a.Submit("all_gather", absl::Seconds(30), a0);
  const WorkPtr refused =
      a.Refuse("all_reduce", absl::Seconds(30), absl::InvalidArgumentError("bad"));
  const WorkPtr w1 = b.Submit("all_reduce", absl::Seconds(30), family.Call("b0"));
  ASSERT_TRUE(CompletesWithin(w1, absl::Seconds(10)));
  EXPECT_TRUE(w1->Wait().ok());
  EXPECT_FALSE(refused->IsCompleted()) << "it waits for a0";
  release = true;
  ASSERT_TRUE(CompletesWithin(refused, absl::Seconds(10)));
  EXPECT_TRUE(absl::IsInvalidArgument(refused->Wait()));
  EXPECT_EQ(family.order->taken(), 2) << "a0 and b0";
}

// A group that breaks passes its queued calls' turns before its abort, which
// may take long: the family's later calls need not wait for it.
TEST(CallWorkerTest, ABreakingGroupPassesItsQueuedTurnsBeforeItsAbort) {
  Family family;
  std::atomic<bool> aborted{false};
  std::atomic<bool> b0_saw_aborted{true};
  CallWorker a(family.Options([&] {
    absl::SleepFor(absl::Milliseconds(300));
    aborted = true;
  }));
  CallWorker b(family.Options());
  std::atomic<bool> fail{false};
  auto a0 = family.Call("a0");
  a0->finished = [&]() -> absl::StatusOr<bool> {
    if (fail.load()) return absl::AbortedError("a peer exited");
    return false;
  };
  auto b0 = family.Call("b0");
  b0->start = [&] {
    b0_saw_aborted = aborted.load();
    return absl::OkStatus();
  };
  auto a1 = family.Call("a1");
  a1->needs_idle = true;  // a split: queued behind a0, holding the turn b0 waits for
  const WorkPtr w0 = a.Submit("all_gather", absl::Seconds(30), a0);
  const WorkPtr w1 = a.Submit("split", absl::Seconds(30), a1);
  const WorkPtr w2 = b.Submit("all_reduce", absl::Seconds(30), b0);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(w2->IsCompleted());
  fail = true;
  ASSERT_TRUE(CompletesWithin(w2, absl::Seconds(10)));
  EXPECT_TRUE(w2->Wait().ok());
  EXPECT_FALSE(b0_saw_aborted.load()) << "b0 started only after A's abort returned";
  ASSERT_TRUE(CompletesWithin(w1, absl::Seconds(10)));
  EXPECT_TRUE(absl::IsAborted(w1->Wait())) << w1->Wait();
}

// A worker whose next call waits for its turn still watches the calls it
// has in flight: one that never finishes times out meanwhile.
TEST(CallWorkerTest, AWorkerWaitingForItsTurnStillTimesOutItsCalls) {
  Family family;
  std::atomic<bool> release{false};
  CallWorker a(family.Options([] {}));
  CallWorker b(family.Options());
  auto a0 = family.Call("a0");
  a0->finished = []() -> absl::StatusOr<bool> { return false; };
  auto b0 = family.Call("b0");
  b0->enqueued = [&]() -> absl::StatusOr<bool> { return release.load(); };
  const WorkPtr w0 = a.Submit("all_gather", absl::Milliseconds(100), a0);
  const WorkPtr w1 = b.Submit("all_reduce", absl::Seconds(30), b0);
  const WorkPtr w2 = a.Submit("all_gather", absl::Seconds(30), family.Call("a1"));
  ASSERT_TRUE(CompletesWithin(w0, absl::Seconds(10)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(w0->Wait())) << w0->Wait();
  EXPECT_FALSE(w1->IsCompleted());
  release = true;
  ASSERT_TRUE(CompletesWithin(w1, absl::Seconds(10)));
  ASSERT_TRUE(CompletesWithin(w2, absl::Seconds(10)));
  EXPECT_TRUE(w1->Wait().ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(w2->Wait())) << w2->Wait();  // A is broken
  EXPECT_THAT(family.Started(), ElementsAre("a0", "b0"));
}

// What two ranks' workers share: the store they publish their departures
// to, loopback calls, and each rank's count of aborts. Options(rank) checks
// for departed peers every 20 ms.
struct TwoRanks {
  HashStore store;
  Loopback loopback{2};
  std::atomic<int> aborts[2] = {{0}, {0}};

  CallWorkerOptions Options(int rank) {
    CallWorkerOptions options;
    options.rank = rank;
    options.size = 2;
    options.store = &store;
    options.prefix = "gone";
    options.report_wait = absl::Milliseconds(100);
    options.peer_check_interval = absl::Milliseconds(20);
    std::atomic<int>* count = &aborts[rank];
    options.abort = [count] { count->fetch_add(1); };
    return options;
  }
};

// Rank 1 issues call #0 and is destroyed (its process finished, or failed
// outside the group): rank 0's call #0 runs, and its call #1, which rank 1
// will never make, fails at once (not after its 30 s timeout) naming rank 1,
// and aborts rank 0's communicator.
TEST(CallWorkerTest, ACallAPeerWillNeverMakeFailsAtOnceOnceThePeerIsGone) {
  TwoRanks two;
  CallWorker rank0(two.Options(0));
  const WorkPtr first0 = rank0.Submit("all_gather", absl::Seconds(30), two.loopback.Call(0));
  const WorkPtr second0 = rank0.Submit("all_reduce", absl::Seconds(30), two.loopback.Call(1));
  {
    CallWorker rank1(two.Options(1));
    EXPECT_TRUE(rank1.Submit("all_gather", absl::Seconds(30), two.loopback.Call(0))->Wait().ok());
    absl::SleepFor(absl::Milliseconds(100));  // a few checks: rank 1 is not gone yet
    EXPECT_FALSE(second0->IsCompleted());
  }
  EXPECT_TRUE(first0->Wait().ok());
  ASSERT_TRUE(CompletesWithin(second0, absl::Seconds(5)));
  EXPECT_EQ(second0->Wait(),
            absl::AbortedError("[all_reduce] rank 0 of 2: rank 1 will never make this call (call "
                               "#1 of this rank; rank 1 stopped before its call #1: its group "
                               "was destroyed after issuing 1 call (the rank finished, or "
                               "stopped on an error outside this group))"));
  EXPECT_EQ(two.aborts[0].load(), 1);
  EXPECT_EQ(two.aborts[1].load(), 0);
}

// Rank 1 refuses its call #0 (bad arguments): rank 0, in that call, fails at
// once with rank 1's reason instead of timing out.
TEST(CallWorkerTest, APeerWhoseGroupBrokeFailsTheCallsItWillNotMake) {
  TwoRanks two;
  CallWorker rank0(two.Options(0));
  CallWorker rank1(two.Options(1));
  const WorkPtr call0 = rank0.Submit("all_reduce", absl::Seconds(30), two.loopback.Call(0));
  const absl::Status refusal =
      absl::InvalidArgumentError("[all_reduce] rank 1 of 2: the tensor is on cpu");
  EXPECT_EQ(rank1.Refuse("all_reduce", absl::Seconds(30), refusal)->Wait(), refusal);
  ASSERT_TRUE(CompletesWithin(call0, absl::Seconds(5)));
  EXPECT_EQ(call0->Wait(),
            absl::AbortedError("[all_reduce] rank 0 of 2: rank 1 will never make this call (call "
                               "#0 of this rank; rank 1 stopped before its call #0: [all_reduce] "
                               "rank 1 of 2: the tensor is on cpu)"));
  EXPECT_EQ(two.aborts[0].load(), 1);
  // Rank 0's departure (broken at #0) does not fail rank 1 again: it is broken already.
  EXPECT_EQ(two.aborts[1].load(), 1);
}

// A call whose enqueue waits for the peers (a split) fails at once too when
// a peer is gone before it.
TEST(CallWorkerTest, ACallStillEnqueuingFailsOnceAPeerIsGone) {
  TwoRanks two;
  CallWorker rank0(two.Options(0));
  auto split = std::make_shared<FakeCall>();
  split->needs_idle = true;
  split->enqueued = []() -> absl::StatusOr<bool> { return false; };  // never, without rank 1
  const WorkPtr work = rank0.Submit("split", absl::Seconds(30), split);
  { CallWorker rank1(two.Options(1)); }  // gone, having issued nothing
  ASSERT_TRUE(CompletesWithin(work, absl::Seconds(5)));
  EXPECT_TRUE(absl::IsAborted(work->Wait())) << work->Wait();
  EXPECT_THAT(std::string(work->Wait().message()),
              StartsWith("[split] rank 0 of 2: rank 1 will never make this call (call #0"));
}

// A peer destroyed after issuing more calls than this rank has reached yet
// fails none of them: rank 1 issues #0 and #1 and is destroyed (its
// destructor waits for them); rank 0 issues #1 late, which runs.
TEST(CallWorkerTest, APeerGoneAfterACallDoesNotFailThatCall) {
  TwoRanks two;
  CallWorker rank0(two.Options(0));
  auto rank1 = std::make_unique<CallWorker>(two.Options(1));
  const WorkPtr a1 = rank1->Submit("all_reduce", absl::Seconds(30), two.loopback.Call(0));
  const WorkPtr b1 = rank1->Submit("all_reduce", absl::Seconds(30), two.loopback.Call(1));
  std::thread destroy([&] { rank1.reset(); });  // publishes "gone before #2" at once
  const WorkPtr a0 = rank0.Submit("all_reduce", absl::Seconds(30), two.loopback.Call(0));
  EXPECT_TRUE(a0->Wait().ok());
  absl::SleepFor(absl::Milliseconds(100));  // checks run meanwhile (every 20 ms)
  const WorkPtr b0 = rank0.Submit("all_reduce", absl::Seconds(30), two.loopback.Call(1));
  ASSERT_TRUE(CompletesWithin(b0, absl::Seconds(5)));
  EXPECT_TRUE(b0->Wait().ok()) << b0->Wait();
  destroy.join();
  EXPECT_TRUE(a1->Wait().ok());
  EXPECT_TRUE(b1->Wait().ok());
  EXPECT_EQ(two.aborts[0].load(), 0);
}

// Rank 1's call #1 fails to start while its #0 is in flight: the abort ends
// #0 too, so its departure is from #0, and rank 0, waiting in #0, fails at
// once.
TEST(CallWorkerTest, ADepartureCountsTheCallsItsAbortEnds) {
  TwoRanks two;
  CallWorker rank0(two.Options(0));
  CallWorker rank1(two.Options(1));
  auto stuck = std::make_shared<FakeCall>();
  stuck->finished = []() -> absl::StatusOr<bool> { return false; };
  auto fails = std::make_shared<FakeCall>();
  fails->start = [] { return absl::InternalError("no memory"); };
  const WorkPtr a1 = rank1.Submit("all_reduce", absl::Seconds(30), stuck);
  const WorkPtr b1 = rank1.Submit("all_gather", absl::Seconds(30), fails);
  const WorkPtr a0 = rank0.Submit("all_reduce", absl::Seconds(30), two.loopback.Call(0));
  ASSERT_TRUE(CompletesWithin(a0, absl::Seconds(5)));
  EXPECT_THAT(std::string(a0->Wait().message()),
              StartsWith("[all_reduce] rank 0 of 2: rank 1 will never make this call (call #0 of "
                         "this rank; rank 1 stopped before its call #0: [all_gather] rank 1 of 2: "
                         "no memory"));
  EXPECT_TRUE(b1->IsCompleted());
  EXPECT_TRUE(a1->IsCompleted());
}

}  // namespace
}  // namespace nccl
}  // namespace dist
