// Tests of the nccl engine's store side without a GPU: the unique id exchange
// between ranks as threads, progress reports and the messages that name the
// ranks a timed-out call or init waited for.
#include "dist/nccl_rendezvous.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dist {
namespace nccl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr size_t kIdBytes = 128;

// 128 bytes covering 0x00 and 0xff, so encoding must survive any byte.
std::string TestId(int salt) {
  std::string id(kIdBytes, '\0');
  for (size_t i = 0; i < kIdBytes; ++i) id[i] = static_cast<char>((i * 37 + salt) & 0xff);
  id[3] = '\0';
  id[7] = static_cast<char>(0xff);
  return id;
}

TEST(NcclRendezvousTest, EveryRankGetsRankZerosId) {
  HashStore store;
  constexpr int kSize = 4;
  std::atomic<int> created{0};
  std::vector<absl::StatusOr<std::string>> ids(kSize, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      if (rank == 0) absl::SleepFor(absl::Milliseconds(50));  // the others wait for it
      ids[rank] = ExchangeUniqueId(
          store, "run1", rank, kSize, kIdBytes,
          [&]() -> absl::StatusOr<std::string> {
            created.fetch_add(1);
            return TestId(rank);
          },
          absl::Seconds(30));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(created.load(), 1);
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(ids[rank].ok()) << ids[rank].status();
    EXPECT_EQ(*ids[rank], TestId(0)) << "rank " << rank;
  }
  // Stored as hex under the prefix.
  absl::StatusOr<std::string> stored = store.Get("run1/unique_id");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 2 * kIdBytes);
}

TEST(NcclRendezvousTest, MissingRankZeroIsNamed) {
  HashStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> id = ExchangeUniqueId(
      store, "p", 1, 2, kIdBytes, []() -> absl::StatusOr<std::string> { return TestId(1); },
      absl::Milliseconds(200));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  ASSERT_TRUE(absl::IsDeadlineExceeded(id.status())) << id.status();
  EXPECT_EQ(id.status().message(),
            "[nccl_init] rank 1 of 2 timed out after 0.2 s waiting for rank 0 (no NCCL unique id "
            "at key p/unique_id in the store: rank 0 has not started, failed, or uses another "
            "store or prefix)");
}

// Rank 0 failed before it joined (launch_layout.h's announcement): rank 1,
// waiting for its id with a 60 s timeout, fails at once naming it.
TEST(NcclRendezvousTest, ARankZeroThatFailedBeforeJoiningEndsTheWait) {
  HashStore store;
  std::thread failed([&] {
    absl::SleepFor(absl::Milliseconds(100));
    const absl::StatusOr<bool> said =
        AnnounceFailure(store, "p", 0, 2, "--data=x.bin: no such file");
    EXPECT_TRUE(said.ok() && *said) << said.status();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> id = ExchangeUniqueId(
      store, "p", 1, 2, kIdBytes, []() -> absl::StatusOr<std::string> { return TestId(1); },
      absl::Seconds(60));
  failed.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_TRUE(absl::IsAborted(id.status())) << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("[rendezvous] rank 1 of 2: rank 0 (host "));
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr(") failed before joining: --data=x.bin: no such file"));
}

TEST(NcclRendezvousTest, ForeignValueIsRefused) {
  HashStore store;
  ASSERT_TRUE(store.Set("p/unique_id", "not an id").ok());
  absl::StatusOr<std::string> id = ExchangeUniqueId(
      store, "p", 1, 2, kIdBytes, []() -> absl::StatusOr<std::string> { return TestId(1); },
      absl::Seconds(1));
  ASSERT_TRUE(absl::IsInvalidArgument(id.status())) << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("[nccl_init] rank 1 of 2: key p/unique_id holds 9 characters, not the 256 "
                        "hex digits of a NCCL unique id"));
  // Right length, not hex.
  ASSERT_TRUE(store.Set("p/unique_id", std::string(2 * kIdBytes, 'z')).ok());
  id = ExchangeUniqueId(
      store, "p", 1, 2, kIdBytes, []() -> absl::StatusOr<std::string> { return TestId(1); },
      absl::Seconds(1));
  EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << id.status();
}

