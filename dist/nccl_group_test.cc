// Tests of the nccl engine on GPUs: every collective (in-place forms too) and
// dtype against the threads engine on the CPU, at world size 1 and, with two
// or more GPUs, 2 ranks as threads (one per device); init timeouts naming the
// missing rank; argument errors; splits; ordering after a caller's stream;
// with two GPUs, a call one rank never makes times out naming that rank
// (with the other failures: nccl_group_failure_test.cc). Skips (GTEST_SKIP)
// where no GPU is visible.
#include "dist/nccl_group.h"

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
#include "dist/nccl_rendezvous.h"
#include "dist/nccl_group_testing.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "dist/thread_group.h"
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
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::Options;

constexpr Dtype kDtypes[] = {Dtype::kF32, Dtype::kF16, Dtype::kBF16,
                             Dtype::kI32, Dtype::kI64, Dtype::kU8};

struct Case {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  Dtype dtype = Dtype::kF32;
  bool in_place = false;  // reduce_scatter / all_gather: NCCL's in-place form

  std::string Name() const {
    return absl::StrCat(CollectiveName(kind), "/", ReduceOpName(op), "/", tensor::DtypeName(dtype),
                        in_place ? "/in_place" : "");
  }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (Dtype dtype : kDtypes) {
    const bool floating = tensor::IsFloatingPoint(dtype);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (op == ReduceOp::kAvg && !floating) continue;
      cases.push_back({CollectiveKind::kAllReduce, op, dtype, false});
      cases.push_back({CollectiveKind::kReduceScatter, op, dtype, false});
    }
    cases.push_back({CollectiveKind::kReduceScatter, ReduceOp::kSum, dtype, true});
    cases.push_back({CollectiveKind::kAllGather, ReduceOp::kSum, dtype, false});
    cases.push_back({CollectiveKind::kAllGather, ReduceOp::kSum, dtype, true});
    cases.push_back({CollectiveKind::kBroadcast, ReduceOp::kSum, dtype, false});
  }
  return cases;
}

// Small integers, different per rank and element, so that sums, averages of
// two, maxima and minima are exact in every dtype (and u8 stays >= 0).
Tensor Input(Dtype dtype, int64_t n, int rank, int salt) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) {
    const int v = static_cast<int>((i * 7 + rank * 3 + salt) % 11);
    values[i] = static_cast<float>(dtype == Dtype::kU8 ? v : v - 5);
  }
  return Tensor::FromVector(values, {n}, dtype);
}

// Runs `c` on `pg` with tensors on `device`; returns the result on the CPU.
absl::StatusOr<Tensor> RunCase(ProcessGroup& pg, const Case& c, int salt, Device device) {
  const int rank = pg.rank();
  const int size = pg.size();
  switch (c.kind) {
    case CollectiveKind::kAllReduce: {
      Tensor t = Input(c.dtype, 7, rank, salt).To(device);
      if (absl::Status s = pg.AllReduceSync(t, c.op); !s.ok()) return s;
      return t.To(Device::Cpu());
    }
    case CollectiveKind::kReduceScatter: {
      constexpr int64_t k = 3;
      Tensor in = Input(c.dtype, k * size, rank, salt).To(device);
      Tensor out = c.in_place ? in.Narrow(0, rank * k, k) : Tensor::Empty({k}, c.dtype, device);
      if (absl::Status s = pg.ReduceScatterSync(in, out, c.op); !s.ok()) return s;
      return out.To(Device::Cpu());
    }
    case CollectiveKind::kAllGather: {
      constexpr int64_t k = 5;
      Tensor out = Tensor::Zeros({k * size}, c.dtype, device);
      Tensor in = Input(c.dtype, k, rank, salt).To(device);
      if (c.in_place) {
        Tensor chunk = out.Narrow(0, rank * k, k);
        chunk.CopyFrom(Input(c.dtype, k, rank, salt));
        in = chunk;
      }
      if (absl::Status s = pg.AllGatherSync(in, out); !s.ok()) return s;
      return out.To(Device::Cpu());
    }
    case CollectiveKind::kBroadcast: {
      Tensor t = Input(c.dtype, 9, rank, salt).To(device);
      if (absl::Status s = pg.BroadcastSync(t, size - 1); !s.ok()) return s;
      return t.To(Device::Cpu());
    }
    case CollectiveKind::kBarrier: {
      if (absl::Status s = pg.BarrierSync(); !s.ok()) return s;
      return Tensor::Zeros({1});
    }
  }
  return absl::InternalError("unknown kind");
}

