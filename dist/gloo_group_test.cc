// The gloo engine across real processes: each test forks 1 to 4 ranks that
// rendezvous through a FileStore under TEST_TMPDIR (or a Redis server started
// here) on 127.0.0.1 and check every collective; failure cases check that a
// missing or dead peer fails the others fast with a message naming the op.
#include "dist/gloo_group.h"

#include <hiredis.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "dist/host_name.h"
#include "dist/process_testing.h"
#include "dist/redis_keys.h"
#include "dist/redis_testing.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Dtype;
using tensor::Tensor;
using testing::ExpectAllOk;
using testing::LimitAddressSpace;
using testing::Outcome;
using testing::RunProcesses;
using testing::TmpDir;

std::string CheckAllCollectives(ProcessGroup& pg) {
  const int rank = pg.rank();
  const int n = pg.size();
  if (pg.backend() != "gloo") return "backend is not gloo";
  // all_reduce sum / avg / max, f32.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<float> v(1000);
    for (int i = 0; i < 1000; ++i) v[i] = static_cast<float>((rank + 1) * i % 7 + rank);
    Tensor t = Tensor::FromData<float>(v, {10, 100});
    RETURN_IF_ERROR_MSG(pg.AllReduceSync(t, op));
    std::vector<float> got = t.ToVector<float>();
    for (int i = 0; i < 1000; ++i) {
      float sum = 0, mx = -1e30f, mn = 1e30f;
      for (int r = 0; r < n; ++r) {
        float x = static_cast<float>((r + 1) * i % 7 + r);
        sum += x;
        mx = std::max(mx, x);
        mn = std::min(mn, x);
      }
      float want = op == ReduceOp::kSum ? sum
                   : op == ReduceOp::kAvg ? sum / n
                   : op == ReduceOp::kMax ? mx
                                          : mn;
      EXPECT_OR_MSG(std::fabs(got[i] - want) < 1e-4,
                    absl::StrCat("all_reduce ", ReduceOpName(op), " [", i, "] = ", got[i],
                                 " want ", want));
    }
  }
  // all_reduce on bf16, f16, i32, i64.
  for (Dtype dt : {Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64}) {
    std::vector<float> v = {1.0f * (rank + 1), -2.0f, 3.0f * rank};
    Tensor t = Tensor::FromData<float>(v, {3}).To(dt);
    RETURN_IF_ERROR_MSG(pg.AllReduceSync(t, ReduceOp::kSum));
    EXPECT_OR_MSG(t.dtype() == dt, "dtype changed");
    std::vector<float> got = t.ToVector<float>();
    const float want0 = n * (n + 1) / 2.0f, want1 = -2.0f * n, want2 = 3.0f * n * (n - 1) / 2;
    EXPECT_OR_MSG(got[0] == want0 && got[1] == want1 && got[2] == want2,
                  absl::StrCat("all_reduce sum ", tensor::DtypeName(dt), " got ", got[0], ",",
                               got[1], ",", got[2]));
  }
  // reduce_scatter: input (n * 4), out (4).
  {
    std::vector<float> v(n * 4);
    for (int i = 0; i < n * 4; ++i) v[i] = static_cast<float>(i * (rank + 1));
    Tensor in = Tensor::FromData<float>(v, {n * 4});
    Tensor out = Tensor::Empty({4});
    RETURN_IF_ERROR_MSG(pg.ReduceScatterSync(in, out, ReduceOp::kSum));
    std::vector<float> got = out.ToVector<float>();
    for (int j = 0; j < 4; ++j) {
      const float want = static_cast<float>((rank * 4 + j) * n * (n + 1) / 2);
      EXPECT_OR_MSG(got[j] == want, absl::StrCat("reduce_scatter [", j, "] = ", got[j], " want ",
                                                 want));
    }
    // bf16 reduce_scatter, in place on the own chunk.
    Tensor inb = Tensor::FromData<float>(std::vector<float>(n * 2, 1.5f), {n * 2}).To(Dtype::kBF16);
    Tensor own = inb.Narrow(0, rank * 2, 2);
    RETURN_IF_ERROR_MSG(pg.ReduceScatterSync(inb, own, ReduceOp::kAvg));
    std::vector<float> g = own.ToVector<float>();
    EXPECT_OR_MSG(g[0] == 1.5f && g[1] == 1.5f, "reduce_scatter bf16 avg");
  }
  // all_gather into a flat buffer, in place (FSDP layout) and not.
  {
    Tensor out = Tensor::Empty({n * 3}, Dtype::kI64);
    Tensor in = Tensor::FromData<int64_t>({rank * 10LL, rank * 10LL + 1, rank * 10LL + 2}, {3});
    RETURN_IF_ERROR_MSG(pg.AllGatherSync(in, out));
    std::vector<int64_t> got = out.ToVector<int64_t>();
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < 3; ++j) {
        EXPECT_OR_MSG(got[r * 3 + j] == r * 10 + j, "all_gather i64");
      }
    }
    Tensor flat = Tensor::Empty({n * 2});
    Tensor mine = flat.Narrow(0, rank * 2, 2);
    mine.CopyFrom(Tensor::FromData<float>({rank + 0.5f, -rank - 0.5f}, {2}));
    RETURN_IF_ERROR_MSG(pg.AllGatherSync(mine, flat));
    std::vector<float> g = flat.ToVector<float>();
    for (int r = 0; r < n; ++r) {
      EXPECT_OR_MSG(g[2 * r] == r + 0.5f && g[2 * r + 1] == -r - 0.5f, "all_gather in place");
    }
  }
  // broadcast from every root.
  for (int root = 0; root < n; ++root) {
    Tensor t = Tensor::FromData<float>({rank * 1.0f, rank * 2.0f, 7.0f}, {3});
    RETURN_IF_ERROR_MSG(pg.BroadcastSync(t, root));
    std::vector<float> g = t.ToVector<float>();
    EXPECT_OR_MSG(g[0] == root && g[1] == 2.0f * root && g[2] == 7.0f, "broadcast");
  }
  RETURN_IF_ERROR_MSG(pg.BarrierSync());
  // Async: several calls in flight, completed in order.
  {
    Tensor a = Tensor::FromData<float>({1.0f}, {1});
    Tensor b = Tensor::FromData<float>({2.0f}, {1});
    WorkPtr wa = pg.AllReduce(a);
    WorkPtr wb = pg.AllReduce(b, ReduceOp::kMax);
    RETURN_IF_ERROR_MSG(wb->Wait());
    EXPECT_OR_MSG(wa->IsCompleted(), "earlier work not completed");
    RETURN_IF_ERROR_MSG(wa->Wait());
    EXPECT_OR_MSG(a.ToVector<float>()[0] == n && b.ToVector<float>()[0] == 2.0f, "async");
  }
  // Mismatched calls fail on every rank, naming them; the group stays usable.
  {
    Tensor t = Tensor::Empty({rank == 0 ? 4 : 5});
    absl::Status s = pg.AllReduceSync(t);
    EXPECT_OR_MSG(!s.ok() && absl::StrContains(s.message(), "mismatched") &&
                      absl::StrContains(s.message(), "rank 0: all_reduce(sum, f32, 4 elements)"),
                  absl::StrCat("mismatch status: ", s.ToString()));
    RETURN_IF_ERROR_MSG(pg.BarrierSync());
  }
  // Split: even/odd ranks, ordered by descending key.
  {
    auto sub = pg.Split(rank % 2, -rank);
    RETURN_IF_ERROR_MSG(sub.status());
    ProcessGroup& g = **sub;
    const int members = (n - rank % 2 + 1) / 2;
    EXPECT_OR_MSG(g.size() == members, absl::StrCat("split size ", g.size()));
    Tensor t = Tensor::FromData<int32_t>({rank}, {1});
    RETURN_IF_ERROR_MSG(g.AllReduceSync(t));
    int want = 0;
    for (int r = rank % 2; r < n; r += 2) want += r;
    EXPECT_OR_MSG(t.ToVector<int32_t>()[0] == want, "split all_reduce");
    // Rank order: descending parent rank.
    Tensor me = Tensor::FromData<int32_t>({rank}, {1});
    Tensor all = Tensor::Empty({members}, Dtype::kI32);
    RETURN_IF_ERROR_MSG(g.AllGatherSync(me, all));
    std::vector<int32_t> order = all.ToVector<int32_t>();
    for (int i = 1; i < members; ++i) EXPECT_OR_MSG(order[i - 1] > order[i], "split order");
  }
  return "";
}

