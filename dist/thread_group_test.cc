// Tests of the threads engine's collectives: every op for 1..4 ranks and
// every dtype against a reference computed here, in-place layouts, staging of
// non-contiguous tensors (and the per-rank ledgers that see it), asynchrony,
// and subgroups.
#include "dist/thread_group.h"

#include <atomic>
#include <cmath>
#include <future>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Dtype;
using tensor::Tensor;
using ::testing::HasSubstr;

// Input element i of rank r. Integers for integer dtypes; for floating dtypes
// values that bf16 holds exactly (so rounding happens only in the reduction).
double Value(int r, int64_t i, Dtype dtype) {
  if (dtype == Dtype::kU8) return static_cast<double>((r * 37 + i * 11) % 23);
  if (!tensor::IsFloatingPoint(dtype)) {
    return static_cast<double>((r * 37 + i * 11) % 23 - 11);
  }
  return ((r * 37 + i * 11) % 29 - 14) * 0.0625 + (r + 1) * 0.375;
}

// The elements of t as doubles (exact for every dtype used here).
std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<double> out;
  if (tensor::IsFloatingPoint(t.dtype())) {
    for (float v : t.ToVector<float>()) out.push_back(v);
  } else {
    for (int64_t v : t.ToVector<int64_t>()) out.push_back(static_cast<double>(v));
  }
  return out;
}

// The value of v after rounding to dtype.
double Round(double v, Dtype dtype) {
  return ToDoubles(Tensor::FromVector({static_cast<float>(v)}, {1}, dtype))[0];
}

Tensor MakeInput(int r, int64_t numel, Dtype dtype, int64_t offset = 0) {
  std::vector<float> values(numel);
  for (int64_t i = 0; i < numel; ++i) values[i] = static_cast<float>(Value(r, offset + i, dtype));
  return Tensor::FromVector(values, {numel}, dtype);
}

// op over ranks of Value(r, i), computed in double.
double Reference(ReduceOp op, int n, int64_t i, Dtype dtype) {
  double acc = Value(0, i, dtype);
  for (int r = 1; r < n; ++r) {
    const double v = Value(r, i, dtype);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
    }
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

// Relative tolerance of one rounding to dtype (0 for integers).
double Tolerance(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return 1e-6;
    case Dtype::kF16:
      return 1e-3;
    case Dtype::kBF16:
      return 8e-3;
    default:
      return 0.0;
  }
}

void ExpectNear(double got, double want, Dtype dtype, const std::string& where) {
  const double tol = Tolerance(dtype) * std::max(1.0, std::abs(want));
  EXPECT_NEAR(got, want, tol) << where;
}

class CollectiveTest : public ::testing::TestWithParam<std::tuple<int, Dtype>> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  Dtype dtype() const { return std::get<1>(GetParam()); }
  std::vector<ReduceOp> Ops() const {
    if (tensor::IsFloatingPoint(dtype())) {
      return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
    }
    return {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  }
};

TEST_P(CollectiveTest, AllReduce) {
  for (ReduceOp op : Ops()) {
    // Sizes not divisible by the group size, and smaller than it.
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7 * 4 + 3}, int64_t{3001}}) {
      std::vector<std::vector<double>> results(n());
      absl::Status status = RunRanks(n(), [&](int rank, ProcessGroup& pg) -> absl::Status {
        EXPECT_EQ(pg.rank(), rank);
        EXPECT_EQ(pg.size(), n());
        EXPECT_EQ(pg.backend(), "threads");
        Tensor x = MakeInput(rank, numel, dtype());
        if (absl::Status s = pg.AllReduceSync(x, op); !s.ok()) return s;
        results[rank] = ToDoubles(x);
        return absl::OkStatus();
      });
      ASSERT_TRUE(status.ok()) << status;
      const std::string where = absl::StrCat(ReduceOpName(op), " numel ", numel);
      for (int64_t i = 0; i < numel; ++i) {
        ExpectNear(results[0][i], Reference(op, n(), i, dtype()), dtype(),
                   absl::StrCat(where, " element ", i));
      }
      for (int r = 1; r < n(); ++r) {
        EXPECT_EQ(results[r], results[0]) << where << ": rank " << r << " differs from rank 0";
      }
    }
  }
}

