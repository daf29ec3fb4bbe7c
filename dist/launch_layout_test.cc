// Tests of the launch layout check over an in-process store: nodes (groups
// of threads) launched alike pass, nodes launched for other world sizes all
// fail naming the layouts, a node that never comes is named, store errors
// are Unavailable; a rank's place under a prefix is claimed once.
#include "dist/launch_layout.h"

#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/store.h"
#include "gtest/gtest.h"

namespace dist::internal {
namespace {

// Each rank's layout, checked on its own thread through `layout`.
std::vector<absl::Status> CheckAll(LayoutStore& layout, const std::vector<LaunchLayout>& ranks,
                                   absl::Duration wait) {
  std::vector<absl::Status> got(ranks.size());
  std::vector<std::thread> threads;
  const absl::Time deadline = absl::Now() + wait;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::string who = absl::StrCat("rank ", ranks[i].rank, " of ", ranks[i].size);
      got[i] = CheckLaunchLayout(layout, "job", ranks[i], deadline, who);
      if (got[i].ok()) got[i] = CheckNoLayoutMismatch(layout, "job", ranks[i], who);
    });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

// The same through a store of their own.
std::vector<absl::Status> CheckAll(const std::vector<LaunchLayout>& ranks,
                                   absl::Duration wait = absl::Seconds(10)) {
  HashStore store;
  DistLayoutStore layout(store);
  return CheckAll(layout, ranks, wait);
}

// The ranks of nodes of `counts` ranks each, in a world of their sum (or
// `world` when given).
std::vector<LaunchLayout> Nodes(const std::vector<int>& counts, int world = 0) {
  int total = 0;
  for (int c : counts) total += c;
  std::vector<LaunchLayout> ranks;
  int first = 0;
  for (int c : counts) {
    for (int l = 0; l < c; ++l) ranks.push_back({first + l, world > 0 ? world : total, l, c});
    first += c;
  }
  return ranks;
}

TEST(LaunchLayoutTest, NodesLaunchedAlikePassWhateverTheirCounts) {
  for (const std::vector<int>& counts : {std::vector<int>{2, 2}, {3, 1}, {1, 1, 1}, {4}}) {
    for (const absl::Status& s : CheckAll(Nodes(counts))) EXPECT_TRUE(s.ok()) << s;
  }
}

// Node 0 launched as 2 nodes x 2 ranks; node 1 as if 2 nodes x 3 ranks (its
// ranks 3-5 of 6): every rank fails, naming the nodes.
TEST(LaunchLayoutTest, NodesLaunchedForOtherWorldsAllFail) {
  std::vector<LaunchLayout> ranks = Nodes({2, 2});
  for (int l = 0; l < 3; ++l) ranks.push_back({3 + l, 6, l, 3});
  ranks.erase(ranks.begin() + 2, ranks.begin() + 4);  // node 1 is the 3-rank one
  const std::vector<absl::Status> got = CheckAll(ranks);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].code(), absl::StatusCode::kInvalidArgument) << i << ": " << got[i];
    EXPECT_TRUE(absl::StrContains(got[i].message(), "launched differently")) << got[i];
  }
}

TEST(LaunchLayoutTest, ANodeThatNeverComesIsNamed) {
  std::vector<LaunchLayout> ranks = Nodes({2, 2});
  ranks.resize(2);  // node 1 (ranks 2, 3) never starts
  for (const absl::Status& s : CheckAll(ranks, absl::Milliseconds(300))) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "the node whose first rank is 2 did not arrive"))
        << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "so far ranks 0-1 run 2 per node in a world of 4"))
        << s;
  }
}

// Node 1's ranks fail before joining (their data is missing there); rank 2
// says why: node 0's ranks, waiting for node 1 in the walk, fail at once
// with it, long before their deadline.
TEST(LaunchLayoutTest, ARankThatFailedBeforeJoiningStopsTheWalk) {
  HashStore store;
  DistLayoutStore layout(store);
  const absl::StatusOr<bool> set =
      AnnounceFailure(layout, "job", 2, 4, "--data=/nfs/x.bin: no such file");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(*set);
  std::vector<LaunchLayout> ranks = Nodes({2, 2});
  ranks.resize(2);
  const absl::Time start = absl::Now();
  for (const absl::Status& s : CheckAll(layout, ranks, absl::Seconds(60))) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), ": rank 2 (host ")) << s;
    EXPECT_TRUE(absl::EndsWith(
        s.message(), absl::StrCat(" pid ", getpid(),
                                  ") failed before joining: --data=/nfs/x.bin: no such file")))
        << s;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A failure announced while the walk waits stops it too; a rank that