GlooGroupOptions FileOptions(const std::string& dir, absl::Duration timeout) {
  GlooGroupOptions opt;
  opt.store = dir;
  opt.timeout = timeout;
  return opt;
}

class GlooGroupSizes : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroupSizes, EveryCollectiveThroughFileStore) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(GetParam(), [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    return CheckAllCollectives(**pg);
  });
  ExpectAllOk(o);
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooGroupSizes, ::testing::Values(2, 3));

// A second run into the same directory under the same prefix fails at once
// on every rank, naming the earlier claim (its keys -- the peers' addresses
// -- would otherwise be read as this run's); under a fresh prefix it connects.
TEST(GlooGroup, ARunUnderAPrefixAnEarlierRunUsedFailsAtOnce) {
  const std::string dir = TmpDir("reused");
  auto run = [&](const std::string& prefix) {
    return RunProcesses(2, [&](int rank, int size) -> std::string {
      GlooGroupOptions options = FileOptions(dir, absl::Seconds(30));
      options.prefix = prefix;
      const absl::Time start = absl::Now();
      auto pg = CreateGlooProcessGroup(rank, size, options);
      if (!pg.ok()) {
        if (absl::Now() - start > absl::Seconds(10)) return "failed, but slowly";
        return pg.status().ToString();
      }
      return std::string((*pg)->BarrierSync().ok() ? "" : "barrier failed");
    });
  };
  ExpectAllOk(run("job"));
  const Outcome again = run("job");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(absl::StrContains(
        again.messages[rank],
        absl::StrCat("FAILED_PRECONDITION: [rendezvous] rank ", rank,
                     " of 2: the store already holds rank ", rank,
                     "'s keys under prefix \"job\"")))
        << "rank " << rank << ": " << again.messages[rank];
  }
  ExpectAllOk(run("job2"));
}