TEST_P(CollectiveTest, ReduceScatter) {
  for (ReduceOp op : Ops()) {
    for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1027}}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<double>> results(n());
        absl::Status status = RunRanks(n(), [&](int rank, ProcessGroup& pg) -> absl::Status {
          Tensor input = MakeInput(rank, n() * k, dtype());
          Tensor output = in_place ? input.Narrow(0, rank * k, k) : Tensor::Empty({k}, dtype());
          if (absl::Status s = pg.ReduceScatterSync(input, output, op); !s.ok()) return s;
          results[rank] = ToDoubles(output);
          return absl::OkStatus();
        });
        ASSERT_TRUE(status.ok()) << status;
        for (int r = 0; r < n(); ++r) {
          ASSERT_EQ(results[r].size(), k);
          for (int64_t i = 0; i < k; ++i) {
            ExpectNear(results[r][i], Reference(op, n(), r * k + i, dtype()), dtype(),
                       absl::StrCat(ReduceOpName(op), " k ", k, " in_place ", in_place, " rank ", r,
                                    " element ", i));
          }
        }
      }
    }
  }
}

TEST_P(CollectiveTest, AllGather) {
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1027}}) {
    for (bool in_place : {false, true}) {
      std::vector<std::vector<double>> results(n());
      absl::Status status = RunRanks(n(), [&](int rank, ProcessGroup& pg) -> absl::Status {
        Tensor output = Tensor::Zeros({n() * k}, dtype());
        Tensor input = MakeInput(rank, k, dtype(), rank * k);
        if (in_place) {
          Tensor chunk = output.Narrow(0, rank * k, k);
          chunk.CopyFrom(input);
          input = chunk;
        }
        if (absl::Status s = pg.AllGatherSync(input, output); !s.ok()) return s;
        results[rank] = ToDoubles(output);
        return absl::OkStatus();
      });
      ASSERT_TRUE(status.ok()) << status;
      for (int r = 0; r < n(); ++r) {
        ASSERT_EQ(results[r].size(), n() * k);
        for (int j = 0; j < n(); ++j) {
          for (int64_t i = 0; i < k; ++i) {
            // Copies are exact: compare with the value rounded to the dtype.
            EXPECT_EQ(results[r][j * k + i], Round(Value(j, j * k + i, dtype()), dtype()))
                << "k " << k << " in_place " << in_place << " rank " << r << " chunk " << j;
          }
        }
      }
    }
  }
}