// claimed its place (it joined) announces nothing; of several, the lowest
// rank's is named.
TEST(LaunchLayoutTest, AFailureAnnouncedWhileTheWalkWaitsStopsIt) {
  HashStore store;
  DistLayoutStore layout(store);
  ASSERT_TRUE(ClaimRank(layout, "job", 3, "rank 3 of 4").ok());
  absl::StatusOr<bool> set = AnnounceFailure(layout, "job", 3, 4, "out of memory");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_FALSE(*set);
  EXPECT_TRUE(CheckPeerFailure(layout, "job", 4, "rank 0 of 4").ok());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    const absl::StatusOr<bool> said =
        AnnounceFailure(layout, "job", 2, 4, "--device=cuda:3: no such device");
    EXPECT_TRUE(said.ok() && *said) << said.status();
  });
  std::vector<LaunchLayout> ranks = Nodes({2, 2});
  ranks.resize(1);
  const std::vector<absl::Status> got = CheckAll(layout, ranks, absl::Seconds(60));
  late.join();
  EXPECT_EQ(got[0].code(), absl::StatusCode::kAborted) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(), "[rendezvous] rank 0 of 4: rank 2 (host "))
      << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(), "--device=cuda:3: no such device")) << got[0];
  // Said just now: no word of an earlier run.
  EXPECT_FALSE(absl::StrContains(got[0].message(), "earlier run")) << got[0];
  ASSERT_TRUE(AnnounceFailure(layout, "job", 1, 4, "a bad --lr").ok());
  const absl::Status both = CheckPeerFailure(layout, "job", 4, "rank 0 of 4");
  EXPECT_TRUE(absl::StrContains(both.message(), ": rank 1 (host ")) << both;
  EXPECT_TRUE(absl::EndsWith(both.message(), "failed before joining: a bad --lr")) << both;
  // Under another prefix (another run, or a restart) nothing failed.
  EXPECT_TRUE(CheckPeerFailure(layout, "job2", 4, "rank 0 of 4").ok());
}

// A failure said before this process started may be an earlier run's, left
// under the same prefix: the message says so, and what to change.
TEST(LaunchLayoutTest, AFailureSaidBeforeThisProcessStartedMayBeAnEarlierRuns) {
  HashStore store;
  DistLayoutStore layout(store);
  ASSERT_TRUE(store.Set("old/failed_before_joining/1",
                        "1000000 rank 1 (host n1 pid 7) failed before joining: --data=x: missing")
                  .ok());
  ASSERT_TRUE(store.Set("old/failed_before_joining", "1").ok());
  const absl::Status s = CheckPeerFailure(layout, "old", 2, "rank 0 of 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "[rendezvous] rank 0 of 2: rank 1 (host n1 pid 7) failed before "
                               "joining: --data=x: missing; said "))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                " s before this process started: if an earlier run left it under "
                                "the prefix \"old\", give each run its own --rdzv_id (RUN_ID)"))
      << s;
}

TEST(LaunchLayoutTest, UnknownLocalWorldSizeChecksNothing) {
  HashStore store;
  DistLayoutStore layout(store);
  EXPECT_TRUE(CheckLaunchLayout(layout, "job", {1, 4, 1, 0}, absl::Now(), "rank 1 of 4").ok());
}

class FailingStore final : public LayoutStore {
 public:
  void Set(const std::string&, const std::string&) override {
    throw std::runtime_error("disk full");
  }
  bool SetIfAbsent(const std::string&, const std::string&) override {
    throw std::runtime_error("disk full");
  }
  std::string Get(const std::string&) override { return ""; }
  bool Present(const std::string&) override { return false; }
};