// A run that ended well removes its keys from a shared folder store: each
// rank the files it wrote (the world group's and a split's), after a
// barrier. The folder keeps only what was there before (another job's
// file), and a new run under the same prefix connects.
TEST(GlooGroup, EveryRankRemovesTheKeyFilesItWrote) {
  const std::string dir = TmpDir("shared_store");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", dir, " && echo x > ", dir, "/other").c_str()),
            0);
  auto run = [&]() {
    return RunProcesses(3, [&](int rank, int size) -> std::string {
      auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
      if (!pg.ok()) return pg.status().ToString();
      auto sub = (*pg)->Split(rank % 2, rank);
      if (!sub.ok()) return sub.status().ToString();
      if (!(*pg)->BarrierSync().ok()) return "barrier failed";
      absl::StatusOr<int> removed = RemoveOwnFolderStoreKeys(**pg);
      if (!removed.ok()) return removed.status().ToString();
      if (*removed < 2) return absl::StrCat("removed ", *removed, " files");
      return std::string((*pg)->BarrierSync().ok() ? "" : "barrier after removing failed");
    });
  };
  ExpectAllOk(run());
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"other"});
  ExpectAllOk(run());  // the prefix is free again
}

// An infinite timeout waits as long as it takes (gloo multiplies its
// timeouts: the engine hands it 30 days, not INT64_MAX ms, which wrapped).
TEST(GlooGroup, AnInfiniteTimeoutConnectsAndReduces) {
  const std::string dir = TmpDir("infinite");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::InfiniteDuration()));
    if (!pg.ok()) return pg.status().ToString();
    Tensor t = Tensor::FromData<float>({1.0f + rank}, {1});
    RETURN_IF_ERROR_MSG((*pg)->AllReduceSync(t));
    EXPECT_OR_MSG(t.ToVector<float>()[0] == 3.0f, "all_reduce");
    return "";
  });
  ExpectAllOk(o);
}

TEST(GlooGroup, PeerThatNeverCallsTimesOutNamingTheCollective) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    if (rank == 0) {
      sleep(6);  // Joined, but never calls the all_reduce.
      return "";
    }
    Tensor t = Tensor::Empty({8});
    const absl::Time start = absl::Now();
    absl::Status s = (*pg)->AllReduceSync(t, ReduceOp::kSum,
                                          CollectiveOptions::WithTimeout(absl::Seconds(2)));
    const absl::Duration took = absl::Now() - start;
    if (s.code() != absl::StatusCode::kDeadlineExceeded ||
        !absl::StrContains(s.message(), "[all_reduce] rank 1 of 2 timed out after 2.0 s "
                                        "waiting for rank 0")) {
      return absl::StrCat("unexpected status: ", s.ToString());
    }
    if (took > absl::Seconds(4)) return absl::StrCat("took ", absl::FormatDuration(took));
    // Later calls fail at once with the same error.
    absl::Status later = (*pg)->BarrierSync();
    if (later.ok() || !absl::StrContains(later.message(), "unusable")) {
      return absl::StrCat("later call: ", later.ToString());
    }
    return "";
  });
  ExpectAllOk(o);
}

TEST(GlooGroup, PeerThatExitsFailsTheOtherFast) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    if (rank == 0) _exit(0);  // Leaves without a word.
    Tensor t = Tensor::Empty({8});
    const absl::Time start = absl::Now();
    absl::Status s = (*pg)->BroadcastSync(t, 0, CollectiveOptions::WithTimeout(absl::Seconds(20)));
    const absl::Duration took = absl::Now() - start;
    if (s.ok() || !absl::StrContains(s.message(), "[broadcast] rank 1 of 2")) {
      return absl::StrCat("unexpected status: ", s.ToString());
    }
    if (took > absl::Seconds(5)) {
      return absl::StrCat("took ", absl::FormatDuration(took), ": ", s.ToString());
    }
    return "";
  });
  ExpectAllOk(o);
}