TEST_P(CollectiveTest, Broadcast) {
  for (int root = 0; root < n(); ++root) {
    const int64_t numel = 37;
    std::vector<std::vector<double>> results(n());
    absl::Status status = RunRanks(n(), [&](int rank, ProcessGroup& pg) -> absl::Status {
      Tensor x = MakeInput(rank, numel, dtype());
      if (absl::Status s = pg.BroadcastSync(x, root); !s.ok()) return s;
      results[rank] = ToDoubles(x);
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    for (int r = 0; r < n(); ++r) {
      for (int64_t i = 0; i < numel; ++i) {
        EXPECT_EQ(results[r][i], Round(Value(root, i, dtype()), dtype()))
            << "root " << root << " rank " << r << " element " << i;
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<int, Dtype>>& info) {
  return absl::StrCat("n", std::get<0>(info.param), "_",
                      tensor::DtypeName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllSizesAndDtypes, CollectiveTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Dtype::kF32, Dtype::kF16,
                                                              Dtype::kBF16, Dtype::kI32,
                                                              Dtype::kI64, Dtype::kU8)),
                         CaseName);

TEST(ThreadGroupTest, Bf16SumRoundsOnceFromF32) {
  // 1 + 3*2^-10 + 3*2^-10 is 1.0078125 (= 1 + 2^-7) rounded from f32 once; adding
  // in bf16 step by step would round each partial sum back to 1.
  std::vector<float> results(3);
  absl::Status status = RunRanks(3, [&](int rank, ProcessGroup& pg) -> absl::Status {
    const float v = rank == 0 ? 1.0f : 3.0f / 1024.0f;
    Tensor x = Tensor::FromVector({v}, {1}, Dtype::kBF16);
    if (absl::Status s = pg.AllReduceSync(x); !s.ok()) return s;
    results[rank] = x.ToVector<float>()[0];
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (float r : results) EXPECT_EQ(r, 1.0078125f);
}

TEST(ThreadGroupTest, Barrier) {
  for (int n : {1, 2, 3, 4}) {
    std::atomic<int> before{0};
    absl::Status status = RunRanks(n, [&](int rank, ProcessGroup& pg) -> absl::Status {
      for (int round = 1; round <= 3; ++round) {
        before.fetch_add(1);
        if (absl::Status s = pg.BarrierSync(); !s.ok()) return s;
        // Nobody passes the barrier before everyone has reached it.
        EXPECT_GE(before.load(), round * n);
        if (absl::Status s = pg.BarrierSync(); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(ThreadGroupTest, AsyncWorkOverlapsComputeAndRunsInOrder) {
  // Rank 0 issues its all-reduces and computes while they cannot complete
  // (rank 1 joins only after rank 0 has finished computing).
  absl::Notification rank0_computed;
  std::vector<std::vector<float>> results(2);
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) -> absl::Status {
    std::vector<Tensor> xs;
    for (int j = 0; j < 3; ++j) xs.push_back(Tensor::Full({1000}, rank + 10.0 * j));
    if (rank == 1) rank0_computed.WaitForNotification();
    std::vector<WorkPtr> works;
    for (const Tensor& x : xs) works.push_back(pg.AllReduce(x));
    if (rank == 0) {
      for (const WorkPtr& w : works) EXPECT_FALSE(w->IsCompleted());
      double acc = 0;  // Compute while the collectives are in flight.
      for (int i = 0; i < 100000; ++i) acc += std::sqrt(static_cast<double>(i));
      EXPECT_GT(acc, 0);
      for (const WorkPtr& w : works) EXPECT_FALSE(w->IsCompleted());
      rank0_computed.Notify();
    }
    for (const WorkPtr& w : works) {
      if (absl::Status s = w->Wait(); !s.ok()) return s;
      EXPECT_TRUE(w->IsCompleted());
      EXPECT_TRUE(w->Wait().ok());  // Waiting again returns the same result.
    }
    for (const Tensor& x : xs) results[rank].push_back(x.ToVector<float>()[999]);
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], (std::vector<float>{1.0f, 21.0f, 41.0f}));
  }
}

TEST(ThreadGroupTest, NonContiguousTensorsAreStagedOnTheRanksLedger) {
  // Rank 1's tensor is a transposed view: its worker stages it in a
  // contiguous buffer charged to rank 1's ledger as communication memory.
  ThreadWorld world(2);
  const int64_t staging_bytes = 6 * sizeof(float);
  std::vector<std::vector<float>> results(2);
  const auto process_before = tensor::MemoryLedger::Process().Stats(
      tensor::Device::Cpu(), tensor::MemoryCategory::kCommunication);
  absl::Status status = RunRanks(world, [&](int rank, ProcessGroup& pg) -> absl::Status {
    Tensor x = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3});
    if (rank == 1) x = Tensor::FromVector({1, 4, 2, 5, 3, 6}, {3, 2}).Transpose(0, 1);
    EXPECT_EQ(x.is_contiguous(), rank == 0);
    if (absl::Status s = pg.AllReduceSync(x); !s.ok()) return s;
    results[rank] = x.Contiguous().ToVector<float>();
    // Reduce-scatter and all-gather into a non-contiguous output too.
    Tensor gathered = Tensor::Zeros({2, 2}).Transpose(0, 1);
    Tensor mine = Tensor::FromVector({rank * 10.0f, rank * 10.0f + 1}, {2});
    if (absl::Status s = pg.AllGatherSync(mine, gathered); !s.ok()) return s;
    EXPECT_EQ(gathered.Contiguous().ToVector<float>(), (std::vector<float>{0, 1, 10, 11}));
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], (std::vector<float>{2, 4, 6, 8, 10, 12}));
  }
  const auto comm = [&](int rank) {
    return world.ledger(rank).Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kCommunication);
  };
  // Rank 0 staged only the non-contiguous all-gather output (4 floats); rank 1
  // also its all-reduce tensor (6 floats). Everything is freed again.
  EXPECT_EQ(comm(0).peak, 4 * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(comm(1).peak, staging_bytes);
  EXPECT_EQ(comm(0).current, 0);
  EXPECT_EQ(comm(1).current, 0);
  const auto process_after = tensor::MemoryLedger::Process().Stats(
      tensor::Device::Cpu(), tensor::MemoryCategory::kCommunication);
  EXPECT_EQ(process_after.peak, process_before.peak);
}

TEST(ThreadGroupTest, RankThreadsChargeTheirOwnLedger) {
  ThreadWorld world(3);
  absl::Status status = RunRanks(world, [&](int rank, ProcessGroup&) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    Tensor t = Tensor::Empty({(rank + 1) * 256});
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(
        world.ledger(r).Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters).peak,
        (r + 1) * 256 * 4);
  }
}

TEST(ThreadGroupTest, SplitByColorReducesWithinEachGroup) {
  std::vector<float> block_sums(4), stride_sums(4);
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) -> absl::Status {
    // Node-like blocks {0,1}, {2,3} and strided groups {0,2}, {1,3}.
    absl::StatusOr<std::unique_ptr<ProcessGroup>> block = pg.Split(rank / 2);
    if (!block.ok()) return block.status();
    absl::StatusOr<std::unique_ptr<ProcessGroup>> stride = pg.Split(rank % 2);
    if (!stride.ok()) return stride.status();
    EXPECT_EQ((*block)->size(), 2);
    EXPECT_EQ((*block)->rank(), rank % 2);
    EXPECT_EQ((*stride)->size(), 2);
    EXPECT_EQ((*stride)->rank(), rank / 2);
    Tensor a = Tensor::Full({5}, rank + 1.0);
    Tensor b = Tensor::Full({5}, rank + 1.0);
    // Interleave with world collectives; issue both subgroup calls first.
    WorkPtr wa = (*block)->AllReduce(a);
    WorkPtr wb = (*stride)->AllReduce(b);
    if (absl::Status s = pg.BarrierSync(); !s.ok()) return s;
    if (absl::Status s = wa->Wait(); !s.ok()) return s;
    if (absl::Status s = wb->Wait(); !s.ok()) return s;
    block_sums[rank] = a.ToVector<float>()[4];
    stride_sums[rank] = b.ToVector<float>()[4];
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(block_sums, (std::vector<float>{3, 3, 7, 7}));
  EXPECT_EQ(stride_sums, (std::vector<float>{4, 6, 4, 6}));
}

TEST(ThreadGroupTest, HybridShardReduceScatterThenAllReduce) {
  // HYBRID_SHARD on 2 "nodes" of 2: reduce-scatter gradients within a node,
  // then all-reduce the shards across nodes: every rank ends with its shard
  // of the global sum.
  const int64_t k = 3;
  std::vector<std::vector<float>> shards(4);
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) -> absl::Status {
    auto shard_group = pg.Split(rank / 2);
    if (!shard_group.ok()) return shard_group.status();
    auto replicate_group = pg.Split(rank % 2);
    if (!replicate_group.ok()) return replicate_group.status();
    std::vector<float> grad(2 * k);
    for (int64_t i = 0; i < 2 * k; ++i) grad[i] = static_cast<float>((rank + 1) * (i + 1));
    Tensor g = Tensor::FromVector(grad, {2 * k});
    Tensor shard = Tensor::Empty({k});
    if (absl::Status s = (*shard_group)->ReduceScatterSync(g, shard); !s.ok()) return s;
    if (absl::Status s = (*replicate_group)->AllReduceSync(shard); !s.ok()) return s;
    shards[rank] = shard.ToVector<float>();
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int rank = 0; rank < 4; ++rank) {
    const int local = rank % 2;  // the shard index within the node
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(shards[rank][i], (1 + 2 + 3 + 4) * (local * k + i + 1)) << rank << " " << i;
    }
  }
}

TEST(ThreadGroupTest, SplitKeysOrderAndNegativeColor) {
  std::vector<int> new_ranks(4, -2);
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) -> absl::Status {
    // Rank 0 stays out; the others form a group in reverse order.
    auto sub = pg.Split(rank == 0 ? -1 : 7, -rank);
    if (!sub.ok()) return sub.status();
    if (rank == 0) {
      EXPECT_EQ(*sub, nullptr);
      return absl::OkStatus();
    }
    new_ranks[rank] = (*sub)->rank();
    EXPECT_EQ((*sub)->size(), 3);
    Tensor x = Tensor::Full({1}, (*sub)->rank() == 0 ? 42.0 : 0.0);
    if (absl::Status s = (*sub)->BroadcastSync(x, 0); !s.ok()) return s;
    EXPECT_EQ(x.ToVector<float>()[0], 42.0f);
    // A split of a split.
    auto pair = (*sub)->Split((*sub)->rank() < 2 ? 0 : -1);
    if (!pair.ok()) return pair.status();
    if (*pair != nullptr) {
      EXPECT_EQ((*pair)->size(), 2);
      if (absl::Status s = (*pair)->BarrierSync(); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(new_ranks, (std::vector<int>{-2, 2, 1, 0}));
}

TEST(ThreadGroupTest, NewSubgroup) {
  std::vector<int> sub_ranks(4, -1);
  absl::Status status = RunRanks(4, [&](int rank, ProcessGroup& pg) -> absl::Status {
    const int members[] = {3, 1};
    auto sub = pg.NewSubgroup(members);
    if (!sub.ok()) return sub.status();
    if (rank == 0 || rank == 2) {
      EXPECT_EQ(*sub, nullptr);
      return absl::OkStatus();
    }
    sub_ranks[rank] = (*sub)->rank();
    Tensor x = Tensor::Full({2}, rank);
    if (absl::Status s = (*sub)->AllReduceSync(x, ReduceOp::kMax); !s.ok()) return s;
    EXPECT_EQ(x.ToVector<float>(), (std::vector<float>{3, 3}));
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(sub_ranks, (std::vector<int>{-1, 1, -1, 0}));
}

TEST(ThreadGroupTest, NewSubgroupWithDifferentListsFails) {
  std::vector<absl::Status> statuses(2);
  absl::Status status = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    std::vector<int> members = rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0};
    statuses[rank] = pg.NewSubgroup(members).status();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(absl::IsInvalidArgument(statuses[0])) << statuses[0];
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("rank 1 passed a different list of ranks than this rank's [0, 1]"));
  EXPECT_THAT(std::string(statuses[1].message()),
              HasSubstr("rank 0 passed a different list of ranks than this rank's [1, 0]"));
}

TEST(ThreadGroupTest, WorldWithoutRunRanks) {
  // Driving the ranks with threads of one's own.
  ThreadWorld world(2, ThreadWorldOptions{absl::Seconds(10)});
  EXPECT_EQ(world.group(0).timeout(), absl::Seconds(10));
  Tensor a = Tensor::Full({4}, 1.0);
  Tensor b = Tensor::Full({4}, 2.0);
  WorkPtr wa = world.group(0).AllReduce(a);
  auto fb = std::async(std::launch::async, [&] { return world.group(1).AllReduceSync(b); });
  EXPECT_TRUE(wa->Wait().ok());
  EXPECT_TRUE(fb.get().ok());
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{3, 3, 3, 3}));
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{3, 3, 3, 3}));
}

}  // namespace
}  // namespace dist