TEST(LaunchLayoutTest, StoreErrorsAreUnavailable) {
  FailingStore store;
  const absl::Status s =
      CheckLaunchLayout(store, "job", {0, 2, 0, 2}, absl::Now() + absl::Seconds(1), "rank 0 of 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "reading the nodes' launch layout: disk full")) << s;
}

// A rank claims its place once per prefix: a second claim (an earlier run's
// keys left in the store, or two processes started as one rank) fails naming
// the process that holds it and what to change; other ranks and prefixes
// are free.
TEST(LaunchLayoutTest, ARankClaimedUnderThePrefixBeforeFails) {
  HashStore store;
  DistLayoutStore layout(store);
  EXPECT_TRUE(ClaimRank(layout, "run/restart0", 0, "rank 0 of 2").ok());
  EXPECT_TRUE(ClaimRank(layout, "run/restart0", 1, "rank 1 of 2").ok());
  EXPECT_TRUE(ClaimRank(layout, "run/restart1", 0, "rank 0 of 2").ok());
  const absl::Status again = ClaimRank(layout, "run/restart0", 1, "rank 1 of 2");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_TRUE(absl::StrContains(
      again.message(),
      "[rendezvous] rank 1 of 2: the store already holds rank 1's keys under prefix "
      "\"run/restart0\" (host "))
      << again;
  EXPECT_TRUE(absl::StrContains(again.message(), absl::StrCat(" pid ", ::getpid(),
                                                              " joined as rank 1)")))
      << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "Give each run a prefix of its own")) << again;
}

// A claim whose holder, a process of this host, has exited: said, with how
// to clear the keys it left.
TEST(LaunchLayoutTest, AClaimOfAnExitedProcessOfThisHostIsSaid) {
  HashStore store;
  DistLayoutStore layout(store);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  ASSERT_TRUE(layout.SetIfAbsent("none/restart0/joined/0", absl::StrCat("host ", host, " pid ",
                                                                         child)));
  const absl::Status s = ClaimRank(layout, "none/restart0", 0, "rank 0 of 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(
      s.message(), absl::StrCat("; pid ", child, " on this host has exited: an earlier run of "
                                "this prefix left them (remove them from the store, when no run "
                                "uses it). Give each run")))
      << s;
  // A store that is this run's folder alone: the rm -r that clears it.
  class RunFolder final : public LayoutStore {
   public:
    explicit RunFolder(LayoutStore& inner) : inner_(inner) {}
    void Set(const std::string& k, const std::string& v) override { inner_.Set(k, v); }
    bool SetIfAbsent(const std::string& k, const std::string& v) override {
      return inner_.SetIfAbsent(k, v);
    }
    std::string Get(const std::string& k) override { return inner_.Get(k); }
    bool Present(const std::string& k) override { return inner_.Present(k); }
    std::string Where() const override { return "/tmp/rdzv_u0/none"; }

   private:
    LayoutStore& inner_;
  };
  RunFolder folder(layout);
  EXPECT_TRUE(absl::StrContains(ClaimRank(folder, "none/restart0", 0, "rank 0 of 2").message(),
                                "left them (rm -r /tmp/rdzv_u0/none removes them). Give"));
  // A live holder (this process) is not called stale.
  ASSERT_TRUE(layout.SetIfAbsent("none/restart0/joined/1", absl::StrCat("host ", host, " pid ",
                                                                         ::getpid())));
  EXPECT_FALSE(absl::StrContains(ClaimRank(layout, "none/restart0", 1, "rank 1 of 2").message(),
                                 "has exited"));
}

// A HashStore whose Check returns 2 ms late: a claim that looked before it
// set would let both of two racing claimants in.
class SlowChecks final : public Store {
 public:
  SlowChecks() : Store(DefaultStoreTimeout()) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return base_.Set(key, value);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return base_.Add(key, delta);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    absl::StatusOr<bool> set = base_.Check(keys);
    absl::SleepFor(absl::Milliseconds(2));
    return set;
  }
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override { return base_.DeleteKey(key); }

 protected:
  absl::StatusOr<std::string> DoGet(absl::string_view key, absl::Duration timeout) override {
    return base_.Get(key, timeout);
  }
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    return base_.Wait(keys, timeout);
  }

 private:
  HashStore base_;
};