// results[rank][case] from the threads engine on the CPU.
std::vector<std::vector<Tensor>> CpuReference(int size, const std::vector<Case>& cases) {
  std::vector<std::vector<Tensor>> results(size, std::vector<Tensor>(cases.size()));
  absl::Status status = RunRanks(size, [&](int rank, ProcessGroup& pg) -> absl::Status {
    for (size_t i = 0; i < cases.size(); ++i) {
      absl::StatusOr<Tensor> r = RunCase(pg, cases[i], static_cast<int>(i), Device::Cpu());
      if (!r.ok()) return r.status();
      results[rank][i] = *r;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return results;
}

void ExpectSame(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  if (tensor::IsFloatingPoint(want.dtype())) {
    EXPECT_EQ(got.ToVector<float>(), want.ToVector<float>()) << what;
  } else {
    EXPECT_EQ(got.ToVector<int64_t>(), want.ToVector<int64_t>()) << what;
  }
}

TEST(NcclGroupTest, WorldOfOneMatchesTheCpuReference) {
  ASSERT_TRUE(tensor::cuda::Built());
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("w1"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  EXPECT_EQ((*pg)->backend(), "nccl");
  EXPECT_EQ((*pg)->rank(), 0);
  EXPECT_EQ((*pg)->size(), 1);
  const std::vector<Case> cases = AllCases();
  const auto want = CpuReference(1, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<Tensor> got = RunCase(**pg, cases[i], static_cast<int>(i), Device::Cuda(0));
    ASSERT_TRUE(got.ok()) << cases[i].Name() << ": " << got.status();
    ExpectSame(*got, want[0][i], cases[i].Name());
  }
  EXPECT_TRUE((*pg)->BarrierSync().ok());
  // Asynchronous calls complete in order.
  Tensor a = Tensor::Full({1000}, 2.0, Dtype::kF32, Device::Cuda(0));
  Tensor b = Tensor::Full({10}, 3.0, Dtype::kI64, Device::Cuda(0));
  WorkPtr wa = (*pg)->AllReduce(a, ReduceOp::kMax);
  WorkPtr wb = (*pg)->Broadcast(b, 0);
  EXPECT_TRUE(wb->Wait().ok());
  EXPECT_TRUE(wa->IsCompleted());
  EXPECT_TRUE(wa->Wait().ok());
  EXPECT_EQ(b.ToVector<int64_t>(), std::vector<int64_t>(10, 3));
}

TEST(NcclGroupTest, TwoRanksAsThreadsMatchTheCpuReference) {
  SKIP_WITHOUT_GPUS(2);
  constexpr int kSize = 2;
  HashStore store;
  const std::vector<Case> cases = AllCases();
  const auto want = CpuReference(kSize, cases);
  std::vector<std::vector<Tensor>> got(kSize, std::vector<Tensor>(cases.size()));
  std::vector<absl::Status> statuses(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      auto pg = CreateNcclProcessGroup(rank, kSize, rank, store, Options("w2"));
      if (!pg.ok()) {
        statuses[rank] = pg.status();
        return;
      }
      // The rank's device stays current (restoring cuda:0 would give GPU 0 a
      // context of every rank's).
      int current = -1;
      if (cudaGetDevice(&current) != cudaSuccess || current != rank) {
        statuses[rank] = absl::InternalError(
            absl::StrCat("the current device after init is ", current, ", not ", rank));
        return;
      }
      for (size_t i = 0; i < cases.size(); ++i) {
        absl::StatusOr<Tensor> r = RunCase(**pg, cases[i], static_cast<int>(i), Device::Cuda(rank));
        if (!r.ok()) {
          statuses[rank] = r.status();
          return;
        }
        got[rank][i] = *r;
      }
      // Split: reversed order (key 1 - rank), then one group per rank.
      auto both = (*pg)->Split(0, 1 - rank);
      if (!both.ok()) {
        statuses[rank] = both.status();
        return;
      }
      if ((*both)->rank() != 1 - rank || (*both)->size() != 2) {
        statuses[rank] = absl::InternalError(absl::StrCat("split: rank ", (*both)->rank()));
        return;
      }
      Tensor mine = Tensor::Full({1}, static_cast<double>(rank), Dtype::kI32, Device::Cuda(rank));
      Tensor all = Tensor::Empty({2}, Dtype::kI32, Device::Cuda(rank));
      statuses[rank] = (*both)->AllGatherSync(mine, all);
      if (statuses[rank].ok() && all.ToVector<int>() != std::vector<int>{1, 0}) {
        statuses[rank] = absl::InternalError("split: all_gather is not in the new rank order");
      }
      auto alone = (*pg)->Split(rank);
      if (statuses[rank].ok() && !alone.ok()) statuses[rank] = alone.status();
      if (statuses[rank].ok()) statuses[rank] = (*alone)->BarrierSync();
      // NewSubgroup compares the lists with a CPU all-gather (staged).
      auto listed = (*pg)->NewSubgroup({1});
      if (statuses[rank].ok() && !listed.ok()) statuses[rank] = listed.status();
      if (statuses[rank].ok() && (*listed == nullptr) != (rank == 0)) {
        statuses[rank] = absl::InternalError("new_subgroup: wrong membership");
      }
      if (statuses[rank].ok() && rank == 1) statuses[rank] = (*listed)->BarrierSync();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    for (size_t i = 0; i < cases.size(); ++i) {
      ExpectSame(got[rank][i], want[rank][i], absl::StrCat("rank ", rank, " ", cases[i].Name()));
    }
  }
}

// Two groups share both devices: a group and its split, or two groups made
// by separate calls, the second with launch_order_with the first. Each rank
// issues calls on the two alternately without waiting; the groups' worker
// threads must still launch them in issue order, the same on both ranks
// (NCCL kernels of communicators sharing GPUs launched in different orders
// can deadlock; the emulated NCCL fails them). Each result is checked too.
// Meaningful on the emulation, which checks the order; a GPU that runs the
// two kernels side by side passes it in any order.
absl::Status AlternateCallsOnTwoGroups(bool split,
                                       absl::Duration timeout = absl::ZeroDuration()) {
  constexpr int kSize = 2;
  constexpr int kCalls = 200;
  HashStore store;
  std::vector<absl::Status> statuses(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      statuses[rank] = [&]() -> absl::Status {
        NcclGroupOptions first = Options("order");
        if (timeout != absl::ZeroDuration()) first.timeout = timeout;
        auto pg = CreateNcclProcessGroup(rank, kSize, rank, store, first);
        if (!pg.ok()) return pg.status();
        absl::StatusOr<std::unique_ptr<ProcessGroup>> other;
        if (split) {
          other = (*pg)->Split(0);
        } else {
          NcclGroupOptions second = Options("order_second");
          second.launch_order_with = pg->get();
          other = CreateNcclProcessGroup(rank, kSize, rank, store, second);
        }
        if (!other.ok()) return other.status();
        std::vector<Tensor> values;
        std::vector<WorkPtr> works;
        for (int i = 0; i < kCalls; ++i) {
          ProcessGroup& group = i % 2 == 0 ? **pg : **other;
          // (1 + i % 3): the calls' sizes differ, so a call paired with
          // another of its communicator would fail as well.
          values.push_back(
              Tensor::Full({1 + i % 3}, static_cast<double>(rank + i), Dtype::kF32,
                           Device::Cuda(rank)));
          works.push_back(group.AllReduce(values.back(), ReduceOp::kSum));
        }
        for (int i = 0; i < kCalls; ++i) {
          if (absl::Status s = works[i]->Wait(); !s.ok()) return s;
          const std::vector<float> got = values[i].ToVector<float>();
          if (got != std::vector<float>(1 + i % 3, static_cast<float>(1 + 2 * i))) {
            return absl::InternalError(absl::StrCat("call ", i, ": wrong sum ", got[0]));
          }
        }
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kSize; ++rank) {
    if (!statuses[rank].ok()) {
      return absl::Status(statuses[rank].code(),
                          absl::StrCat("rank ", rank, ": ", statuses[rank].message()));
    }
  }
  return absl::OkStatus();
}

TEST(NcclGroupTest, CallsOnAGroupAndItsSplitReachNcclInIssueOrder) {
  SKIP_WITHOUT_GPUS(2);
  const absl::Status s = AlternateCallsOnTwoGroups(/*split=*/true);
  EXPECT_TRUE(s.ok()) << s;
}

// With an infinite timeout, a call waits for the family's NCCL call lock as
// long as another call holds it (a bound of forever must not overflow into
// none).
TEST(NcclGroupTest, CallsOnAGroupAndItsSplitWithAnInfiniteTimeout) {
  SKIP_WITHOUT_GPUS(2);
  const absl::Status s = AlternateCallsOnTwoGroups(/*split=*/true, absl::InfiniteDuration());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(NcclGroupTest, CallsOnGroupsSharingALaunchOrderReachNcclInIssueOrder) {
  SKIP_WITHOUT_GPUS(2);
  const absl::Status s = AlternateCallsOnTwoGroups(/*split=*/false);
  EXPECT_TRUE(s.ok()) << s;
}

// One rank's order: another rank's group (ranks as threads of one process)
// is refused, naming the two devices.
TEST(NcclGroupTest, LaunchOrderWithAnotherRanksGroupIsRefused) {
  SKIP_WITHOUT_GPUS(2);
  HashStore store;
  auto first = CreateNcclProcessGroup(0, 1, 0, store, Options("order_rank0"));
  ASSERT_TRUE(first.ok()) << first.status();
  NcclGroupOptions options = Options("order_rank1");
  options.launch_order_with = first->get();
  auto pg = CreateNcclProcessGroup(0, 1, 1, store, options);
  ASSERT_FALSE(pg.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(pg.status())) << pg.status();
  EXPECT_THAT(std::string(pg.status().message()),
              HasSubstr("launch_order_with: that group runs on cuda:0, this one on cuda:1"));
}

TEST(NcclGroupTest, LaunchOrderWithAnotherEngineIsRefused) {
  SKIP_WITHOUT_GPUS(1);
  ThreadWorld world(1);
  HashStore store;
  NcclGroupOptions options = Options("order_threads");
  options.launch_order_with = &world.group(0);
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, options);
  ASSERT_FALSE(pg.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(pg.status())) << pg.status();
  EXPECT_THAT(std::string(pg.status().message()),
              HasSubstr("launch_order_with: the group's engine is threads, not nccl"));
}

// A group under a prefix an earlier group used in the same store fails at
// once (it would read the earlier unique id and time out in init).
TEST(NcclGroupTest, AGroupUnderAPrefixUsedBeforeFailsAtOnce) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  {
    auto first = CreateNcclProcessGroup(0, 1, 0, store, Options("reused"));
    ASSERT_TRUE(first.ok()) << first.status();
  }
  const absl::Time start = absl::Now();
  auto again = CreateNcclProcessGroup(0, 1, 0, store, Options("reused"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("[rendezvous] rank 0 of 1: the store already holds rank 0's keys under "
                        "prefix \"reused\""));
  EXPECT_TRUE(CreateNcclProcessGroup(0, 1, 0, store, Options("reused_not")).ok());
}

TEST(NcclGroupTest, InitTimesOutNamingTheMissingRank) {
  SKIP_WITHOUT_GPUS(1);
  {
    // Rank 0 of 2 alone: rank 1 never arrives.
    HashStore store;
    const absl::Time start = absl::Now();
    auto pg = CreateNcclProcessGroup(0, 2, 0, store, Options("lonely0", absl::Seconds(2)));
    EXPECT_LT(absl::Now() - start, absl::Seconds(60));
    ASSERT_FALSE(pg.ok());
    EXPECT_TRUE(absl::IsDeadlineExceeded(pg.status())) << pg.status();
    EXPECT_THAT(std::string(pg.status().message()),
                StartsWith("[nccl_init] rank 0 of 2 timed out after 2.0 s waiting for rank 1 (it "
                           "never reached communicator init"));
  }
  {
    // Rank 1 of 2 alone: no unique id from rank 0.
    HashStore store;
    auto pg = CreateNcclProcessGroup(1, 2, 0, store, Options("lonely1", absl::Milliseconds(500)));
    ASSERT_FALSE(pg.ok());
    EXPECT_TRUE(absl::IsDeadlineExceeded(pg.status())) << pg.status();
    EXPECT_THAT(std::string(pg.status().message()),
                StartsWith("[nccl_init] rank 1 of 2 timed out after 0.5 s waiting for rank 0 (no "
                           "NCCL unique id at key lonely1/unique_id"));
  }
}

// Rank 1 failed before it joined (its data missing on its node) and said
// so: rank 0, in communicator init with a 60 s timeout, fails at once
// naming it.
TEST(NcclGroupTest, InitEndsAtOnceWhenARankFailedBeforeJoining) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  std::thread failed([&] {
    absl::SleepFor(absl::Milliseconds(300));
    const absl::StatusOr<bool> said =
        nccl::AnnounceFailure(store, "failed1", 1, 2, "--data=x.bin: no such file");
    EXPECT_TRUE(said.ok() && *said) << said.status();
  });
  const absl::Time start = absl::Now();
  auto pg = CreateNcclProcessGroup(0, 2, 0, store, Options("failed1", absl::Seconds(60)));
  failed.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_FALSE(pg.ok());
  EXPECT_TRUE(absl::IsAborted(pg.status())) << pg.status();
  EXPECT_THAT(std::string(pg.status().message()),
              StartsWith("[rendezvous] rank 0 of 2: rank 1 (host "));
  EXPECT_THAT(std::string(pg.status().message()),
              HasSubstr(") failed before joining: --data=x.bin: no such file"));
}

// Node A launched as 2 nodes x 1 rank (rank 0 of 2), node B as 2 nodes x 2
// ranks (ranks 2, 3 of 4): every rank fails at once naming the layouts,
// before any unique id or communicator init.
TEST(NcclGroupTest, NodesLaunchedDifferentlyFailBeforeInit) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  struct Launched {
    int rank, size, local_rank, local_world_size;
  };
  const std::vector<Launched> ranks = {{0, 2, 0, 1}, {2, 4, 0, 2}, {3, 4, 1, 2}};
  std::vector<absl::Status> got(ranks.size());
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      NcclGroupOptions options = Options("layout", absl::Seconds(20));
      options.local_rank = ranks[i].local_rank;
      options.local_world_size = ranks[i].local_world_size;
      got[i] = CreateNcclProcessGroup(ranks[i].rank, ranks[i].size, 0, store, options).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the ranks waited for the timeout";
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(absl::IsInvalidArgument(got[i])) << i << ": " << got[i];
    // Whichever rank walks first names the layouts; a rank whose walk waits on
    // a node that never comes names the node starting at its world size.
    EXPECT_THAT(std::string(got[i].message()), HasSubstr("launched differently"));
  }
  EXPECT_FALSE(store.Check({"layout/unique_id"}).value()) << "an id was set";
}

TEST(NcclGroupTest, BadArgumentsFailAtOnceAndLeaveTheGroupUsable) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  const int devices = tensor::cuda::DeviceCount();
  auto missing = CreateNcclProcessGroup(0, 1, devices, store, Options("bad0"));
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_EQ(missing.status().message(),
            absl::StrCat("[nccl_init] rank 0 of 1: device cuda:", devices, " does not exist (",
                         devices, " CUDA devices visible)"));
  EXPECT_TRUE(absl::IsInvalidArgument(CreateNcclProcessGroup(1, 1, 0, store).status()));

  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("bad"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::Status s =
      (*pg)->AllGatherSync(Tensor::Zeros({4}), Tensor::Zeros({4}, Dtype::kF32, Device::Cuda(0)));
  EXPECT_EQ(s, absl::InvalidArgumentError("[all_gather] rank 0 of 1: the input tensor is on cpu; "
                                          "the nccl group of rank 0 uses cuda:0"));
  Tensor strided = Tensor::Zeros({2, 3}, Dtype::kF32, Device::Cuda(0)).Transpose(0, 1);
  s = (*pg)->AllReduceSync(strided);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not contiguous"));
  s = (*pg)->AllReduceSync(Tensor::Zeros({3}, Dtype::kI32, Device::Cuda(0)), ReduceOp::kAvg);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // Still usable.
  Tensor x = Tensor::Full({5}, 1.5, Dtype::kF32, Device::Cuda(0));
  EXPECT_TRUE((*pg)->AllReduceSync(x, ReduceOp::kSum).ok());
  EXPECT_EQ(x.ToVector<float>(), std::vector<float>(5, 1.5f));
  // Not an nccl group.
  ThreadWorld world(1);
  EXPECT_TRUE(absl::IsInvalidArgument(SetNcclComputeStream(world.group(0), nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicationStream(world.group(0)).status()));
}

TEST(NcclGroupTest, CpuTensorsAreStagedThroughTheDevice) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("cpu"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  const std::vector<Case> cases = AllCases();
  const auto want = CpuReference(1, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<Tensor> got = RunCase(**pg, cases[i], static_cast<int>(i), Device::Cpu());
    ASSERT_TRUE(got.ok()) << cases[i].Name() << ": " << got.status();
    ExpectSame(*got, want[0][i], cases[i].Name());
  }
  // A strided CPU tensor is written back through its strides.
  Tensor base = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor strided = base.Transpose(0, 1);
  WorkPtr work = (*pg)->Broadcast(strided, 0);
  EXPECT_TRUE(work->IsCompleted());  // staged calls are synchronous
  EXPECT_TRUE(work->Wait().ok());
  EXPECT_EQ(base.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(NcclGroupTest, SplitsOfAGroupOfOne) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("split"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  auto none = (*pg)->Split(-1);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  auto sub = (*pg)->Split(3);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_NE(*sub, nullptr);
  EXPECT_EQ((*sub)->backend(), "nccl");
  EXPECT_EQ((*sub)->size(), 1);
  // Its errors name it as the other engines name subgroups (the parent's
  // second split: Split(-1) was the first).
  Tensor y = Tensor::Full({4}, 1.0, Dtype::kF32, Device::Cuda(0));
  const absl::Status bad_root = (*sub)->BroadcastSync(y, 1);
  EXPECT_THAT(std::string(bad_root.message()),
              ::testing::StartsWith("[broadcast] rank 0 of 1 in group world/split1/color3: root 1 "
                                    "is not a rank of a group of size 1"));
  Tensor x = Tensor::Full({4}, 2.0, Dtype::kBF16, Device::Cuda(0));
  EXPECT_TRUE((*sub)->AllReduceSync(x, ReduceOp::kAvg).ok());
  EXPECT_EQ(x.ToVector<float>(), std::vector<float>(4, 2.0f));
  auto listed = (*pg)->NewSubgroup({0});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_NE(*listed, nullptr);
  EXPECT_TRUE((*listed)->BarrierSync().ok());
  // The parent still works after its splits.
  EXPECT_TRUE((*pg)->BarrierSync().ok());
}

// Queues a copy of n page-locked values on `stream` into a zeroed input, then
// all-gathers it at world size 1 (a copy to another buffer) with `options`;
// the number of output values that are not the copied ones.
int64_t WrongAfterACopyOn(ProcessGroup& pg, cudaStream_t stream, int64_t n,
                          const CollectiveOptions& options) {
  float* host = nullptr;
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), n * sizeof(float)), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000 + 1);
  Tensor in = Tensor::Zeros({n}, Dtype::kF32, Device::Cuda(0));
  Tensor out = Tensor::Zeros({n}, Dtype::kF32, Device::Cuda(0));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the zeros are in place
  EXPECT_EQ(cudaMemcpyAsync(in.raw_data(), host, n * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  const absl::Status s = pg.AllGatherSync(in, out, options);
  EXPECT_TRUE(s.ok()) << s;
  const std::vector<float> result = out.ToVector<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += result[i] != host[i];
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the copy has read its source
  cudaFreeHost(host);
  return wrong;
}

TEST(NcclGroupTest, CollectivesWaitForTheComputeStream) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("stream"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<void*> comm_stream = NcclCommunicationStream(**pg);
  ASSERT_TRUE(comm_stream.ok());
  EXPECT_NE(*comm_stream, nullptr);

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_TRUE(SetNcclComputeStream(**pg, stream).ok());
  // A large copy queued on the compute stream fills the input (128 MiB of
  // f32); the all-gather must see all of it.
  EXPECT_EQ(WrongAfterACopyOn(**pg, stream, int64_t{32} << 20, {}), 0);
  ASSERT_TRUE(SetNcclComputeStream(**pg, nullptr).ok());
  cudaStreamDestroy(stream);
}

// NCCL allocates its buffers at init (NCCL_RUNTIME_CONNECT=0), unless the
// environment chose otherwise before the first group.
TEST(NcclGroupTest, NcclConnectsAtInitUnlessTheEnvironmentSays) {
  SKIP_WITHOUT_GPUS(1);
  const char* before = std::getenv("NCCL_RUNTIME_CONNECT");
  const std::string chosen = before == nullptr ? "" : before;
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("connect"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  const char* after = std::getenv("NCCL_RUNTIME_CONNECT");
  ASSERT_NE(after, nullptr);
  // Another test's group may have come first: "0" then, or the environment's.
  EXPECT_EQ(std::string(after), chosen.empty() ? "0" : chosen);
}

// A call given a ready stream (CollectiveOptions::ready_stream) waits for its
// work instead of the compute stream's: an upload queued there (deferred on
// the emulation until something waits for it) is what the all-gather copies.
TEST(NcclGroupTest, ACallWaitsForItsReadyStream) {
  SKIP_WITHOUT_GPUS(1);
  HashStore store;
  auto pg = CreateNcclProcessGroup(0, 1, 0, store, Options("ready"));
  ASSERT_TRUE(pg.ok()) << pg.status();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  CollectiveOptions options;
  options.ready_stream = stream;
  EXPECT_EQ(WrongAfterACopyOn(**pg, stream, int64_t{1} << 20, options), 0);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dist