// Two "nodes" launched with different --nproc_per_node: node 0 runs ranks 0
// and 1 of 4, node 1 rank 1 of 2. Every rank fails at once naming the
// layouts (the rank that found it, for the others; or, of the two processes
// started as rank 1, the one that claimed it second, the claim), instead of
// timing out (or pairing with the wrong peer).
TEST(GlooGroup, NodesLaunchedDifferentlyFailAtOnceNamingTheLayouts) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(3, [&](int process, int) -> std::string {
    const int rank = process == 2 ? 1 : process;
    const int size = process == 2 ? 2 : 4;
    GlooGroupOptions options = FileOptions(dir, absl::Seconds(20));
    options.local_rank = process == 2 ? 0 : process;
    options.local_world_size = process == 2 ? 1 : 2;
    const absl::Time start = absl::Now();
    auto pg = CreateGlooProcessGroup(rank, size, options);
    if (pg.ok()) return "joined";
    if (absl::Now() - start > absl::Seconds(10)) return "took the timeout";
    const std::string found =
        "[rendezvous] rank 1 of 2 found the nodes launched differently: ranks 0-1 run 2 per node "
        "in a world of 4; this rank's node: rank 1 runs 1 per node in a world of 2. Every node's "
        "launch must give the same --nnodes and --nproc_per_node";
    const std::string expected =
        process == 2 ? found
                     : absl::StrCat("[rendezvous] rank ", rank, " of 4: ", found.substr(13));
    if (absl::IsInvalidArgument(pg.status()) && pg.status().message() == expected) return "";
    // When node 0's local rank 0 finds the node of the process started as
    // rank 1 of 2 inside its own (that process published its layout before
    // node 0 did, whether it claimed rank 1 or not), every rank may fail
    // with node 0's verdict.
    const std::string inside =
        "found the nodes launched differently: rank 1 runs 1 per node in a world of 2, inside "
        "the node where ranks 0-1 run 2 per node in a world of 4";
    if (absl::IsInvalidArgument(pg.status()) &&
        absl::StrContains(pg.status().message(), inside)) {
      return "";
    }
    // The two processes started as rank 1: the one that claimed it second may
    // say so instead (after publishing its node's layout for the others).
    const std::string claimed = absl::StrCat("[rendezvous] rank 1 of ", size,
                                             ": the store already holds rank 1's keys");
    if (rank == 1 && absl::IsFailedPrecondition(pg.status()) &&
        absl::StartsWith(pg.status().message(), claimed)) {
      return "";
    }
    return absl::StrCat("process ", process, ": ", pg.status().ToString());
  });
  ExpectAllOk(o);
}

// A node launched as if alone (--nnodes=1: ranks 0-1 of 2) beside one launched
// for two nodes (ranks 2-3 of 4): the latter's two ranks both find the
// disagreement (one writes it, neither fails on the other's write), and the
// lone node, whose own walk ends at its world size, fails too (on their
// verdict, or on the node it sees at rank 2) instead of training alone.
TEST(GlooGroup, ANodeLaunchedAsIfAloneFailsToo) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(4, [&](int process, int) -> std::string {
    const bool alone = process < 2;
    if (alone) absl::SleepFor(absl::Seconds(1));  // the others are there first
    GlooGroupOptions options = FileOptions(dir, absl::Seconds(20));
    options.local_rank = process % 2;
    options.local_world_size = 2;
    auto pg = CreateGlooProcessGroup(process, alone ? 2 : 4, options);
    if (pg.ok()) return absl::StrCat("process ", process, " joined");
    if (!absl::IsInvalidArgument(pg.status()) ||
        !absl::StrContains(pg.status().message(), "launched differently") ||
        !absl::StrContains(pg.status().message(), "Every node's launch must give the same")) {
      return absl::StrCat("process ", process, ": ", pg.status().ToString());
    }
    return "";
  });
  ExpectAllOk(o);
}

// Nodes of different sizes (as torchrun allows) agree: 2 ranks on the first,
// 1 on the second; the group connects and reduces.
TEST(GlooGroup, NodesOfDifferentSizesConnect) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(3, [&](int rank, int size) -> std::string {
    GlooGroupOptions options = FileOptions(dir, absl::Seconds(20));
    options.local_rank = rank == 2 ? 0 : rank;
    options.local_world_size = rank == 2 ? 1 : 2;
    auto pg = CreateGlooProcessGroup(rank, size, options);
    if (!pg.ok()) return pg.status().ToString();
    Tensor t = Tensor::Full({4}, 1.0);
    RETURN_IF_ERROR_MSG((*pg)->AllReduceSync(t, ReduceOp::kSum));
    EXPECT_OR_MSG(t.ToVector<float>()[0] == 3.0f, "wrong sum");
    return "";
  });
  ExpectAllOk(o);
}