// Two processes started as one rank, claiming at once: one wins, every time.
TEST(LaunchLayoutTest, OfTwoRacingClaimsOneWins) {
  SlowChecks store;
  DistLayoutStore layout(store);
  for (int round = 0; round < 50; ++round) {
    const std::string prefix = absl::StrCat("race", round);
    absl::Status got[2];
    std::thread other([&] { got[1] = ClaimRank(layout, prefix, 0, "rank 0 of 1"); });
    got[0] = ClaimRank(layout, prefix, 0, "rank 0 of 1");
    other.join();
    ASSERT_EQ(got[0].ok() + got[1].ok(), 1) << "round " << round << ": " << got[0] << " / "
                                            << got[1];
  }
}

// A rank claimed before fails with the claim's error after a layout check
// that waits for nothing; its node's layout is published all the same.
TEST(LaunchLayoutTest, AClaimedRankFailsAfterPublishingItsNodesLayout) {
  HashStore store;
  DistLayoutStore layout(store);
  ASSERT_TRUE(ClaimRank(layout, "job", 2, "rank 2 of 4").ok());
  const absl::Time start = absl::Now();
  const absl::Status s = ClaimAndCheckLayout(layout, "job", {2, 4, 0, 2},
                                             absl::Now() + absl::Seconds(30), "rank 2 of 4");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the store already holds rank 2's keys")) << s;
  EXPECT_TRUE(layout.Present("job/layout/first2"));
  // The claim's error, and the layout check's when that fails too (an
  // earlier run of 4 ranks, 2 a node, left its keys).
  layout.Set("job2/layout/first0", "4,2");
  ASSERT_TRUE(ClaimRank(layout, "job2", 0, "rank 0 of 4").ok());
  const absl::Status both = ClaimAndCheckLayout(layout, "job2", {0, 2, 0, 1},
                                                absl::Now() + absl::Seconds(30), "rank 0 of 2");
  EXPECT_EQ(both.code(), absl::StatusCode::kFailedPrecondition) << both;
  EXPECT_TRUE(absl::StrContains(both.message(), "(and the launch layout check failed: ")) << both;
}

// Two processes started as rank 1: one of a node of ranks 0-1 of 4, which
// claims it, and a node of its own as rank 1 of 2 (--nnodes=2
// --nproc_per_node=1), whose claim fails before node 0 has published its
// layout: it publishes its own and leaves. Node 0's walk steps from rank 0
// to 2, over the node at rank 1, yet both its ranks fail at once (not at
// their deadline), naming that node, and the verdict is written for others.
TEST(LaunchLayoutTest, ANodeInsideThisRanksNodeFailsIt) {
  HashStore store;
  DistLayoutStore layout(store);
  ASSERT_TRUE(ClaimRank(layout, "job", 1, "rank 1 of 4").ok());
  const absl::Status stray = ClaimAndCheckLayout(layout, "job", {1, 2, 0, 1},
                                                 absl::Now() + absl::Seconds(30), "rank 1 of 2");
  EXPECT_TRUE(absl::IsFailedPrecondition(stray)) << stray;
  ASSERT_TRUE(layout.Present("job/layout/first1"));
  const absl::Time start = absl::Now();
  const std::vector<absl::Status> got = CheckAll(layout, Nodes({2}, 4), absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the ranks waited for their deadline";
  for (const absl::Status& s : got) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(
        s.message(),
        "found the nodes launched differently: rank 1 runs 1 per node in a world of 2, inside "
        "the node where ranks 0-1 run 2 per node in a world of 4. Every node's launch must give "
        "the same --nnodes and --nproc_per_node"))
        << s;
  }
  EXPECT_TRUE(layout.Present("job/layout/mismatch"));
}

TEST(LaunchLayoutTest, AClaimTheStoreCannotTakeIsUnavailable) {
  FailingStore store;
  const absl::Status s = ClaimRank(store, "job", 0, "rank 0 of 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "claiming rank 0 in the store: disk full")) << s;
}

}  // namespace
}  // namespace dist::internal