TEST(NcclRendezvousTest, RootErrorsAreReported) {
  HashStore store;
  absl::StatusOr<std::string> id = ExchangeUniqueId(
      store, "p", 0, 2, kIdBytes,
      []() -> absl::StatusOr<std::string> { return absl::UnavailableError("no network"); },
      absl::Seconds(1));
  ASSERT_TRUE(absl::IsUnavailable(id.status())) << id.status();
  EXPECT_EQ(id.status().message(),
            "[nccl_init] rank 0 of 2: could not create the NCCL unique id: no network");
  id = ExchangeUniqueId(
      store, "p", 0, 2, kIdBytes,
      []() -> absl::StatusOr<std::string> { return std::string(5, 'x'); }, absl::Seconds(1));
  EXPECT_TRUE(absl::IsInternal(id.status())) << id.status();
  EXPECT_FALSE(store.Check({"p/unique_id"}).value());
}

TEST(NcclRendezvousTest, MissingRanksAreThoseBelowOrSilent) {
  HashStore store;
  ASSERT_TRUE(PublishCount(store, "d", 0, 5).ok());
  ASSERT_TRUE(PublishCount(store, "d", 1, 5).ok());
  ASSERT_TRUE(PublishCount(store, "d", 2, 4).ok());
  ASSERT_TRUE(store.Set("d/4", "garbage").ok());
  const RankCounts counts = ReadCounts(store, "d", 5, absl::Milliseconds(10));
  ASSERT_EQ(counts.size(), 5u);
  EXPECT_EQ(counts[0], 5);
  EXPECT_EQ(counts[1], 5);
  EXPECT_EQ(counts[2], 4);
  EXPECT_FALSE(counts[3].has_value());
  EXPECT_FALSE(counts[4].has_value());
  EXPECT_THAT(MissingRanks(counts, 5, 0), ElementsAre(2, 3, 4));
  EXPECT_THAT(MissingRanks(counts, 4, 1), ElementsAre(3, 4));
  // This rank is never named, even without a count.
  EXPECT_THAT(MissingRanks(counts, 5, 3), ElementsAre(2, 4));
}

TEST(NcclRendezvousTest, TimeoutNamesSilentAndBehindRanks) {
  HashStore store;
  // Rank 1 timed out too but had issued only 4 calls (it never issued call
  // #4); rank 2's report comes late but within the wait; rank 3 never reports.
  ASSERT_TRUE(store.Set("g/seq/1", "4").ok());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store.Set("g/seq/2", "5").ok());
  });
  const absl::Duration wait = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  const ProgressReport report = ReportProgress(&store, "g", 0, 4, /*call=*/4, /*issued=*/5, wait);
  const absl::Duration elapsed = absl::Now() - start;
  late.join();
  EXPECT_GE(elapsed, wait - absl::Milliseconds(10));  // waited for rank 3 in vain
  EXPECT_THAT(report.missing, ElementsAre(1, 3));
  EXPECT_TRUE(report.publish_error.ok());
  EXPECT_EQ(store.Get("g/seq/0").value(), "5");
  const absl::Status error =
      CallTimeoutError("all_reduce", 0, 4, absl::Seconds(2), 4, report, wait);
  EXPECT_TRUE(absl::IsDeadlineExceeded(error));
  EXPECT_EQ(error.message(),
            "[all_reduce] rank 0 of 4 timed out after 2.0 s waiting for ranks 1, 3 (call #4 of "
            "this rank; rank 1 had issued 4 calls; rank 3 sent no report within 0.5 s: exited, "
            "hung, or busy outside this group)");
}