// A node that never comes is named by its first rank.
TEST(GlooGroup, ANodeThatNeverArrivesIsNamed) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(1, [&](int, int) -> std::string {
    GlooGroupOptions options = FileOptions(dir, absl::Seconds(1));
    options.local_world_size = 1;
    auto pg = CreateGlooProcessGroup(0, 3, options);
    if (absl::IsDeadlineExceeded(pg.status()) &&
        absl::StrContains(pg.status().message(),
                          "[rendezvous] rank 0 of 3: the node whose first rank is 1 did not "
                          "arrive in time (its launcher has not started its local rank 0, or uses "
                          "another rendezvous endpoint or id); so far rank 0 runs 1 per node in a "
                          "world of 3")) {
      return "";
    }
    return pg.status().ToString();
  });
  ExpectAllOk(o);
}

// A rank that runs out of memory staging a call (a bf16 all-reduce is reduced
// as f32) says so in the descriptor exchange, before any data moves: both
// ranks fail with ResourceExhausted naming it, and the group stays in step.
TEST(GlooGroup, ARankOutOfMemoryWhileStagingFailsEveryRankAndKeepsTheGroup) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve more address space than an RLIMIT_AS allows";
#endif
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    Tensor t = Tensor::Full({int64_t{1} << 26}, 1.0, Dtype::kBF16);  // 128 MiB; 256 MiB as f32
    if (rank == 1 && !LimitAddressSpace(int64_t{64} << 20)) return "setrlimit failed";
    const absl::Status s = (*pg)->AllReduceSync(t, ReduceOp::kSum);
    const std::string expected =
        rank == 1 ? "[all_reduce] rank 1 of 2: out of memory staging the call's buffers ("
                  : "[all_reduce] rank 0 of 2: rank 1 ran out of memory staging the call's "
                    "buffers; the call did nothing on any rank";
    if (s.code() != absl::StatusCode::kResourceExhausted ||
        !absl::StrContains(s.message(), expected)) {
      return absl::StrCat("rank ", rank, ": unexpected status: ", s.ToString());
    }
    if (t.Narrow(0, 0, 1).ToVector<float>()[0] != 1.0f) return "the input changed";
    // Still in step: a small all-reduce works on both ranks.
    Tensor small = Tensor::Full({4}, rank + 1.0);
    RETURN_IF_ERROR_MSG((*pg)->AllReduceSync(small, ReduceOp::kSum));
    EXPECT_OR_MSG(small.ToVector<float>()[3] == 3.0f, "the next all-reduce is wrong");
    return "";
  });
  ExpectAllOk(o);
}

// Three ranks, one exits: the rank that reads from it (the all-gather ring's
// rank 0 reads from rank 2) names it and its pid, not "one of ranks 1, 2".
TEST(GlooGroup, APeerWhoseProcessExitedIsNamed) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(3, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    Tensor mine = Tensor::FromVector({static_cast<float>(::getpid())}, {1});
    Tensor pids = Tensor::Empty({3});
    absl::Status s = (*pg)->AllGatherSync(mine, pids);
    if (!s.ok()) return s.ToString();
    if (rank == 2) _exit(0);  // Leaves without a word.
    Tensor t = Tensor::Empty({8});
    s = (*pg)->AllReduceSync(t, ReduceOp::kSum, CollectiveOptions::WithTimeout(absl::Seconds(5)));
    if (s.ok()) return "no error";
    if (rank == 1) return "";  // reads from rank 0, which fails: either error
    const std::string want = absl::StrCat(
        "lost a peer: rank 2 exited (pid ", static_cast<int64_t>(pids.ToVector<float>()[2]),
        " on this host)");
    if (absl::StrContains(s.message(), want)) return "";
    return absl::StrCat("no '", want, "' in ", s.ToString());
  });
  ExpectAllOk(o);
}

// Four ranks, rank 1 leaves the group but not its process (it destroys its
// group, as after an error of its own): rank 2, which reads from it first
// (the descriptors' all-gather ring), names it by the address gloo's error
// holds for it (its end of their connection, or where it listened: each
// pair has a socket of its own, so no one address would do for every peer),
// not by ranks 0 and 3, which exit after failing too.
TEST(GlooGroup, APeerThatLeftTheGroupIsNamedByItsAddress) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(4, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    Tensor mine = Tensor::FromVector({static_cast<float>(::getpid())}, {1});
    Tensor pids = Tensor::Empty({4});
    absl::Status s = (*pg)->AllGatherSync(mine, pids);
    if (!s.ok()) return s.ToString();
    if (rank == 1) {
      pg->reset();  // its connections close; the process stays while the others fail
      absl::SleepFor(absl::Seconds(4));
      return "";
    }
    Tensor t = Tensor::Empty({8});
    s = (*pg)->AllReduceSync(t, ReduceOp::kSum, CollectiveOptions::WithTimeout(absl::Seconds(5)));
    if (s.ok()) return "no error";
    if (rank != 2) return "";  // they read from a rank that failed: either error
    const std::string want = absl::StrCat(
        "lost a peer: rank 1 (on ", HostName().substr(0, 63), ", [");
    const std::string alive = absl::StrCat(
        "): its connection closed while its process (pid ",
        static_cast<int64_t>(pids.ToVector<float>()[1]), ") still runs: it left the group");
    if (absl::StrContains(s.message(), want) && absl::StrContains(s.message(), alive)) return "";
    return absl::StrCat("no '", want, "...", alive, "' in ", s.ToString());
  });
  ExpectAllOk(o);
}

