// Tests of HashStore, PrefixStore and StoreBarrier.
#include "dist/store.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dist {
namespace {

using ::testing::HasSubstr;

TEST(HashStoreTest, SetGetAddCheckDelete) {
  HashStore store;
  EXPECT_EQ(store.timeout(), DefaultStoreTimeout());
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("a", std::string("x\0y", 3)).ok());  // overwrite; any bytes
  EXPECT_EQ(*store.Get("a"), std::string("x\0y", 3));
  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -2), 3);
  EXPECT_EQ(*store.Get("n"), "3");
  EXPECT_TRUE(absl::IsInvalidArgument(store.Add("a", 1).status()));
  EXPECT_TRUE(*store.Check({"a", "n"}));
  EXPECT_FALSE(*store.Check({"a", "b"}));
  EXPECT_TRUE(*store.DeleteKey("a"));
  EXPECT_FALSE(*store.DeleteKey("a"));
  EXPECT_FALSE(*store.Check({"a"}));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set("", "v")));
}

TEST(HashStoreTest, WaitTimesOutNamingTheMissingKeys) {
  HashStore store(absl::Milliseconds(100));
  ASSERT_TRUE(store.Set("rank/0", "").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store.Wait({"rank/0", "rank/1", "rank/2"});
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_EQ(s, absl::DeadlineExceededError(
                   "[hash_store] wait timed out after 0.1 s; missing keys: rank/1, rank/2"));
  absl::StatusOr<std::string> got = store.Get("nope", absl::Milliseconds(20));
  EXPECT_EQ(got.status(), absl::DeadlineExceededError(
                              "[hash_store] get timed out after 0.02 s; missing keys: nope"));
}

TEST(HashStoreTest, GetWaitsForAnotherThread) {
  HashStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE(store.Set("id", "abc").ok());
  });
  absl::StatusOr<std::string> got = store.Get("id", absl::Seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abc");
  setter.join();
}

TEST(HashStoreTest, ConcurrentAddsAreAtomic) {
  HashStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) ASSERT_TRUE(store.Add("count", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store.Get("count"), "1000");
}

TEST(PrefixStoreTest, KeysLiveUnderThePrefix) {
  HashStore base(absl::Milliseconds(50));
  PrefixStore a("group_a", &base), b("group_b", &base);
  ASSERT_TRUE(a.Set("k", "va").ok());
  ASSERT_TRUE(b.Set("k", "vb").ok());
  EXPECT_EQ(*a.Get("k"), "va");
  EXPECT_EQ(*b.Get("k"), "vb");
  EXPECT_EQ(*base.Get("group_a/k"), "va");
  EXPECT_EQ(*a.Add("n", 2), 2);
  EXPECT_TRUE(*a.Check({"k", "n"}));
  EXPECT_FALSE(*b.Check({"n"}));
  EXPECT_TRUE(*b.DeleteKey("k"));
  absl::Status s = b.Wait({"k"}, absl::Milliseconds(10));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing keys: group_b/k"));
}

TEST(StoreBarrierTest, ReleasesAllOrTimesOut) {
  HashStore store;
  std::vector<std::thread> threads;
  std::vector<absl::Status> statuses(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      absl::SleepFor(absl::Milliseconds(10 * r));
      statuses[r] = StoreBarrier(store, "start", 3, absl::Seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  absl::Status lonely = StoreBarrier(store, "end", 2, absl::Milliseconds(20));
  EXPECT_EQ(lonely, absl::DeadlineExceededError(
                        "[store_barrier] end: timed out after 0.02 s with 1 of 2 arrived"));
}

}  // namespace
}  // namespace dist