// In a subgroup the error gives the group's label and its peers' world
// ranks, as its members set them at the split ("?" for one never set).
TEST(NcclRendezvousTest, ASubgroupsErrorsNameItAndTheWorldRanks) {
  HashStore store;
  ASSERT_TRUE(store.Set(WorldRankKey("g/split0/color1", 0), "1").ok());
  ASSERT_TRUE(store.Set(WorldRankKey("g/split0/color1", 2), "5").ok());
  EXPECT_EQ(WorldRankKey("g/split0/color1", 2), "g/split0/color1/world/2");
  const std::vector<int> world =
      ReadWorldRanks(store, "g/split0/color1", 4, {0, 2, 3}, absl::Milliseconds(20));
  EXPECT_THAT(world, ElementsAre(1, -1, 5, -1));  // rank 1 not asked for, rank 3 never set
  ProgressReport report;
  report.missing = {2, 3};
  report.counts = RankCounts(4);
  report.counts[2] = 3;
  report.world_ranks = world;
  EXPECT_EQ(CallTimeoutError("all_reduce", 1, 4, absl::Seconds(2), 4, report,
                             absl::Seconds(1), "world/split0/color1")
                .message(),
            "[all_reduce] rank 1 of 4 in group world/split0/color1 timed out after 2.0 s waiting "
            "for ranks 2, 3 (world 5, ?) (call #4 of this rank; rank 2 had issued 3 calls; rank 3 "
            "sent no report within 1.0 s: exited, hung, or busy outside this group)");
  GonePeer gone;
  gone.rank = 2;
  gone.first_unrun = 3;
  gone.reason = "its group was destroyed";
  EXPECT_EQ(PeerGoneError("barrier", 0, 4, 3, gone, "world/split0/color1", world).message(),
            "[barrier] rank 0 of 4 in group world/split0/color1: rank 2 (world 5) will never "
            "make this call (call #3 of this rank; rank 2 stopped before its call #3: its group "
            "was destroyed)");
  gone.rank = 3;  // its world rank never set
  EXPECT_THAT(std::string(
                  PeerGoneError("barrier", 0, 4, 3, gone, "world/split0/color1", world).message()),
              ::testing::HasSubstr(": rank 3 (world ?) will never make this call"));
  // Absent keys cost one wait in all, not one each.
  const absl::Time start = absl::Now();
  EXPECT_THAT(ReadWorldRanks(store, "g/other", 6, {1, 2, 3, 4, 5}, absl::Milliseconds(300)),
              ElementsAre(-1, -1, -1, -1, -1, -1));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
}

TEST(NcclRendezvousTest, ReportsFromEveryRankEndTheWaitEarly) {
  HashStore store;
  constexpr int kSize = 3;
  std::vector<ProgressReport> reports(kSize);
  std::vector<absl::Duration> elapsed(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      absl::SleepFor(absl::Milliseconds(30 * rank));  // staggered timeouts
      const absl::Time start = absl::Now();
      reports[rank] = ReportProgress(&store, "w", rank, kSize, 7, 8 + rank, absl::Seconds(20));
      elapsed[rank] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(reports[rank].missing.empty()) << "rank " << rank;
    EXPECT_LT(elapsed[rank], absl::Seconds(10)) << "rank " << rank;
    ASSERT_EQ(reports[rank].counts.size(), 3u);
    EXPECT_EQ(reports[rank].counts[2], 10);
  }
  EXPECT_EQ(
      CallTimeoutError("barrier", 1, 3, absl::Milliseconds(500), 7, reports[1], absl::Seconds(20))
          .message(),
      "[barrier] rank 1 of 3 timed out after 0.5 s waiting for the call to finish (call #7; "
      "every rank had issued it: a peer may have aborted the group, or the transport is "
      "stuck)");
}

TEST(NcclRendezvousTest, WithoutAStoreEveryPeerIsNamed) {
  const ProgressReport report = ReportProgress(nullptr, "x", 2, 4, 0, 1, absl::Seconds(1));
  EXPECT_THAT(report.missing, ElementsAre(0, 1, 3));
  EXPECT_EQ(
      CallTimeoutError("all_gather", 2, 4, absl::Seconds(1), 0, report, absl::Seconds(1)).message(),
      "[all_gather] rank 2 of 4 timed out after 1.0 s waiting for ranks 0, 1, 3 (call #0 of "
      "this rank; no store to learn which of them had not issued it)");
}

TEST(NcclRendezvousTest, GroupOfOne) {
  HashStore store;
  const ProgressReport report = ReportProgress(&store, "one", 0, 1, 3, 4, absl::Seconds(30));
  EXPECT_TRUE(report.missing.empty());
  EXPECT_EQ(
      CallTimeoutError("broadcast", 0, 1, absl::Seconds(3), 3, report, absl::Seconds(30)).message(),
      "[broadcast] rank 0 of 1 timed out after 3.0 s waiting for the call to finish (call "
      "#3: the device never finished it)");
}