// Gloo's errors print one of two addresses for a peer: its end of the
// connection, or where it listened, when it connected before this rank read
// that from the store. Which end of a connection listens is decided by the
// two ends' ports; rank 1 joins late so that when rank 0 listened, rank 1
// connected first. 8 groups of 2 in turn (rank 0 listens in about half:
// about 1 run in 256 has none where it does), rank 1 leaving each.
TEST(GlooGroup, APeerThatLeftIsNamedWhicheverEndListened) {
  const std::string dir = TmpDir("store_left");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    for (int i = 0; i < 8; ++i) {
      GlooGroupOptions options = FileOptions(dir, absl::Seconds(10));
      options.prefix = absl::StrCat("left", i);
      if (rank == 1) absl::SleepFor(absl::Milliseconds(50));
      auto pg = CreateGlooProcessGroup(rank, size, options);
      if (!pg.ok()) return pg.status().ToString();
      const std::string said = absl::StrCat(dir, "/said", i);
      if (rank == 1) {
        pg->reset();  // its connection closes; it runs on until rank 0 has said who left
        const absl::Time deadline = absl::Now() + absl::Seconds(10);
        while (!std::ifstream(said).good() && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        continue;
      }
      Tensor t = Tensor::Empty({8});
      absl::Status s = (*pg)->AllReduceSync(t, ReduceOp::kSum,
                                            CollectiveOptions::WithTimeout(absl::Seconds(5)));
      std::ofstream(said) << "said";
      if (s.ok()) return "no error";
      if (!absl::StrContains(s.message(), "lost a peer: rank 1 (on ") ||
          !absl::StrContains(s.message(), "still runs: it left the group")) {
        return absl::StrCat("group ", i, ": ", s.ToString());
      }
    }
    return "";
  });
  ExpectAllOk(o);
}

// Errors in a subgroup (HYBRID_SHARD's replicas: Split(rank % 2) of 4 gives
// {0, 2} and {1, 3}) name the ranks with the world's, as the threads
// engine's do: rank 3 exits, and rank 1 of the world (0 of its group) names
// "rank 1 (world 3)", not its own world rank; rank 2 never calls, and rank 0
// times out waiting for "rank 1 (world 2)".
TEST(GlooGroup, ASubgroupsErrorsNameTheWorldRanks) {
  const std::string dir = TmpDir("store_subgroup");
  Outcome o = RunProcesses(4, [&](int rank, int size) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, size, FileOptions(dir, absl::Seconds(30)));
    if (!pg.ok()) return pg.status().ToString();
    Tensor mine = Tensor::FromVector({static_cast<float>(::getpid())}, {1});
    Tensor pids = Tensor::Empty({4});
    absl::Status s = (*pg)->AllGatherSync(mine, pids);
    if (!s.ok()) return s.ToString();
    absl::StatusOr<std::unique_ptr<ProcessGroup>> sub = (*pg)->Split(rank % 2);
    if (!sub.ok()) return sub.status().ToString();
    if (rank == 3) _exit(0);  // leaves without a word
    const std::string timed_out = absl::StrCat(dir, "/rank0_timed_out");
    if (rank == 2) {  // never calls; runs until rank 0 has timed out
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (!std::ifstream(timed_out).good() && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      return "";
    }
    Tensor t = Tensor::Empty({8});
    s = (*sub)->AllReduceSync(t, ReduceOp::kSum,
                              CollectiveOptions::WithTimeout(absl::Seconds(rank == 0 ? 2 : 20)));
    if (rank == 0) std::ofstream(timed_out) << "done";
    if (s.ok()) return "no error";
    const std::string want =
        rank == 0 ? "[all_reduce] rank 0 of 2 in group world/split0/color0 timed out after 2.0 s "
                    "waiting for rank 1 (world 2)"
                  : absl::StrCat("[all_reduce] rank 0 of 2 in group world/split0/color1: lost a "
                                 "peer: "
                                 "rank 1 (world 3) exited (pid ",
                                 static_cast<int64_t>(pids.ToVector<float>()[3]),
                                 " on this host)");
    if (!absl::StrContains(s.message(), want)) {
      return absl::StrCat("no '", want, "' in ", s.ToString());
    }
    return "";
  });
  ExpectAllOk(o);
}

