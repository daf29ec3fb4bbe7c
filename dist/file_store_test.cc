// Tests of FileStore: the Store operations, key escaping, atomic adds from
// threads, and two processes (fork) rendezvousing through one directory.
#include "dist/file_store.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dist {
namespace {

using ::testing::HasSubstr;

// A fresh directory under TEST_TMPDIR for each test.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/file_store_test.", ::getpid(), ".", name);
}

std::unique_ptr<FileStore> OpenStore(const std::string& dir,
                                     absl::Duration timeout = absl::Seconds(30)) {
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(dir, timeout);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

TEST(FileStoreTest, SetGetAddCheckDelete) {
  auto store = OpenStore(FreshDir("basic") + "/nested/dir/");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("a", "1").ok());
  ASSERT_TRUE(store->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(*store->Get("a"), std::string("x\0y", 3));
  EXPECT_EQ(*store->Add("n", 5), 5);
  EXPECT_EQ(*store->Add("n", -2), 3);
  EXPECT_EQ(*store->Get("n"), "3");
  EXPECT_TRUE(absl::IsInvalidArgument(store->Add("a", 1).status()));
  EXPECT_TRUE(*store->Check({"a", "n"}));
  EXPECT_FALSE(*store->Check({"a", "b"}));
  EXPECT_TRUE(*store->DeleteKey("a"));
  EXPECT_FALSE(*store->DeleteKey("a"));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set("", "v")));
  // A second store on the same directory sees the same keys.
  auto other = OpenStore(store->path());
  EXPECT_EQ(*other->Get("n"), "3");
}

TEST(FileStoreTest, KeysAreEscapedIntoFileNames) {
  auto store = OpenStore(FreshDir("escape"));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"nccl/unique_id", "../escape", ".hidden", "a b%",
                                         "x.lock"};
  for (const std::string& key : keys) ASSERT_TRUE(store->Set(key, "v:" + key).ok()) << key;
  for (const std::string& key : keys) EXPECT_EQ(*store->Get(key), "v:" + key) << key;
  EXPECT_EQ(store->PathForKey("nccl/unique_id"), store->path() + "/nccl%2Funique_id");
  EXPECT_EQ(store->PathForKey(".hidden"), store->path() + "/%2Ehidden");
  struct stat st;
  EXPECT_NE(::stat((store->path() + "/../escape").c_str(), &st), 0);  // stayed inside
}

// A run's keys go, with their lock files; a run whose name only begins
// alike, and the prefix's own key, stay.
TEST(FileStoreTest, KeysUnderAPrefixAreDeleted) {
  auto store = OpenStore(FreshDir("prefix"));
  ASSERT_NE(store, nullptr);
  for (const char* key : {"run1/restart0/a", "run1/restart0/split0/color1/seq/0", "run10/x",
                          "run1/restart0", "other"}) {
    ASSERT_TRUE(store->Set(key, "v").ok()) << key;
  }
  ASSERT_TRUE(store->Add("run1/restart0/finished", 1).ok());  // and its lock file
  ASSERT_TRUE(store->Add("run10/count", 1).ok());             // another run's lock file
  const std::string lock = store->path() + "/.locks/run1%2Frestart0%2Ffinished";
  struct stat st;
  ASSERT_EQ(::stat(lock.c_str(), &st), 0);
  EXPECT_EQ(*store->DeleteKeysUnder("run1/restart0"), 3);
  EXPECT_FALSE(*store->Check({"run1/restart0/a"}));
  EXPECT_FALSE(*store->Check({"run1/restart0/finished"}));
  EXPECT_TRUE(*store->Check({"run10/x", "run10/count", "run1/restart0", "other"}));
  EXPECT_EQ(::stat((store->path() + "/.locks/run10%2Fcount").c_str(), &st), 0);
  EXPECT_NE(::stat(lock.c_str(), &st), 0);
  EXPECT_EQ(*store->DeleteKeysUnder("run1/restart0"), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(store->DeleteKeysUnder("").status()));
}