TEST(NcclRendezvousTest, InitTimeoutNamesRanksThatNeverArrived) {
  HashStore store;
  ASSERT_TRUE(MarkInitArrival(store, "job", 0).ok());
  ASSERT_TRUE(MarkInitArrival(store, "job", 2).ok());
  absl::Status error = InitTimeoutError(store, "job", 0, 4, absl::Seconds(2), "");
  EXPECT_TRUE(absl::IsDeadlineExceeded(error));
  EXPECT_EQ(error.message(),
            "[nccl_init] rank 0 of 4 timed out after 2.0 s waiting for ranks 1, 3 (they never "
            "reached communicator init under prefix \"job\": exited, hung earlier, or use another "
            "store, prefix or world size)");
  ASSERT_TRUE(MarkInitArrival(store, "job", 1).ok());
  error = InitTimeoutError(store, "job", 2, 4, absl::Seconds(2), "NCCL said: x");
  EXPECT_THAT(std::string(error.message()),
              HasSubstr("[nccl_init] rank 2 of 4 timed out after 2.0 s waiting for rank 3 (it "
                        "never reached"));
  EXPECT_THAT(std::string(error.message()), HasSubstr("; NCCL said: x"));
  ASSERT_TRUE(MarkInitArrival(store, "job", 3).ok());
  error = InitTimeoutError(store, "job", 2, 4, absl::Seconds(2), "");
  EXPECT_THAT(std::string(error.message()),
              HasSubstr("waiting for the communicator to connect (every rank reached"));
}

// Departures: found only for calls at or after the peer's first unrun one;
// a later, lower departure of the same rank replaces its first; the reason
// survives spaces; the message names the peer and why; a peer that stopped
// on its own comes before one that stopped because another had gone.
TEST(NcclRendezvousTest, GonePeersAreFoundForTheCallsTheyWillNotMake) {
  HashStore store;
  GoneCache cache;
  EXPECT_FALSE(FindGonePeer(store, "g", 0, 3, 5, cache).has_value());
  ASSERT_TRUE(PublishGone(store, "g", 2, 4, "its group was destroyed after issuing 4 calls").ok());
  EXPECT_FALSE(FindGonePeer(store, "g", 0, 3, 3, cache).has_value()) << "rank 2 made call #3";
  std::optional<GonePeer> gone = FindGonePeer(store, "g", 0, 3, 4, cache);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->rank, 2);
  EXPECT_EQ(gone->first_unrun, 4);
  EXPECT_EQ(gone->reason, "its group was destroyed after issuing 4 calls");
  // A rank's own departure is not its peer's.
  GoneCache own;
  EXPECT_FALSE(FindGonePeer(store, "g", 2, 3, 9, own).has_value());
  // Rank 1 broke at its call #1: the lowest-numbered peer gone before call 4
  // is found first; call #2 finds rank 1 only.
  ASSERT_TRUE(PublishGone(store, "g", 1, 1, "[all_reduce] rank 1 of 3: bad").ok());
  gone = FindGonePeer(store, "g", 0, 3, 2, cache);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->rank, 1);
  EXPECT_EQ(PeerGoneError("barrier", 0, 3, 2, *gone),
            absl::AbortedError("[barrier] rank 0 of 3: rank 1 will never make this call (call #2 "
                               "of this rank; rank 1 stopped before its call #1: [all_reduce] "
                               "rank 1 of 3: bad)"));
  // Rank 2 departs again, lower (a call of its destroyed group failed
  // later): the new number counts.
  ASSERT_TRUE(PublishGone(store, "g", 2, 0, "[barrier] rank 2 of 3: timed out").ok());
  gone = FindGonePeer(store, "g", 0, 3, 0, cache);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->rank, 2);
  EXPECT_EQ(gone->first_unrun, 0);
  // Both gone before call 4: the lower rank, unless its reason is another
  // peer's departure (a cascade): then the one that stopped on its own.
  gone = FindGonePeer(store, "g", 0, 3, 4, cache);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->rank, 1);
  ASSERT_TRUE(PublishGone(store, "g", 1, 1,
                          "[all_reduce] rank 1 of 3: rank 2 will never make this call (...)")
                  .ok());
  gone = FindGonePeer(store, "g", 0, 3, 4, cache);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->rank, 2);
  // Another prefix (another group) sees none of them.
  GoneCache other;
  EXPECT_FALSE(FindGonePeer(store, "h", 0, 3, 9, other).has_value());
}

}  // namespace
}  // namespace nccl
}  // namespace dist