TEST(GlooGroup, RankThatNeverJoinsFailsTheRendezvous) {
  const std::string dir = TmpDir("store");
  Outcome o = RunProcesses(1, [&](int rank, int) -> std::string {
    auto pg = CreateGlooProcessGroup(rank, 2, FileOptions(dir, absl::Seconds(2)));
    if (pg.ok()) return "joined a group whose peer never came";
    if (!absl::StrContains(pg.status().message(), "rank 0 of 2") ||
        !absl::StrContains(pg.status().message(),
                           "; rank 1 never joined (not started, or started with another store "
                           "or run id: --rdzv, RUN_ID)")) {
      return pg.status().ToString();
    }
    return "";
  }, absl::Seconds(30));
  ExpectAllOk(o);
  EXPECT_LT(o.elapsed, absl::Seconds(20));
}

// A rank that fails before joining (its --data missing on its node) says
// so in the store: its peer, waiting for it in the rendezvous with a 120 s
// timeout, fails at once naming it and why. Either rank: rank 0 waits in
// gloo's store wait for rank 1's address, rank 1 in its read of rank 0's.
TEST(GlooGroup, ARankThatFailedBeforeJoiningEndsItsPeersRendezvous) {
  for (int failed : {1, 0}) {
    const std::string dir = TmpDir(absl::StrCat("store_failed", failed));
    Outcome o = RunProcesses(2, [&](int rank, int) -> std::string {
      const GlooGroupOptions options = FileOptions(dir, absl::Seconds(120));
      if (rank == failed) {
        absl::SleepFor(absl::Milliseconds(300));
        absl::StatusOr<bool> said =
            AnnounceGlooFailure(rank, 2, options, "--data=/nfs/x.bin: no such file");
        if (!said.ok() || !*said) return "the failure was not said";
        return "";
      }
      auto pg = CreateGlooProcessGroup(rank, 2, options);
      if (pg.ok()) return "joined a group whose peer failed";
      const std::string want = absl::StrCat(
          "[rendezvous] rank ", rank, " of 2: rank ", failed, " (host ");
      if (pg.status().code() != absl::StatusCode::kAborted ||
          !absl::StrContains(pg.status().message(), want) ||
          !absl::StrContains(pg.status().message(),
                             ") failed before joining: --data=/nfs/x.bin: no such file")) {
        return pg.status().ToString();
      }
      return "";
    }, absl::Seconds(150));
    ExpectAllOk(o);
    EXPECT_LT(o.elapsed, absl::Seconds(60)) << "rank " << failed << " failed";
  }
}

// The ranks of a node often fail at once: each says so (Gloo's stores
// refuse to set a key twice, so the mark is set once), and a rank waiting
// for them names the lowest.
TEST(GlooGroup, RanksThatFailTogetherEachSaySo) {
  const std::string dir = TmpDir("store_failed_together");
  const GlooGroupOptions options = FileOptions(dir, absl::Seconds(60));
  for (int rank : {2, 1}) {
    absl::StatusOr<bool> said = AnnounceGlooFailure(rank, 3, options, "--data: missing");
    ASSERT_TRUE(said.ok()) << said.status();
    EXPECT_TRUE(*said);
  }
  auto pg = CreateGlooProcessGroup(0, 3, options);
  ASSERT_FALSE(pg.ok());
  EXPECT_TRUE(absl::IsAborted(pg.status())) << pg.status();
  EXPECT_TRUE(absl::StrContains(pg.status().message(), "rank 0 of 3: rank 1 (host "))
      << pg.status();
}

// A rank that joined says nothing: its peers learn of its failure from the
// group.
TEST(GlooGroup, ARankThatJoinedAnnouncesNoFailure) {
  const std::string dir = TmpDir("store_joined");
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    const GlooGroupOptions options = FileOptions(dir, absl::Seconds(30));
    auto pg = CreateGlooProcessGroup(rank, size, options);
    if (!pg.ok()) return pg.status().ToString();
    absl::StatusOr<bool> said = AnnounceGlooFailure(rank, size, options, "a later failure");
    if (!said.ok()) return said.status().ToString();
    return *said ? "a rank that joined said it failed before joining" : "";
  }, absl::Seconds(60));
  ExpectAllOk(o);
}

// Rank 1 alone: gloo reads rank 0's address with a store get, which now waits
// the group's 2 s, not the file store's own 30 s default.
TEST(GlooGroup, AHigherRankWaitsTheGroupsTimeoutForALowerOne) {
  const std::string dir = TmpDir("store_rank1");
  Outcome o = RunProcesses(1, [&](int, int) -> std::string {
    auto pg = CreateGlooProcessGroup(1, 2, FileOptions(dir, absl::Seconds(2)));
    if (pg.ok()) return "joined a group whose rank 0 never came";
    if (!absl::StrContains(pg.status().message(), "within 2")) return pg.status().ToString();
    return "";
  }, absl::Seconds(60));
  ExpectAllOk(o);
  EXPECT_LT(o.elapsed, absl::Seconds(20));
}