TEST(FileStoreTest, WaitTimesOutNamingTheMissingKeys) {
  auto store = OpenStore(FreshDir("timeout"), absl::Milliseconds(100));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("rank/0", "").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store->Wait({"rank/0", "rank/1", "rank/2"});
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_EQ(s, absl::DeadlineExceededError(
                   "[file_store] wait timed out after 0.1 s; missing keys: rank/1, rank/2"));
  EXPECT_EQ(
      store->Get("nope", absl::Milliseconds(20)).status(),
      absl::DeadlineExceededError("[file_store] get timed out after 0.02 s; missing keys: nope"));
}

TEST(FileStoreTest, OpenFailsOnAFile) {
  const std::string file = FreshDir("not_a_dir");
  ASSERT_TRUE(OpenStore(file) != nullptr);
  auto store = OpenStore(file);
  ASSERT_TRUE(store->Set("k", "v").ok());
  absl::StatusOr<std::unique_ptr<FileStore>> bad = FileStore::Open(store->PathForKey("k"));
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("is not a directory"));
}

// A filesystem that takes no locks (Lustre without -o flock, NFS with nolock)
// fails every Add: the error says so, not only strerror's words.
TEST(FileStoreTest, ALockTheFilesystemRefusesIsNamed) {
  for (int err : {ENOSYS, ENOLCK, EOPNOTSUPP, EINVAL}) {
    EXPECT_TRUE(
        absl::StrContains(internal::FileLockHint(err), "the filesystem takes no file locks"))
        << err;
  }
  EXPECT_EQ(internal::FileLockHint(EIO), "");
}

TEST(FileStoreTest, ThreadsRendezvousAndAddAtomically) {
  const std::string dir = FreshDir("threads");
  std::vector<std::thread> threads;
  std::vector<std::string> seen(4);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto store = OpenStore(dir);  // each "rank" opens its own store
      ASSERT_NE(store, nullptr);
      for (int i = 0; i < 25; ++i) ASSERT_TRUE(store->Add("count", 1).ok());
      ASSERT_TRUE(store->Set(absl::StrCat("addr/", r), absl::StrCat("host:", 1000 + r)).ok());
      const std::vector<std::string> keys = {"addr/0", "addr/1", "addr/2", "addr/3"};
      ASSERT_TRUE(store->Wait(keys).ok());
      seen[r] = *store->Get(absl::StrCat("addr/", (r + 1) % 4));
      ASSERT_TRUE(StoreBarrier(*store, "done", 4, absl::Seconds(30)).ok());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(seen[r], absl::StrCat("host:", 1000 + (r + 1) % 4));
  EXPECT_EQ(*OpenStore(dir)->Get("count"), "100");
}

TEST(FileStoreTest, TwoProcessesRendezvous) {
  // The child plays rank 1: it publishes an id, waits for rank 0's, and adds
  // to a shared counter; exit status 0 means it saw what it expected.
  const std::string dir = FreshDir("fork");
  ASSERT_NE(OpenStore(dir), nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(dir, absl::Seconds(30));
    if (!store.ok()) ::_exit(2);
    for (int i = 0; i < 50; ++i) {
      if (!(*store)->Add("count", 1).ok()) ::_exit(3);
    }
    if (!(*store)->Set("id/1", "child").ok()) ::_exit(4);
    absl::StatusOr<std::string> peer = (*store)->Get("id/0");
    if (!peer.ok() || *peer != "parent") ::_exit(5);
    if (!StoreBarrier(**store, "end", 2, absl::Seconds(30)).ok()) ::_exit(6);
    ::_exit(0);
  }
  auto store = OpenStore(dir);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(store->Add("count", 1).ok());
  ASSERT_TRUE(store->Set("id/0", "parent").ok());
  EXPECT_EQ(*store->Get("id/1"), "child");
  EXPECT_TRUE(StoreBarrier(*store, "end", 2, absl::Seconds(30)).ok());
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  EXPECT_EQ(*store->Get("count"), "100");
}

}  // namespace
}  // namespace dist