// A redis-server of this test's own, or a skip when none is installed.
#define START_REDIS_OR_SKIP(server)                                                         \
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start(); \
  ASSERT_TRUE(server.ok()) << server.status();                                              \
  if (*server == nullptr) GTEST_SKIP() << "redis-server is not installed: skipping the Redis case"

TEST(GlooGroup, RendezvousThroughRedis) {
  START_REDIS_OR_SKIP(redis);
  const std::string store = (*redis)->store();
  Outcome o = RunProcesses(2, [&](int rank, int size) -> std::string {
    GlooGroupOptions opt;
    opt.store = store;
    opt.timeout = absl::Seconds(30);
    auto pg = CreateGlooProcessGroup(rank, size, opt);
    if (!pg.ok()) return pg.status().ToString();
    Tensor t = Tensor::FromData<float>({rank + 1.0f}, {1});
    absl::Status s = (*pg)->AllReduceSync(t);
    if (!s.ok()) return s.ToString();
    if (t.ToVector<float>()[0] != 3.0f) return "wrong sum over redis";
    auto sub = (*pg)->Split(0);
    if (!sub.ok()) return sub.status().ToString();
    return (*sub)->BarrierSync().ToString() == "OK" ? "" : "split barrier failed";
  });
  // Once every rank is done: the run's keys go, only theirs. Keys of a
  // prefix the run's begins ("gloox/"), and of one with a glob character
  // ("gloo*/", which unescaped would match the run's), are others'.
  redisContext* c = redisConnect("127.0.0.1", (*redis)->port());
  EXPECT_TRUE(c != nullptr && c->err == 0);
  for (const char* key : {"gloox/keep", "gloo*/x"}) {
    if (c != nullptr && c->err == 0) freeReplyObject(redisCommand(c, "SET %s 1", key));
  }
  if (c != nullptr) redisFree(c);
  absl::StatusOr<int64_t> removed = RemoveRedisKeys(store, "gloo*");
  EXPECT_EQ(removed.value_or(-1), 1) << removed.status();
  removed = RemoveRedisKeys(store, "gloo");
  EXPECT_GT(removed.value_or(-1), 2) << removed.status();  // each rank's address, claims, ...
  EXPECT_EQ(RemoveRedisKeys(store, "gloo").value_or(-1), 0);
  EXPECT_EQ(RemoveRedisKeys(store, "gloox").value_or(-1), 1);
  (*redis)->Stop();
  ExpectAllOk(o);
  // A server that is gone, and a store that is not Redis, are named.
  removed = RemoveRedisKeys(store, "gloo");
  EXPECT_EQ(removed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(removed.status().message(),
                                absl::StrCat("removing the keys under gloo/ from ", store)))
      << removed.status();
  EXPECT_EQ(RemoveRedisKeys("/tmp/store", "gloo").status().message(),
            "[gloo] store \"/tmp/store\" is not redis://host:port");
}

// Through Redis too (its SETNX refuses a second set as the FileStore does):
// ranks 1 and 2 of 3 fail together before joining, each saying so; rank 0,
// waiting for them with a 120 s timeout, fails at once naming one of them
// (the lowest whose reason is there when it looks: racing, either).
TEST(GlooGroup, RanksThatFailedBeforeJoiningEndTheRendezvousThroughRedis) {
  START_REDIS_OR_SKIP(redis);
  const std::string store = (*redis)->store();
  Outcome o = RunProcesses(3, [&](int rank, int size) -> std::string {
    GlooGroupOptions options;
    options.store = store;
    options.prefix = "job9/restart0";
    options.timeout = absl::Seconds(120);
    if (rank > 0) {
      absl::SleepFor(absl::Milliseconds(300));
      absl::StatusOr<bool> said = AnnounceGlooFailure(rank, size, options, "--data: missing");
      if (!said.ok()) return said.status().ToString();
      return *said ? "" : "the failure was not said";
    }
    auto pg = CreateGlooProcessGroup(rank, size, options);
    if (pg.ok()) return "joined a group whose peers failed";
    if (!absl::IsAborted(pg.status()) ||
        !(absl::StrContains(pg.status().message(), "[rendezvous] rank 0 of 3: rank 1 (host ") ||
          absl::StrContains(pg.status().message(), "[rendezvous] rank 0 of 3: rank 2 (host ")) ||
        !absl::StrContains(pg.status().message(), ") failed before joining: --data: missing")) {
      return pg.status().ToString();
    }
    return "";
  }, absl::Seconds(150));
  ExpectAllOk(o);
  EXPECT_LT(o.elapsed, absl::Seconds(60));
  // The announcements are the run's keys: removed with them.
  absl::StatusOr<int64_t> removed = RemoveRedisKeys(store, "job9");
  EXPECT_GE(removed.value_or(-1), 3) << removed.status();  // two reasons and the mark
}

}  // namespace
}  // namespace dist
